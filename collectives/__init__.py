"""collectives: all-reduce and friends over NumPy, MPI and NCCL, one set of algorithms.

Two ways of calling:

* multi-device: ``collectives.all_reduce([a0, a1, a2, a3])`` -> one result per device;
* SPMD: ``collectives.run(fn, size=4)`` calls ``fn(comm)`` on 4 ranks, and
  ``comm.all_reduce(x)`` inside reduces across them.
"""

from __future__ import annotations

from .api import all_gather, all_reduce, batch_all_reduce, broadcast, reduce, reduce_scatter
from .api_blocks import all_to_all, gather, scatter
from .communicator import Communicator
from .errors import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    CommunicatorBrokenError,
    ConcurrentCallError,
    PeerFailedError,
    PeerTimeoutError,
)
from .initialize import init
from .ops import ReduceOp
from .registry import load_backend
from .schedule import Collective, Schedule
from .work import Work

__version__ = "0.1.0"


def __getattr__(name: str):
    # ``collectives.backends`` is reachable after ``import collectives`` alone; its
    # submodules (transports) are imported when first named.
    if name == "backends":
        import importlib

        return importlib.import_module("collectives.backends")
    raise AttributeError(f"module 'collectives' has no attribute {name!r}")


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
