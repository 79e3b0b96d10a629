"""Which participants a prediction prices, and the prediction itself.

Pricing every participant's plan costs ``n`` plans: fine for a few dozen, not for 65,536. So:

* up to ``EXACT`` participants, every one is priced (exact);
* **symmetric plans** are priced from one rank's plan: the ring's participants are each
  other's plans shifted by a rank (``q -> q + i``), recursive halving-doubling's on a power
  of two XOR-ed (``q -> q ^ i``), the direct shuffle's shifted. One plan, its peers mapped onto
  each member of host 0, gives every host's load (hosts of ``L`` consecutive ranks map onto
  each other by the same symmetry);
* **two-level plans** whose outer algorithm is symmetric are priced from the members of
  group 0: every group does the same;
* anything else is priced from a sample: whole hosts (or ranks) that hold the root, the
  ends, the middle and the power-of-two boundaries where folding algorithms differ, and a
  spread of others. The ring's broadcast is a chain in which each participant acts in a few
  rounds only: every participant up to 4,096, else a round none of the sample acts in costs
  what the busiest round before it did.

Rounds of equal shape are priced once (a ring of 65,536 has 131,070 rounds of two shapes).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from .. import algorithms
from .base import Layout
from .cost import Fabric, Part, Placement, Prediction
from .round_price import load, round_part
from .schedule import Collective

EXACT = 32          # up to this many participants, every plan is priced
CACHED_UP_TO = 4096  # plans of larger jobs: only the last few are kept
SPREAD = 16          # the sample's evenly spread participants, beyond the special ones


def symmetry(collective: Collective, name: str, size: int, shards: int,
             layout: Layout | None) -> str | None:
    """``"add"`` when participant ``i``'s plan is participant 0's with every peer ``q`` read as
    ``q + i`` (mod n), ``"xor"`` when as ``q ^ i``; None when the plans have no such symmetry."""
    return symmetry_of(collective, name, size, shards, layout.runs if layout is not None else 0)


def symmetry_of(collective: Collective, name: str, size: int, shards: int,
                runs: int) -> str | None:
    """``symmetry`` for a layout of ``runs`` consecutive participants per group (0: none, or
    groups of other shapes)."""
    C = Collective
    if name == "ring":
        if collective in (C.ALL_GATHER, C.ALL_TO_ALL):
            return "add"
        rotated = shards > 1 and bool(runs)
        if collective in (C.ALL_REDUCE, C.REDUCE_SCATTER) and not rotated:
            return "add"
    if name == "rechd" and size & (size - 1) == 0 and collective in (C.ALL_REDUCE, C.ALL_GATHER):
        return "xor"
    if name == "shuffle" and (shards <= 0 or shards >= size) and collective in (
            C.ALL_REDUCE, C.ALL_GATHER, C.ALL_TO_ALL, C.REDUCE_SCATTER):
        return "add"
    return None


def _members(kind: str, placement: Placement) -> list[int] | None:
    """Host 0's members when the symmetry maps hosts onto hosts (None: it does not)."""
    hosts = placement.hosts
    if hosts is None:
        return [0]
    L = hosts.runs
    if not L or placement.size % L or (kind == "xor" and L & (L - 1)):
        return None
    return list(range(L))


def _periodic(name: str, collective: Collective, shards: int, layout: Layout | None,
              placement: Placement) -> bool:
    """Whether every group of ``layout`` does what group 0 does: two-level plans whose outer
    algorithm is symmetric over the groups, and rings whose sub-chunks rotate inside them."""
    if layout is None:
        return False
    return periodic_of(name, collective, shards, layout.uniform, layout.runs, len(layout.groups),
                       placement.hosts is None or placement.hosts == layout)


def periodic_of(name: str, collective: Collective, shards: int, uniform: int, runs: int,
                groups: int, hosts_match: bool) -> bool:
    """``_periodic`` for ``groups`` groups of ``uniform`` participants each (0: unequal),
    ``runs`` of them consecutive (0: not), ``hosts_match``: the hosts are one host or these
    groups."""
    if not uniform or collective not in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER):
        return False
    if not hosts_match:
        return False
    if name == "ring":
        return bool(shards > 1 and runs)
    if "/" not in name:
        return False
    outer = name.split("/")[1]
    return outer in ("ring", "shuffle") or (outer == "rechd" and groups & (groups - 1) == 0)


def rotates_in_groups(name: str, periodic: bool, runs: int) -> bool:
    """Whether member ``i`` of "A/B" prices as member 0 with peers moved ``i`` places in their
    groups: periodic plans over consecutive groups whose A is the ring or the shuffle."""
    return periodic and bool(runs) and "/" in name and name.split("/")[0] in ("ring", "shuffle")


def _plan(collective, name, size, rank, root, shards, layout):
    # Plans built for pricing are kept apart from the runtime's cache (and its log): most
    # candidates never run. A few of a huge job's plans are kept while a decision prices
    # several sizes.
    if size <= CACHED_UP_TO:
        return _small_plan(collective, name, size, rank, root, shards, layout)
    return _big_plan(collective, name, size, rank, root, shards, layout)


@lru_cache(maxsize=4096)
def _small_plan(collective, name, size, rank, root, shards, layout):
    return algorithms.build_plan(collective, name, size, rank, root=root, shards=shards,
                                 layout=layout)


@lru_cache(maxsize=4)
def _big_plan(collective, name, size, rank, root, shards, layout):
    return algorithms.build_plan(collective, name, size, rank, root=root, shards=shards,
                                 layout=layout)


def special(size: int, root: int) -> set[int]:
    """The participants a sample always holds: the root, the ends, the middle, the power-of-two
    boundaries and an evenly spread few (more than ``EXACT`` participants)."""
    m = 1 << (size.bit_length() - 1)
    x = size - m
    chosen = {0, 1, 2, size // 2 - 1, size // 2, size // 2 + 1, size - 2, size - 1,
              root - 3, root - 2, root - 1, root, root + 1, m - 1, m, m + 1, x - 1, x, x + 1}
    chosen |= {int(k * 0.6180339887498949 % 1 * size) for k in range(1, SPREAD + 1)}
    return {p % size for p in chosen}


def sample(size: int, root: int, placement: Placement) -> list[int]:
    """The participants priced when no symmetry helps (whole hosts where hosts matter)."""
    if size <= EXACT:
        return list(range(size))
    chosen = special(size, root)
    hosts = placement.hosts
    if hosts is None:
        return sorted(chosen)
    whole = {hosts.group_of[p] for p in chosen}
    return sorted(p for g in whole for p in hosts.groups[g])


def predict(collective: Collective, name: str, size: int, nbytes: int, fabric: Fabric,
            placement: Placement | None = None, *, root: int = 0, shards: int = 0,
            layout: Layout | None = None, dtype: str = "float32",
            exact: bool = False) -> Prediction:
    """The predicted time of ``collective`` over ``size`` participants by algorithm ``name``
    (canonical; ``layout``: its groups) for a buffer of ``nbytes`` (what the plan's positions
    span: all-gathers' whole result). ``exact``: price every participant."""
    placement = placement or Placement(size)
    if placement.size != size:
        raise ValueError(f"placement is for {placement.size} participants, not {size}")
    if size == 1:
        return Prediction(name, collective, size, nbytes, fabric.call_overhead,
                          fabric.call_overhead)
    gamma = fabric.gamma_for(dtype)
    host_of = placement.hosts.group_of if placement.hosts is not None else None
    local = placement.local
    serial = fabric.serial
    kind = None if exact or size <= EXACT else symmetry(collective, name, size, shards, layout)
    members = _members(kind, placement) if kind else None
    maps = None
    if members is not None:
        assert kind is not None  # members are only looked for with a symmetry
        maps = _maps(kind, members, size)
    elif not exact and size > EXACT and "/" in name:
        maps = _two_level_maps(name, collective, layout, placement)
    if maps is not None:
        base = _plan(collective, name, size, 0, root, shards, layout)
        weights = {i: size / len(maps) for i in range(len(maps))} if serial else None
        parts = _symmetric(base, maps, size, nbytes, fabric, gamma, host_of, local, weights,
                           fabric.crowd(placement))
        return critical_path(parts, name, collective, size, nbytes, fabric.call_overhead)
    weight: float
    if not exact and size > EXACT and _periodic(name, collective, shards, layout, placement):
        assert layout is not None  # periodic plans have groups
        ranks = list(layout.groups[0])  # every group does what group 0 does
        weight, complete = len(layout.groups), True
    else:
        # the ring's broadcast is a chain: one participant acts only in its k rounds
        pipeline = name == "ring" and collective is Collective.BROADCAST
        every = exact or (pipeline and size <= CACHED_UP_TO)
        ranks = list(range(size)) if every else sample(size, root, placement)
        weight, complete = size / len(ranks), len(ranks) == size or not pipeline
    plans = [_plan(collective, name, size, r, root, shards, layout) for r in ranks]
    wait = fabric.crowd(placement)
    weights = {r: weight for r in ranks} if serial else None
    by_round: dict[int, list] = {}
    for plan in plans:
        scale = nbytes / plan.den
        for index, sends, recvs in plan.rounds:
            by_round.setdefault(index, []).append(
                load(plan.rank, sends, recvs, scale, host_of, local))
    parts, busiest = [], None
    for index in range(plans[0].num_rounds):
        loads = by_round.get(index)
        if loads is None:
            if busiest is not None and not complete:
                parts.append((index, busiest))  # nobody sampled acts: a pipeline's middle
            continue
        part = round_part(loads, fabric, gamma, weights, wait)
        if busiest is None or part.seconds > busiest.seconds:
            busiest = part
        parts.append((index, part))
    return critical_path(parts, name, collective, size, nbytes, fabric.call_overhead)


def _maps(kind: str, members: list[int], size: int) -> list:
    """Per member ``i``, how participant 0's peers read as its own (None: as they are)."""
    if kind == "add":
        return [None if i == 0 else (lambda q, i=i: (q + i) % size) for i in members]
    return [None if i == 0 else (lambda q, i=i: q ^ i) for i in members]


def _two_level_maps(name: str, collective: Collective, layout: Layout | None,
                    placement: Placement) -> list | None:
    """Member ``i`` of group ``g`` of "A/B" over consecutive groups of ``L`` is member 0's plan
    with every peer's place in its group moved by ``i`` (A's own symmetry inside groups), when
    B is symmetric over the groups and A over the members (its reduce-scatter and all-gather)."""
    if layout is None or not rotates_in_groups(
            name, _periodic(name, collective, 0, layout, placement), layout.runs):
        return None
    L = layout.runs
    return [None if i == 0 else (lambda q, i=i: q - q % L + (q % L + i) % L) for i in range(L)]


def _symmetric(base, maps, size, nbytes, fabric, gamma, host_of, local, weights,
               wait=(0.0, 0.0)):
    """Participant 0's plan priced for each member ``i`` through ``maps[i]``; rounds of equal
    shape once."""
    scale = nbytes / base.den
    memo: dict = {}
    parts = []
    for index, sends, recvs in base.rounds:
        key = (tuple((d, hi - lo) for d, lo, hi in sends),
               tuple((srcs, hi - lo, red) for _, srcs, lo, hi, red in recvs))
        part = memo.get(key)
        if part is None:
            loads = [load(i, sends, recvs, scale, host_of, local, f)
                     for i, f in enumerate(maps)]
            part = memo[key] = round_part(loads, fabric, gamma, weights, wait)
        parts.append((index, part))
    return parts


def critical_path(parts: Sequence[tuple[int, Part]], name: str, collective: Collective,
                  size: int, nbytes: int, call_overhead: float = 0.0) -> Prediction:
    """The prediction from each round's part, ``(index, part)`` in round order, after the
    call's own overhead."""
    runs: list = []
    latency, transfer, reduction = call_overhead, 0.0, 0.0
    for index, part in parts:
        latency += part.latency
        transfer += part.transfer
        reduction += part.reduction
        if runs and runs[-1][2][:3] == part[:3] and runs[-1][0] + runs[-1][1] == index:
            runs[-1][1] += 1
        else:
            runs.append([index, 1, part])
    return Prediction(name, collective, size, nbytes, latency + transfer + reduction,
                      latency, transfer, reduction, [tuple(r) for r in runs])


@lru_cache(maxsize=64)
def rounds_of(collective: Collective, name: str, size: int) -> int:
    """How many rounds a plan has (for descriptions)."""
    return _plan(collective, name, size, 0, 0, 0, None).num_rounds


__all__ = ["EXACT", "Part", "predict", "sample", "symmetry"]
