"""``collectives timeline``: merge the ranks' timeline files, draw them, and summarise them.

The timeline is one package, ``collectives.timeline``: its recording (``recorder``,
``clock``, the hooks ``record_*``) and its reading (``trace_files`` reads, merges and checks
trace files, ``summary`` says where the time went and who was waited for, ``plot`` draws the
picture, ``command`` is the subcommand). This module keeps the documented import
``from collectives.tools.timeline import summary, traces`` working: ``traces`` is
``collectives.timeline.trace_files``.
"""

from __future__ import annotations

from ..timeline import command, plot, summary
from ..timeline import trace_files as traces

__all__ = ["command", "plot", "summary", "traces"]
