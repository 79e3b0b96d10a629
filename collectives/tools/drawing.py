"""``collectives draw``: any algorithm's schedule as text, proved, or one participant's plan."""

from __future__ import annotations

from .. import algorithms
from ..algorithms.base import Layout
from ..algorithms.checker import check, check_plans
from ..algorithms.schedule import Collective
from ..runtime.validate import resolve_groups

PROVED = ("checked: every output holds each contribution exactly once, and every holder holds "
          "the same computed value")


def draw(algorithm: str, collective: str = "all_reduce", participants: int = 4, *,
         root: int = 0, shards: int = 0, group_size: int = 0, rank: int | None = None) -> str:
    """The schedule of ``algorithm`` round by round and its proof; with ``rank``, only that
    participant's plan (cheap at any size: nothing else is built). ValueError on bad input."""
    name = algorithms.canonical(algorithm)
    if name == "auto":
        raise ValueError("auto picks per call; name an algorithm to draw")
    n = participants
    if n < 1:
        raise ValueError(f"-n {n}: the number of participants must be at least 1")
    if not 0 <= root < n:
        raise ValueError(f"--root {root} is not one of the {n} participants")
    if rank is not None and not 0 <= rank < n:
        raise ValueError(f"--rank {rank} is not one of the {n} participants")
    kind = Collective(collective)
    if not algorithms.supports(kind, name):
        raise ValueError(f"{name} has no {kind.value}; it has "
                         f"{', '.join(c.value for c in Collective if algorithms.supports(c, name))}")
    layout = Layout(resolve_groups(group_size, n)) if group_size else None
    if rank is not None:
        return algorithms.rank_plan(kind, name, n, rank, root=root, shards=shards,
                                    layout=layout).draw()
    if n > 256:
        raise ValueError(f"-n {n}: drawing every participant's steps past 256 is unreadable; "
                         "pass --rank R to draw one participant's plan")
    schedule = algorithms.schedule(kind, name, n, root=root, shards=shards, layout=layout)
    check_plans(algorithms.all_plans(kind, name, n, root=root, shards=shards, layout=layout))
    check(schedule)
    return f"{schedule.draw()}\n{PROVED}"
