"""NCCL under mpiexec: one process per GPU, the core's ``Communicator`` over CuPy arrays.

``comm = collectives.load_backend("nccl").init()`` (run under ``mpiexec -n N``) gives a
``NcclCommunicator``: ``comm.all_reduce(x)`` and the other collectives on
``cupy.ndarray`` run NCCL's own collectives (``auto``, ``"nccl"``), the library's schedules
over NCCL send/recv (``"ring"``, ``"rechd"``, ...), or the two-level path across nodes
(``"two_level"``, ``.across_nodes``). See ``.transport`` for streams, ``.watchdog`` for
failures, and ``docs/gpu.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .bootstrap import broadcast_unique_id, node_of_ranks, ranks_per_node, shared_gpu
from .communicator import NcclCommunicator
from .gpu_work import GpuWork

__all__ = ["GpuWork", "NcclCommunicator", "broadcast_unique_id", "init", "node_of_ranks",
           "ranks_per_node", "shared_gpu"]


def init(comm: Any = None, *, device: int | None = None, stream: Any = None,
         timeout: float = 300.0, check: bool = True,
         abort_on_error: bool = True,
         agreed_settings: Callable[[], Mapping[str, Any]] | None = None) -> NcclCommunicator:
    """This rank's communicator over ``comm`` (default: ``MPI.COMM_WORLD``).

    ``device``: the GPU (default: local rank modulo the visible GPUs); ``stream``: the CUDA
    stream every call of this communicator is enqueued on (default: a non-blocking stream of
    its own, made on ``device``; calls hand over to and from the caller's current stream with
    events); ``timeout``: seconds before an unfinished call is an error; ``check``: agree on
    each call's arguments across ranks the first time its signature is seen;
    ``abort_on_error``: an exception the program does not catch aborts the whole MPI job,
    as under the MPI transport (``collectives.backends.mpi.abort``); ``agreed_settings``:
    settings every rank must hold alike, as the MPI transport's ``init`` takes them.
    """
    from collectives.backends.cupy.probe import nccl_module, require_gpu

    require_gpu()
    nccl_module()
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    from collectives.backends.mpi import abort
    from collectives.backends.mpi.start import agree_to_start, check_comm, check_settings

    from collectives.runtime import hang_guard as guard
    from collectives.runtime.validate import check_default_timeout, check_flag
    from collectives.timeline import clock

    from .transport import NcclTransport

    def check_arguments() -> None:
        check_default_timeout(timeout)
        check_flag(check, "check")
        check_flag(abort_on_error, "abort_on_error")
        # (COLLECTIVES_DEBUG, COLLECTIVES_HANG_GUARD, COLLECTIVES_RANKS_PER_NODE: as MPI's)
        check_settings(guard.ENABLED, alike)
        if agreed_settings is not None:
            alike.update(agreed_settings())

    check_comm(comm)
    alike: dict[str, Any] = {"check=": check}  # (and agreed_settings', once checked)
    # (before anything else: one rank's bad argument raises on every rank)
    probes = agree_to_start(comm, check_arguments, "collectives.backends.nccl.init", alike)
    abort.install(abort_on_error)
    transport = NcclTransport(comm, device=device, stream=stream, timeout=timeout)
    communicator = NcclCommunicator(transport, timeout=timeout, check=check, name="nccl")
    clock.align(communicator, probes)
    return communicator
