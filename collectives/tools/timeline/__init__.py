"""``collectives timeline``: merge the ranks' timeline files, draw them, and summarise them.

``.traces`` reads, merges and checks trace files, ``.summary`` says where the time
went and who was waited for, ``.plot`` draws the picture, ``.command`` is the
subcommand. The recording itself is ``collectives.timeline``.
"""
