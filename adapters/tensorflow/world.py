"""Which workers take part: the ``communicator`` argument, and the launcher's world size."""

from __future__ import annotations

import os

from collectives import Communicator

__all__ = ["launched_world_size", "open_communicator"]

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


def open_communicator(communicator, *, timeout: float = 300.0, auto: bool = False):
    """The ``Communicator`` that ``communicator`` names, or None for a single worker.

    Accepted: a ``collectives.Communicator`` (used as is), ``"mpi"`` (a new
    ``collectives.backends.mpi.init(timeout=timeout)``; every process must construct it, as it
    is collective), or None (one worker). With ``auto``, also ``"auto"``: MPI when an MPI
    launcher started more than one process, else None. Anything else raises now, not at the
    first reduction.
    """
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
