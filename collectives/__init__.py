"""collectives: all-reduce and friends over NumPy, MPI and NCCL, one set of algorithms.

Two ways of calling:

* multi-device: ``collectives.all_reduce([a0, a1, a2, a3])`` -> one result per device;
* SPMD: ``collectives.run(fn, size=4)`` calls ``fn(comm)`` on 4 ranks, and
  ``comm.all_reduce(x)`` inside reduces across them.
"""

from __future__ import annotations

from .algorithms.schedule import Collective, Schedule
from .api.communicator import Communicator
from .api.initialize import init
from .api.multi_device import all_gather, all_reduce, batch_all_reduce, broadcast, reduce, reduce_scatter
from .api.multi_device_copies import all_to_all, gather, scatter
from .errors import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    CommunicatorBrokenError,
    ConcurrentCallError,
    PeerFailedError,
    PeerTimeoutError,
)
from .ops import ReduceOp
from .registry import load_backend
from .runtime.work import Work
from .version import __version__ as __version__


def __getattr__(name: str):
    # ``collectives.backends`` and ``collectives.adapters`` are reachable after ``import
    # collectives`` alone; their submodules (transports, adapters) are imported when first named.
    if name in ("backends", "adapters"):
        import importlib

        return importlib.import_module(f"collectives.{name}")
    raise AttributeError(f"module 'collectives' has no attribute {name!r}")


def __dir__() -> list[str]:
    # What ``import collectives`` offers: the public names, not the modules of its wings.
    return sorted([*__all__, "__version__", "adapters", "algorithms", "backends", "errors",
                   "timeline"])


def run(fn, size: int, **kwargs) -> list:
    """Run ``fn(comm)`` on ``size`` thread ranks of the embedded transport; results in rank order."""
    return load_backend("local").run(fn, size, **kwargs)


__all__ = [
    "Collective", "CollectiveError", "CollectiveMismatchError", "CollectiveTimeoutError",
    "Communicator", "CommunicatorBrokenError", "ConcurrentCallError", "PeerFailedError",
    "PeerTimeoutError", "ReduceOp", "Schedule", "Work", "all_gather", "all_reduce", "all_to_all",
    "batch_all_reduce", "broadcast", "gather", "init", "load_backend", "reduce", "reduce_scatter",
    "run", "scatter",
]
