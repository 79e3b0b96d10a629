"""What every rank agrees on before a communicator over MPI makes its first call.

One gather of MPI's own (outside the communicator's numbered calls, so the program's first call
is call 1 in every message about it) carries each rank's library version, its clock probe
(``collectives.timeline.clock``) and what is wrong with its arguments. A bad argument then
raises on every rank alike: raised on its rank alone, it left the others in MPI's gather, which
has no timeout. The MPI and NCCL transports' ``init`` both start here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from collectives import __version__
from collectives.timeline import clock
from collectives.version import check_versions


def agree_to_start(comm: Any, check_arguments: Callable[[], None], call: str,
                   alike: dict[str, Any] | None = None) -> list:
    """Gather over ``comm`` (an mpi4py communicator), raise on every rank where any rank's
    ``check_arguments()`` failed, the versions differ, or an argument of ``alike`` (name ->
    value, the name as the error says it: ``"check="``, which decides whether calls agree)
    differs between ranks; return each
    rank's clock probe, in rank order, for ``clock.align``. ``call``: the function named in
    the error. ``alike`` is read after ``check_arguments()``, which may add to it."""
    problem = argument_problem(check_arguments)
    gathered = comm.allgather((__version__, clock.probe(), problem, alike or {}))
    raise_gathered_problems([problem for _, _, problem, _ in gathered], call)
    check_versions([version for version, _, _, _ in gathered])
    for name in alike or {}:
        values = [theirs.get(name) for _, _, _, theirs in gathered]
        if len(set(map(repr, values))) > 1:
            by_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            raise ValueError(f"{call}: ranks passed different {name} ({by_rank}); pass the "
                             "same on every rank")
    return [probe for _, probe, _, _ in gathered]


def check_comm(comm: Any) -> None:
    """``comm`` is an mpi4py communicator that holds this rank: this rank's own mistake,
    raised before any exchange (inside mpi4py, it named no argument)."""
    from mpi4py import MPI

    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm={comm!r} must be an mpi4py communicator (MPI.COMM_WORLD, or a "
                        "split of it), or None")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL (this rank is in no group of the split that "
                         "made it: a color of MPI.UNDEFINED); call init only on the ranks "
                         "the communicator holds")


def check_settings(hang_guard: bool, alike: dict[str, Any]) -> None:
    """Read now, with the arguments' checks, the environment variables every communicator
    reads as it is made: ``COLLECTIVES_DEBUG``, ``COLLECTIVES_HANG_GUARD`` where the guard is
    on (bad on one rank, read later, they raised there alone, its peers waiting their
    timeout), and ``COLLECTIVES_RANKS_PER_NODE``, which goes into ``alike`` too: each rank's
    ``auto`` prices its own simulated nodes, and ranks that ran different algorithms
    returned a root's sums short of a rank, silently."""
    from collectives.log import debug_setting
    from collectives.runtime import hang_guard as guard

    from .groups import ENV_RANKS_PER_NODE, ranks_per_node

    debug_setting()
    if hang_guard:
        guard.setting()
    alike[f"{ENV_RANKS_PER_NODE} (an environment variable)"] = ranks_per_node()


def argument_problem(check: Callable[[], None]) -> tuple[str, str] | None:
    """What ``check()`` raised, as (``"TypeError"`` or ``"ValueError"``, message), or None:
    gathered across ranks, so that one rank's bad argument raises on every rank."""
    try:
        check()
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)
    return None


def raise_gathered_problems(problems: Sequence[tuple[str, str] | None], call: str) -> None:
    """Raise, on every rank alike, the lowest failing rank's ``argument_problem``, naming that
    rank and any other whose arguments failed. ``problems``: each rank's, in rank order."""
    failing = [rank for rank, problem in enumerate(problems) if problem is not None]
    if not failing:
        return
    kind, message = problems[failing[0]]  # type: ignore[misc]
    more = f" (ranks {', '.join(map(str, failing[1:]))} passed bad arguments too)" \
        if len(failing) > 1 else ""
    error = TypeError if kind == "TypeError" else ValueError
    raise error(f"{call} on rank {failing[0]}: {message}{more}")
