"""collectives: all-reduce and friends over NumPy, MPI and NCCL, one set of algorithms.

Two ways of calling:

* multi-device: ``collectives.all_reduce([a0, a1, a2, a3])`` -> one result per device;
* SPMD: ``collectives.run(fn, size=4)`` calls ``fn(comm)`` on 4 ranks, and
  ``comm.all_reduce(x)`` inside reduces across them.
"""

from __future__ import annotations

import pkgutil as _pkgutil
from collections.abc import Callable
from typing import Any, TypeVar

# The package's wings, collectives.backends and collectives.adapters, live beside this folder
# in a checkout (backends/ and adapters/) and inside it once installed. Where Python imports
# the package from a checkout's own collectives/ folder (the checkout's root first on
# sys.path: `python -m pytest` there), the wings come from the other `collectives` folders on
# sys.path: the editable install's tree of links, which holds them. Each module still has one
# name and is imported once.
__path__ = _pkgutil.extend_path(__path__, __name__)

from .algorithms.schedule import Collective, Schedule
from .api.communicator import Communicator
from .api.initialize import init
from .api.multi_device import all_reduce, reduce
from .api.multi_device_batch import batch_all_reduce
from .api.multi_device_copies import all_to_all, gather, scatter
from .api.multi_device_spread import all_gather, broadcast, reduce_scatter
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

R = TypeVar("R")


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


def run(fn: Callable[..., R], size: int, **kwargs: Any) -> list[R]:
    """Run ``fn(comm)`` on ``size`` thread ranks of the embedded transport.

    Parameters
    ----------
    fn
        Called on every rank as ``fn(comm, *args)`` with that rank's `Communicator`.
    size
        How many ranks (threads).
    **kwargs
        For ``collectives.backends.local.run``: ``args`` (more arguments for ``fn``),
        ``timeout``, ``check``.

    Returns
    -------
    list
        What ``fn`` returned on each rank, in rank order.

    Raises
    ------
    Exception
        The first exception a rank raised (the others then raise `PeerFailedError`).
    """
    return load_backend("local").run(fn, size, **kwargs)


__all__ = [
    "Collective", "CollectiveError", "CollectiveMismatchError", "CollectiveTimeoutError",
    "Communicator", "CommunicatorBrokenError", "ConcurrentCallError", "PeerFailedError",
    "PeerTimeoutError", "ReduceOp", "Schedule", "Work", "all_gather", "all_reduce", "all_to_all",
    "batch_all_reduce", "broadcast", "gather", "init", "load_backend", "reduce", "reduce_scatter",
    "run", "scatter",
]
