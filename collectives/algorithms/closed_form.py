"""``predict``'s answer in closed form, for any participant count.

``collectives.algorithms.sampling.predict`` prices the plans of a few participants round by
round, and a plan holds ``O(n)`` rounds (the ring's ``2 (n - 1)``) or messages (the shuffle's):
past about a hundred thousand participants that takes minutes and gigabytes. ``price`` gives
the same prediction from the plans' *forms* (``collectives.algorithms.module_forms``): runs of
equal rounds, each priced once and counted ``count`` times, with peer ranges in place of
``n - 1`` messages. It prices the participants ``predict`` prices, in its order, with hosts
and groups of consecutive participants told by their sizes, so that its every round's part
(``round_part`` of the same loads) is ``predict``'s and its totals differ only in how the
floating-point sums are rounded (``count`` times a round's time, not ``count`` additions).

What it costs grows with the participants priced (a host's members, or a sample's whole
hosts) and the runs of their forms, not with ``n``: milliseconds at ``10**9`` participants on
hosts of a few.
"""

from __future__ import annotations

from .cost import HOST, NET, PROC, Fabric, Placement, Prediction
from .module_forms import form
from .round_forms import Form, Peers, distinct, in_range, size, span
from .round_price import Load, round_part
from .sampling import (
    CACHED_UP_TO,
    EXACT,
    periodic_of,
    rotates_in_groups,
    special,
    symmetry_of,
)
from .schedule import Collective

ROOTED = frozenset({Collective.REDUCE, Collective.BROADCAST, Collective.GATHER,
                    Collective.SCATTER})


class HostOf:
    """Participant ``q``'s host: hosts of ``per`` consecutive participants (``load``'s
    ``host_of``, without a list of ``n``)."""

    def __init__(self, per: int):
        self.per = per

    def __getitem__(self, q: int) -> int:
        return q // self.per


def price(collective: Collective, name: str, n: int, nbytes: int, fabric: Fabric, *,
          per: int = 0, processes: bool = True, root: int = 0, shards: int = 0, group: int = 0,
          dtype: str = "float32") -> Prediction:
    """``predict(collective, name, n, nbytes, fabric, Placement.nodes(n // per, per,
    processes), root=root, shards=shards, layout=<groups of group>)`` without the plans:
    ``per``: participants per host (0: one host), ``group``: the size of the consecutive
    groups handed to the plans as their layout (0: none; two-level names need them)."""
    if n == 1:
        return Prediction(name, collective, n, nbytes, fabric.call_overhead,
                          fabric.call_overhead)
    for value, what in ((per, "per"), (group, "group")):
        if value and (value < 0 or n % value):
            raise ValueError(f"{what}={value} does not divide the {n} participants into equal "
                             "groups: pass a divisor of the count (or 0)")
    hosts = per if per and n // per > 1 else 0  # Placement.nodes: one host is no hosts
    group = group if group and n // group > 1 else 0
    plan_root = root if collective in ROOTED else 0
    # two-level plans without groups run as one group of everyone
    kw = dict(root=plan_root, shards=shards, group=group or n if "/" in name else group,
              per=hosts)
    priced, maps, weight, every_round = _who(collective, name, n, root, shards, group, hosts)
    if maps is not None:  # participant 0's form, its peers read as each member's
        base = form(collective, name, n, 0, **kw)
        forms = [(i, base if f is None else _mapped(base, f)) for i, f in zip(priced, maps)]
    else:
        forms = [(r, form(collective, name, n, r, **kw)) for r in priced]
    parts = _sweep(forms, nbytes, fabric, fabric.gamma_for(dtype), hosts,
                   HOST if processes else PROC, weight, every_round,
                   fabric.crowd(Placement(hosts or n, None, processes)))
    return _prediction(parts, name, collective, n, nbytes, fabric.call_overhead)


def _who(collective, name, n, root, shards, group, hosts):
    """``predict``'s participants: ``(ranks, maps or None, weight, every_round)``; maps: how
    participant 0's peers read as each member's (None in a map: as they are)."""
    kind = None if n <= EXACT else symmetry_of(collective, name, n, shards, group)
    if kind and not (kind == "xor" and hosts & (hosts - 1)):
        members = list(range(hosts or 1))
        if name == "ring" and collective is Collective.ALL_TO_ALL:
            # the peers move every round: each member's own form, the same as the shifted one
            return members, None, n / len(members), False
        return members, [None if i == 0 else (kind, i, n) for i in members], n / len(members), False
    periodic = n > EXACT and bool(group) and periodic_of(
        name, collective, shards if "/" not in name else 0, group, group, n // group,
        not hosts or hosts == group)
    if "/" in name and rotates_in_groups(name, periodic, group):
        members = list(range(group))
        return (members, [None if i == 0 else ("rotate", i, group) for i in members],
                n / len(members), False)
    if n > EXACT and group and periodic_of(name, collective, shards, group, group, n // group,
                                           not hosts or hosts == group):
        return list(range(group)), None, n // group, False
    pipeline = name == "ring" and collective is Collective.BROADCAST
    if n <= EXACT or pipeline and n <= CACHED_UP_TO:
        return list(range(n)), None, 1.0, False
    chosen = special(n, root)
    if hosts:
        chosen = {p for h in {q // hosts for q in chosen} for p in range(h * hosts, h * hosts + hosts)}
    ranks = sorted(chosen)
    return ranks, None, n / len(ranks), pipeline and len(ranks) < n


def _mapped(base: Form, how: tuple) -> Form:
    runs = tuple((first, count, tuple((q, w) for p, w in sends for q in _moved(p, how)),
                  tuple((q, w, red) for p, w, red in recvs for q in _moved(p, how)))
                 for first, count, sends, recvs in base.runs)
    return Form(base.den, base.count, runs)


def _moved(p: Peers, how: tuple) -> list[Peers]:
    """Peer set ``p`` read as member ``i``'s: ``q + i`` (mod n), ``q ^ i`` or ``q``'s place
    in its group of ``L`` moved by ``i``."""
    kind, i, n = how
    ja, jb, a, b, num, den = p
    if kind == "rotate" and a % n == 0:  # the same place in every group
        return [(ja, jb, a, b - b % n + (b % n + i) % n, num, den)]
    if a != 1 or num != den:
        raise ValueError(f"a {kind} symmetry moves ranges of participants, not {p}")
    lo, hi = ja + b, jb + b
    if kind == "xor":
        if hi - lo != 1:
            raise ValueError("an xor symmetry moves single participants")
        return [span(lo ^ i, (lo ^ i) + 1)]
    if kind == "add":
        lo, hi = lo + i, hi + i
        if lo >= n:
            lo, hi = lo - n, hi - n
        return [span(lo, min(hi, n))] + ([span(0, hi - n)] if hi > n else [])
    out = []  # rotate: each group's part of the range moves inside that group
    while lo < hi:
        start = lo - lo % n
        end = min(hi, start + n)
        a0, b0 = (lo - start + i) % n, (end - 1 - start + i) % n + 1
        out += [span(start + a0, start + b0)] if a0 < b0 else [
            span(start + a0, start + n), span(start, start + b0)]
        lo = end
    return [q for q in out if size(q)]


def tally(rank: int, sends, recvs, scale: float, hosts: int, local: int) -> Load:
    """``cost.load`` of one round of a form: the same sums, from peer sets."""
    home = rank // hosts if hosts else 0
    lo, hi = home * hosts, home * hosts + hosts
    out, into, reduced, messages = [0, 0, 0], [0, 0, 0], 0, 0
    for where, peers, width in [(out, p, w) for p, w in sends] + [(into, p, w)
                                                                  for p, w, _ in recvs]:
        count = size(peers)
        messages += count
        near = in_range(peers, lo, hi) if hosts else count
        where[local] += near * width
        where[NET] += (count - near) * width
    for peers, width, reduce in recvs:
        if reduce:
            reduced += width * size(peers)
    return Load(rank, home, (out[0] * scale, out[1] * scale, out[2] * scale),
                (into[0] * scale, into[1] * scale, into[2] * scale), reduced * scale,
                messages, distinct([p for p, _, _ in recvs]))


def _sweep(forms, nbytes, fabric, gamma, hosts, local, weight, every_round, wait) -> list:
    """``(first, count, part)`` per stretch of rounds in which the same participants act
    alike, in round order; ``every_round``: a pipeline's sample, whose rounds nobody sampled
    acts in cost what the busiest before them did."""
    starts: dict[int, list] = {}
    ends: dict[int, list] = {}
    for order, (rank, f) in enumerate(forms):
        scale = nbytes / f.den
        for first, count, sends, recvs in f.runs:
            ld = tally(rank, sends, recvs, scale, hosts, local)
            starts.setdefault(first, []).append((order, ld))
            ends.setdefault(first + count, []).append(order)
    total = forms[0][1].count
    cuts = sorted({0, total, *starts, *ends})
    weights = {rank: weight for rank, _ in forms} if fabric.serial else None
    active: dict[int, Load] = {}
    memo: dict = {}
    parts, busiest = [], None
    for lo, hi in zip(cuts, cuts[1:]):
        for order in ends.get(lo, ()):
            active.pop(order, None)
        for order, ld in starts.get(lo, ()):
            active[order] = ld
        if not active:
            if busiest is not None and every_round:
                parts.append((lo, hi - lo, busiest))
            continue
        loads = tuple(active[k] for k in sorted(active))
        part = memo.get(loads)
        if part is None:
            part = memo[loads] = round_part(loads, fabric, gamma, weights, wait)
        if busiest is None or part.seconds > busiest.seconds:
            busiest = part
        parts.append((lo, hi - lo, part))
    return parts


def _prediction(parts, name, collective, n, nbytes, call_overhead) -> Prediction:
    """``sampling.critical_path`` over stretches of equal rounds: each priced once, counted."""
    runs: list = []
    latency, transfer, reduction = call_overhead, 0.0, 0.0
    for first, count, part in parts:
        latency += part.latency * count
        transfer += part.transfer * count
        reduction += part.reduction * count
        if runs and runs[-1][2][:3] == part[:3] and runs[-1][0] + runs[-1][1] == first:
            runs[-1][1] += count
        else:
            runs.append([first, count, part])
    return Prediction(name, collective, n, nbytes, latency + transfer + reduction,
                      latency, transfer, reduction, [tuple(r) for r in runs])
