"""Transports. ``local`` (embedded, the default) needs nothing beyond NumPy."""
