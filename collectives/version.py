"""The library's version: the one definition, which pyproject.toml reads and every rank compares."""

__version__ = "0.1.0"
