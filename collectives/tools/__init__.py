"""The tools wing: ``collectives bench``, ``collectives draw`` and the test reference.

Built on the public API; nothing in the library imports them.
"""
