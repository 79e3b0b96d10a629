"""The library's loggers, and ``COLLECTIVES_DEBUG``.

Everything logs under the ``collectives`` logger tree (``collectives.calls``: what each new call
runs as; ``collectives.plans``: plans built; ``collectives.select``: ``auto``'s price table
for each new call it chooses for, several lines each; ``collectives.failures``: communicators
breaking).
The library attaches no handler of its own unless ``COLLECTIVES_DEBUG`` asks for output:

* ``COLLECTIVES_DEBUG=info``: the algorithm each new call signature runs, plans built (cache
  misses) and failures, on standard error;
* ``COLLECTIVES_DEBUG=detail``: also every call's arguments, and every call is agreed across
  ranks before any data moves, whatever ``check=`` says (slower; set it on every rank).
"""

from __future__ import annotations

import logging
import os
import sys

ENV = "COLLECTIVES_DEBUG"
LEVELS = {"": None, "0": None, "off": None, "info": logging.INFO, "detail": logging.DEBUG}

logger = logging.getLogger("collectives")


def debug_setting() -> str:
    """``COLLECTIVES_DEBUG`` as set ("", "info" or "detail"); unknown values raise."""
    value = os.environ.get(ENV, "").strip().lower()
    if value not in LEVELS:
        raise ValueError(f"{ENV}={value!r}: use 'info' or 'detail' (or leave it unset)")
    return value


def configure() -> None:
    """Follow ``COLLECTIVES_DEBUG``: a level and a standard-error handler when it is set."""
    level = LEVELS[debug_setting()]
    if level is None:
        return
    logger.setLevel(level)
    if not any(getattr(h, "_collectives", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        handler._collectives = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


_configured = False


def configure_once() -> None:
    """``configure()``, the first time it succeeds: for the multi-device API, whose calls
    make no communicator (where the setting is read otherwise). A bad value raises at every
    call, as at every communicator made."""
    global _configured
    if not _configured:
        configure()
        _configured = True


def program_level() -> int:
    """The ``stacklevel`` at which a warning issued by this function's caller names the
    program's line: the first frame outside the library (``collectives`` and its adapters)."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(
            "collectives"):
        frame, level = frame.f_back, level + 1
    return level
