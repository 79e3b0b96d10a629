"""The algorithm registry: names, aliases, and every participant's plan.

Names: ``one_device``, ``ring``, ``rechd``, ``tree``, ``shuffle`` and any two-level
composition ``"A/B"``. TensorFlow's names are aliases: ``xring`` is the ring, ``pscpu`` and
``psgpu`` the shuffle, and ``nccl`` the ring (what NCCL runs for large buffers); a transport
with a native collective of its own (MPI, NCCL) may run that instead for ``nccl``. ``auto``
lets the selector choose.

``rank_plan`` gives one participant's plan (cached: a training loop repeats the same calls),
``schedule`` the union of all of them, which ``collectives.algorithms.checker.check`` proves.

This package is also the core's wing that says what moves where: plans as data
(``schedule``), one module per algorithm, their proof (``checker``), ``auto``'s choice
(``select``), all-reduce specs, packing and batches. It imports only the base
(``collectives.errors``, ``ops``, ``arrays``, ...); see docs/architecture.md.
"""

from __future__ import annotations

import logging
from functools import lru_cache

from . import one_device, rechd, ring, shuffle, tree, two_level
from .base import AlgorithmModule, Layout
from .schedule import Collective, RankPlan, Schedule, union

MODULES: dict[str, AlgorithmModule] = {
    m.NAME: m for m in (one_device, ring, rechd, tree, shuffle)
}

ALIASES = {
    "xring": "ring",
    "nccl": "ring",
    "pscpu": "shuffle",
    "psgpu": "shuffle",
    "direct": "shuffle",
    "reduction_to_one_device": "one_device",
    "halving_doubling": "rechd",
    "binomial_tree": "tree",
}

NAMES = tuple(MODULES) + tuple(ALIASES)
PLANS = logging.getLogger("collectives.plans")
ROOTED = frozenset({Collective.REDUCE, Collective.BROADCAST, Collective.GATHER,
                    Collective.SCATTER})


def canonical(name: str, argument: str = "algorithm") -> str:
    """``"auto"``, a base name, or ``"A/B"`` in canonical spelling; ValueError names the bad part."""
    if not isinstance(name, str):
        raise TypeError(f"{argument} must be a string such as 'ring' or 'pscpu/pscpu', "
                        f"not {type(name).__name__}")
    text = name.strip().lower()
    if text in ("auto", "collective"):
        return "auto"
    parts = text.split("/")
    if len(parts) > 2 or not all(parts):
        raise ValueError(f"{argument}={name!r} is malformed: use one name or two joined by '/' "
                         "(e.g. 'nccl/xring')")
    out = []
    for part in parts:
        base = ALIASES.get(part, part)
        if base not in MODULES:
            from difflib import get_close_matches

            hint = get_close_matches(part, NAMES, n=1)
            maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ValueError(
                f"{argument}={name!r}: unknown algorithm {part!r}{maybe}; known: 'auto', "
                f"{', '.join(repr(n) for n in NAMES)}, or two of them joined by '/'")
        out.append(base)
    return "/".join(out)


def supports(collective: Collective, name: str) -> bool:
    """Whether algorithm ``name`` (canonical) implements ``collective``."""
    if "/" in name:
        return collective in two_level.REDUCING
    return collective in MODULES[name].COLLECTIVES


def names_for(collective: Collective) -> list[str]:
    return [n for n in MODULES if supports(collective, n)]


def _key_shards(name: str, shards: int) -> int:
    # plans of algorithms that ignore ``shards`` are the same for every value: one cache entry
    return shards if any(MODULES[part].SHARDED for part in name.split("/")) else 0


@lru_cache(maxsize=8192)
def _plan(collective: Collective, name: str, size: int, rank: int, root: int, shards: int,
          layout: Layout | None) -> RankPlan:
    PLANS.info("plan: %s %s over %d, participant %d (root %d, shards %d)", name,
               collective.value, size, rank, root, shards)
    return _build(collective, name, size, rank, root, shards, layout)


def _build(collective: Collective, name: str, size: int, rank: int, root: int, shards: int,
           layout: Layout | None) -> RankPlan:
    if "/" in name:
        inner, outer = (MODULES[p] for p in name.split("/"))
        phase = two_level.phase(inner, outer, collective, size, rank, root=root, shards=shards,
                                layout=layout)
    else:
        phase = MODULES[name].phase(collective, size, rank, root=root, shards=shards,
                                    groups=layout)
    return RankPlan(name, collective, size, rank, phase.den, phase.count, phase.rounds, root)


def rank_plan(collective: Collective, name: str, size: int, rank: int, *, root: int = 0,
              shards: int = 0, layout: Layout | None = None) -> RankPlan:
    """Participant ``rank``'s plan of ``collective`` by algorithm ``name`` (canonical)."""
    if not supports(collective, name):
        raise ValueError(f"algorithm {name!r} has no {collective.value}; use one of "
                         f"{', '.join(names_for(collective))}")
    if collective not in ROOTED:
        root = 0
    if layout is not None and "/" not in name and not MODULES[name].uses_layout(layout):
        layout = None  # a plan that ignores the groups: one cache entry for every layout
    return _plan(collective, name, size, rank, root, _key_shards(name, shards), layout)


def build_plan(collective: Collective, name: str, size: int, rank: int, *, root: int = 0,
               shards: int = 0, layout: Layout | None = None) -> RankPlan:
    """``rank_plan``, built afresh and not kept (pricing a plan of a huge job once)."""
    if not supports(collective, name):
        raise ValueError(f"algorithm {name!r} has no {collective.value}")
    if collective not in ROOTED:
        root = 0
    if layout is not None and "/" not in name and not MODULES[name].uses_layout(layout):
        layout = None
    return _build(collective, name, size, rank, root, _key_shards(name, shards), layout)


@lru_cache(maxsize=256)
def schedule(collective: Collective, name: str, size: int, *, root: int = 0, shards: int = 0,
             layout: Layout | None = None) -> Schedule:
    """The global schedule: every participant's plan, united (for the multi-device executor,
    the checker and drawings)."""
    return union(all_plans(collective, name, size, root=root, shards=shards, layout=layout))


def all_plans(collective: Collective, name: str, size: int, *, root: int = 0, shards: int = 0,
              layout: Layout | None = None) -> list[RankPlan]:
    return [rank_plan(collective, name, size, p, root=root, shards=shards, layout=layout)
            for p in range(size)]
