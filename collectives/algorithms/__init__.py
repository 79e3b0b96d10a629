"""The algorithm registry: names, aliases, and building the schedule of a collective.

Names: ``one_device``, ``ring``, ``rechd``, ``tree``, ``shuffle`` and any two-level
composition ``"A/B"``. TensorFlow's names are aliases: ``xring`` is the ring, ``pscpu`` and
``psgpu`` the shuffle, and ``nccl`` the ring (what NCCL runs for large buffers); a transport
with a native all-reduce of its own (MPI, NCCL) may run that instead for ``nccl``.
``auto`` lets the selector choose. ``build(..., verify=True)`` also runs the checker.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from ..schedule import (
    Collective,
    Schedule,
    check,
    concat,
    gather_to_root,
    prune,
    scatter_to_blocks,
)
from . import one_device, rechd, ring, shuffle, tree, two_level

MODULES = {
    "one_device": one_device,
    "ring": ring,
    "rechd": rechd,
    "tree": tree,
    "shuffle": shuffle,
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
            raise ValueError(
                f"{argument}={name!r}: unknown algorithm {part!r}; known: 'auto', "
                f"{', '.join(repr(n) for n in NAMES)}, or two of them joined by '/'")
        out.append(base)
    return "/".join(out)


def supports(collective: Collective, name: str) -> bool:
    if "/" in name:
        return collective in (Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER)
    if collective is Collective.BROADCAST:
        return hasattr(MODULES[name], "broadcast")
    return True


def _uniform_group_size(groups, size: int) -> int:
    """The ring rotates sub-chunks inside groups only when they are equal consecutive runs."""
    if not groups:
        return 0
    k = len(groups[0])
    runs = tuple(tuple(range(i, i + k)) for i in range(0, size, k))
    return k if tuple(groups) == runs else 0


@lru_cache(maxsize=1024)
def _build(collective: Collective, name: str, size: int, root: int, shards: int,
           groups: tuple[tuple[int, ...], ...] | None) -> Schedule:
    if "/" in name:
        inner, outer = (MODULES[p] for p in name.split("/"))
        layout = groups or (tuple(range(size)),)
        full = two_level.all_reduce(inner, outer, layout, shards, name)
        if collective is Collective.ALL_REDUCE:
            return full
        return prune(full, collective, root)
    module = MODULES[name]
    if collective is Collective.ALL_REDUCE:
        if name == "ring":
            return module.all_reduce(size, max(shards, 1), _uniform_group_size(groups, size))
        return module.all_reduce(size, shards)
    if collective is Collective.BROADCAST:
        return module.broadcast(size, root, shards)
    if collective is Collective.ALL_GATHER:
        return module.all_gather(size, shards)
    if name in ("tree", "one_device") and collective is Collective.REDUCE:
        rounds, owners = module.reduce_phase(size, root=root)
    elif name in ("tree", "one_device"):
        rounds, owners = module.reduce_phase(size)
    else:
        rounds, owners = module.reduce_phase(size, shards) if name != "rechd" else module.reduce_phase(size)
    if collective is Collective.REDUCE:
        tail = gather_to_root(owners, root)
    else:
        tail = scatter_to_blocks(owners, size)
    return concat(name, collective, size, rounds, tail, root=root)


def build(collective: Collective, name: str, size: int, *, root: int = 0, shards: int = 0,
          groups: Sequence[Sequence[int]] | None = None, verify: bool = False) -> Schedule:
    """The schedule of ``collective`` by algorithm ``name`` (canonical) over ``size`` participants."""
    if not supports(collective, name):
        raise ValueError(f"algorithm {name!r} has no {collective.value}; use one of "
                         f"{', '.join(n for n in MODULES if supports(collective, n))}")
    if shards < 0:
        raise ValueError(f"shards={shards} must be 0 (the algorithm's default) or more")
    key = tuple(tuple(g) for g in groups) if groups else None
    schedule = _build(collective, name, size, root, shards, key)
    if verify:
        check(schedule)
    return schedule
