"""``collectives timeline``: merge the ranks' timeline files, draw them, and summarise them.

:mod:`.traces` reads, merges and checks trace files, :mod:`.summary` says where the time
went and who was waited for, :mod:`.plot` draws the picture, :mod:`.command` is the
subcommand. The recording itself is :mod:`collectives.timeline`.
"""
