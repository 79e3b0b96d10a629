"""Which workers take part: the ``communicator`` argument, the launcher's world size, and
``Workers``, what the paths that reduce across them share."""

from __future__ import annotations

import contextlib
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collectives import Communicator
from collectives.runtime.refusals import refused_to_peers
from collectives.runtime.validate import check_timeout

from . import convert
from .agreement import agree, signature
from .pinned import PinnedBuffer

__all__ = ["Workers", "call_timeout", "launched_world_size", "open_communicator"]


def call_timeout(options: Any) -> float | None:
    """A call's ``timeout`` from its ``CommunicationOptions``: ``timeout_seconds`` None (or no
    options) is the communicator's own; 0, which TensorFlow reads as no timeout, is
    ``math.inf`` (the library refuses ``timeout=0``, and said so on every worker)."""
    timeout = options.timeout_seconds if options is not None else None
    return math.inf if timeout == 0 and not isinstance(timeout, bool) else timeout


@dataclass
class Workers:
    """What a cross-device-ops instance's paths (host, device, concatenations) share to
    reduce across worker processes: the ``Communicator`` (None: one worker), how the workers'
    totals combine (``sum``: "mean" or "sum"), the wire ``compression`` (or None), the lock
    that keeps one batch at a time per process (collectives between processes must not
    interleave) and the pinned host buffer that stages GPU totals, used under it."""

    comm: Any
    sum: str = "mean"
    compression: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    pinned: PinnedBuffer = field(default_factory=PinnedBuffer)

    @property
    def size(self) -> int:
        """How many worker processes reduce together (1 without a communicator)."""
        return self.comm.size if self.comm is not None else 1

    @property
    def rank(self) -> int:
        """This worker's rank among them, from 0 (0 without a communicator)."""
        return self.comm.rank if self.comm is not None else 0

    def refused_to_peers(self, what: str, errors: tuple) -> Any:
        """A context in which a bad argument this worker finds (``errors``) before its calls
        across workers (a reduce op, destinations, replicas that differ, a shape error while
        tracing) reaches the other workers at once: their call's agreement meets its refusal
        (``PeerFailedError`` naming it; ``collectives.runtime.refusals``). Their call paired
        with this worker's next one instead, whose sums it returned, silently wrong, or
        waited out its timeout."""
        if self.comm is None:
            return contextlib.nullcontext()
        return refused_to_peers(self.comm, f"{what} (TensorFlow's cross-device ops)", errors)

    def agree_on_empty(self, op: Any, timeout: float | None) -> None:
        """An empty batch's agreement across workers (one host call, at every step in a
        graph): a worker whose batch is empty beside another's tensors returned at once, and
        the other's call paired with its next step's (silently wrong sums); now both raise
        ``CollectiveMismatchError``."""
        if self.size == 1:
            return
        agreed = signature({"call": "batch_reduce", "op": op.name, "workers_sum": self.sum,
                            "compression": self.compression, "devices": (), "route": (),
                            "tensors": ()})

        def run():
            with self.lock:
                agree(self.comm, agreed, timeout=timeout)
            return [np.zeros((), np.int8)]  # (a host call has an output to order the next)
        convert.host_call(run, [], [np.int8], [()], name="collectives_empty_batch")


DEFAULT_TIMEOUT = 300.0  # seconds, for the MPI communicator open_communicator makes

# Launchers announce the world size in the environment: MPICH/hydra, Open MPI, PMIx, Slurm.
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")


def launched_world_size(env=None) -> int:
    """How many processes ``mpiexec`` started (1 when not launched by an MPI launcher)."""
    env = os.environ if env is None else env
    for name in _SIZE_VARIABLES:
        value = env.get(name)
        if value and value.isdigit():
            return int(value)
    return 1


def open_communicator(communicator, *, timeout: float | None = None, auto: bool = False):
    """The ``Communicator`` that ``communicator`` names, or None for a single worker.

    Accepted: a ``collectives.Communicator`` (used as is, with its own timeout: a ``timeout``
    given beside it raises, as it would be ignored), ``"mpi"`` (a new
    ``collectives.backends.mpi.init(timeout=timeout)``, 300 s by default; every process must
    construct it, as it is collective), or None (one worker). With ``auto``, also ``"auto"``:
    MPI when an MPI launcher started more than one process, else None. Anything else raises
    now, not at the first reduction.
    """
    given, timeout = timeout, check_timeout(timeout)  # (now, on one worker too)
    if timeout is not None and isinstance(communicator, Communicator):
        raise ValueError(f"timeout={given!r} applies to a communicator this opens; the "
                         "Communicator passed keeps its own (init(timeout=...)): drop timeout=, "
                         "or give it there (CommunicationOptions(timeout_seconds=...) per call)")
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    choices = "a collectives.Communicator, 'mpi' (collectives.backends.mpi.init()), " + \
        ("'auto' or None" if auto else "or None")
    if communicator is None or isinstance(communicator, Communicator):
        return communicator
    if not isinstance(communicator, str):
        raise TypeError(f"communicator={communicator!r} is a {type(communicator).__name__}; pass "
                        f"{choices}")
    if auto and communicator == "auto":
        if launched_world_size() <= 1:
            return None
        communicator = "mpi"
    if communicator == "mpi":
        from collectives.backends import mpi

        return mpi.init(timeout=timeout)
    raise ValueError(f"communicator={communicator!r} is not a known name; pass {choices}")
