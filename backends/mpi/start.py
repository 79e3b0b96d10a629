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


def check_settings(hang_guard: bool) -> None:
    """Read now, with the arguments' checks, the environment variables every communicator
    reads as it is made: ``COLLECTIVES_DEBUG``, and ``COLLECTIVES_HANG_GUARD`` where the
    guard is on (bad on one rank, read later, they raised there alone, its peers waiting
    their timeout)."""
    from collectives.log import debug_setting
    from collectives.runtime import hang_guard as guard

    debug_setting()
    if hang_guard:
        guard.setting()


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
