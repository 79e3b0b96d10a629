"""The MPI transport: one process per rank, launched with ``mpiexec -n N python train.py``.

``init()`` wraps any mpi4py communicator (``COMM_WORLD`` by default) in the core's
``Communicator`` over an ``MPITransport``. Collectives run one of
three ways: MPI's own (``algorithm="native"``, alias ``"mpi"``: ``Iallreduce``, ``Ireduce``,
``Ibcast``, ``Iallgather``, ``Ireduce_scatter``, and their persistent forms for small
payloads), any schedule of the core over non-blocking point-to-point, or the one-pass
shared-memory all-reduce (``"shm"``, every rank on one node). ``auto`` picks by size
(``tuning.py``). See ``docs/mpi.md``.

The package's modules, one job each: ``groups`` (node groups), ``waiting`` (spin, yield,
sleep), ``tags`` and ``channel`` (point-to-point), ``notices`` (failure notices and status
questions), ``typed`` (what a point-to-point message says about itself), ``datatypes``,
``checks``, ``lane``, ``runs``, ``nonblocking``, ``persistent`` and ``native_collectives``
(MPI's collectives), ``hot_path`` (calls bound to their buffers, and the hot path), ``shm``
(shared memory), ``tuning`` (what runs when), ``abort`` (an uncaught exception ends the
job), ``transport`` (the transport itself). Importing the package does not initialise MPI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from collectives import Communicator
from collectives import Communicator as MPICommunicator  # the name init() once returned

from .groups import ENV_RANKS_PER_NODE, groups_from_env
from .tuning import NATIVE_NAMES, SHM_NAMES, canonical, chunks

if TYPE_CHECKING:  # pragma: no cover - typing only: mpi4py is imported on first use
    from .transport import MPITransport

__all__ = ["ENV_RANKS_PER_NODE", "MPICommunicator", "MPITransport", "NATIVE_NAMES", "SHM_NAMES",
           "canonical", "chunks", "groups_from_env", "init", "node_groups"]


def init(comm: Any = None, *, timeout: float = 300.0, check: bool = True,
         groups: str | int | Sequence[Sequence[int]] | None = "node",
         abort_on_error: bool = True, hang_guard: bool = True,
         agreed_settings: Callable[[], Mapping[str, Any]] | None = None) -> Communicator:
    """This rank's communicator over ``comm``. Collective: every rank calls it, with the
    same arguments.

    Parameters
    ----------
    comm
        An mpi4py communicator (None: ``MPI.COMM_WORLD``); the transport works on duplicates.
    timeout
        Every call's default deadline, in seconds.
    check
        Agree on each distinct call's arguments across ranks before its data moves
        (``False`` skips it).
    groups
        The default of two-level ``"A/B"`` algorithms (the transport's ``layout``):
        ``"node"`` (the ranks sharing each node, or ``COLLECTIVES_RANKS_PER_NODE``'s
        simulated nodes), a group size, an explicit partition, or None.
    abort_on_error
        An exception the program does not catch aborts the whole MPI job (``MPI_Abort``,
        after printing the traceback), instead of leaving the other ranks waiting for this
        one until their timeout; ``python -m mpi4py`` is then not needed. With ``False`` a
        rank that leaves (an uncaught exception, ``sys.exit``) still tells its peers, whose
        calls that need it then raise ``PeerFailedError`` naming it.
    hang_guard
        A rank whose call is still inside MPI well past its deadline (an MPI call that never
        returns, as MPICH's may after a peer died) prints where it is stuck and ends with exit
        code 124, so the job ends instead of hanging (``collectives.runtime.hang_guard``;
        ``COLLECTIVES_HANG_GUARD=off`` also turns it off, a number there sets its grace).
    agreed_settings
        Settings of the caller's that every rank must hold alike (``collectives.init``
        passes its calibration): a function returning name -> value, called with the
        arguments' checks. Where it raises TypeError or ValueError on any rank, or the
        values differ between ranks, every rank raises before the communicator exists.

    Returns
    -------
    Communicator
        This rank's communicator (``MPICommunicator`` is the same class).

    Raises
    ------
    MissingDependencyError
        mpi4py is not installed (the message names ``pip install
        'collective-schedules[mpi]'``).
    RuntimeError
        The ranks run different versions of the library.
    """
    from collectives.extras import require
    from collectives.runtime import hang_guard as guard
    from collectives.runtime.validate import check_default_timeout, check_flag
    from collectives.timeline import clock

    MPI = require("mpi4py.MPI", "mpi", "the MPI transport")

    from . import abort
    from .compiled import pure_python
    from .groups import layout_for
    from .start import agree_to_start, check_comm, check_settings
    from .transport import MPITransport

    def check_arguments() -> None:
        check_default_timeout(timeout)
        for name, flag in (("check", check), ("abort_on_error", abort_on_error),
                           ("hang_guard", hang_guard)):
            check_flag(flag, name)
        size = comm.Get_size()
        # (a bad COLLECTIVES_RANKS_PER_NODE, COLLECTIVES_DEBUG, COLLECTIVES_HANG_GUARD or
        # COLLECTIVES_PURE_PYTHON, on one rank too: read later, they raised there alone, or
        # not at all, its peers waiting their timeout; check_settings)
        check_settings(hang_guard, alike)
        pure_python()
        layout_for(groups, ((r,) for r in range(size)), size)
        if agreed_settings is not None:
            alike.update(agreed_settings())

    comm = MPI.COMM_WORLD if comm is None else comm
    check_comm(comm)
    alike: dict[str, Any] = {"check=": check}  # (and agreed_settings', once checked)
    # (before anything else: one rank's bad argument raises on every rank)
    probes = agree_to_start(comm, check_arguments, "collectives.backends.mpi.init", alike)
    abort.install(abort_on_error)
    guard.ENABLED = hang_guard  # (for this communicator and those made after it)
    transport = MPITransport(comm, groups=groups)
    communicator = Communicator(transport, timeout=timeout, check=check, name="mpi")
    clock.align(communicator, probes)
    return communicator


def node_groups(comm: Any) -> tuple[tuple[int, ...], ...]:
    """The ranks of ``comm`` sharing each node (or the simulated nodes), in rank order.
    Collective."""
    from .groups import node_groups as find

    return find(comm)


def __getattr__(name: str) -> Any:
    if name == "MPITransport":
        from .transport import MPITransport

        return MPITransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
