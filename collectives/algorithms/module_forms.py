"""Every algorithm's rounds in closed form: what each module's ``phase`` builds, as the runs
of ``collectives.algorithms.round_forms`` (read that module's docstring first).

* ring: its ``n - 1`` reduce-scatter and ``n - 1`` all-gather rounds are two runs (each
  sub-chunk keeps its neighbours in every round); the broadcast chain is three runs per
  participant; the pairwise all-to-all a few runs, cut where the peer crosses a host's edge;
* shuffle and one_device: one or two rounds whose ``n - 1`` messages are peer ranges;
* tree and recursive halving-doubling: their plans (``O(log n)`` steps), but the steps that
  hand out a reduced buffer's blocks (the root's ``n - 1`` messages), which are ranges;
* two-level "A/B": A's forms inside the group and B's across the groups, embedded as
  ``collectives.algorithms.two_level`` embeds the phases.
"""

from __future__ import annotations

from math import lcm

from .. import algorithms
from . import rechd as rechd_module
from . import ring as ring_module
from . import tree as tree_module
from .round_forms import (
    Form,
    but,
    concat,
    embed,
    from_rounds,
    one,
    others,
    overlay,
    owners,
    received,
    sent,
    single,
    span,
    spread,
)
from .schedule import Collective

C = Collective


def form(collective: Collective, name: str, n: int, r: int, *, root: int = 0, shards: int = 0,
         group: int = 0, per: int = 0) -> Form:
    """Participant ``r``'s rounds of ``collective`` over ``n`` by ``name`` (canonical; ``root``
    and ``shards`` as the plans take them): ``group`` is the size of the layout's consecutive
    groups (0: none) and ``per`` the participants of a host (0: one host), where rounds
    differ by the hosts their peers are on."""
    if n == 1:
        return Form(1, 0, ())
    if "/" in name:
        inner, outer = name.split("/")
        return _two_level(inner, outer, collective, n, r, root, shards, group)
    if name == "ring":
        return _ring(collective, n, r, root, shards, group, per)
    if name == "shuffle":
        return _shuffle(collective, n, r, root, shards)
    if name == "one_device":
        return _one_device(collective, n, r, root)
    if name == "tree" and collective is not C.REDUCE_SCATTER or name == "rechd" and collective in (
            C.ALL_REDUCE, C.ALL_GATHER):
        plan = algorithms.build_plan(collective, name, n, r, root=root, shards=shards)
        return from_rounds(plan.den, plan.num_rounds, plan.rounds)
    if name == "tree":
        reduced, _ = tree_module.reduce_phase(n, r, 0)
        out = sent(others(n, 0), 1) if r == 0 else ()
        into = () if r == 0 else ((one(0), 1, False),)
        return concat(from_rounds(reduced.den, reduced.count, reduced.rounds), single(n, out, into))
    return _rechd(collective, n, r, root)


def _ring(collective, n, r, root, shards, group, per) -> Form:
    succ, pred = one((r + 1) % n), one((r - 1) % n)
    if collective is C.BROADCAST:  # a chain of k chunks: k rounds in, k out, one behind
        k = shards if shards > 0 else max(1, min(8, n))
        c = (r - root) % n
        return overlay(n - 2 + k, k, (c, c + k) if c <= n - 2 else (0, 0), ((succ, 1),),
                       (c - 1, c - 1 + k) if c >= 1 else (0, 0), ((pred, 1, False),))
    if collective is C.ALL_TO_ALL:
        return _pairwise(n, r, per)
    if collective is C.ALL_GATHER:
        return Form(n, n - 1, ((0, n - 1, ((succ, 1),), ((pred, 1, False),)),))
    S = max(shards, 1)
    rings = ring_module.Rings(n, S, group)
    sends, preds = [], []
    for s in range(S):  # sub-chunk s's ring: the same neighbours in every round
        at = rings.position(s, r)
        sends.append((one(rings.device(s, at + 1)), 1))
        preds.append(one(rings.device(s, at - 1)))
    den, out = n * S, tuple(sends)
    runs = ((0, n - 1, out, received(preds, 1, True)),)
    if collective is C.ALL_REDUCE:
        return Form(den, 2 * (n - 1), runs + ((n - 1, n - 1, out, received(preds, 1, False)),))
    if collective is C.REDUCE:  # every participant owns one chunk of each sub-chunk's ring
        if r == root:
            ending = single(den, (), received(others(n, root) * S, 1, False), n - 1)
        else:
            ending = single(den, ((one(root), 1),) * S, (), n - 1)
    else:  # reduce-scatter: chunk (p, s) is owned by device(s, p) and belongs to block p
        into = received([one(rings.device(s, r)) for s in range(S) if rings.device(s, r) != r],
                        1, False)
        out = sent([one(rings.position(s, r)) for s in range(S) if rings.position(s, r) != r], 1)
        ending = single(den, out, into, n - 1)
    return Form(den, n, runs + ending.runs)


def _pairwise(n: int, r: int, per: int) -> Form:
    """Round k - 1 sends to r + k and receives from r - k: runs end where either peer
    crosses the edge of r's host."""
    cuts = {1, n}
    if per:
        j = r % per
        cuts |= {per - j, n - j, j + 1, n - per + 1 + j}
    cuts_in = sorted(c for c in cuts if 1 <= c <= n)
    runs = tuple((a - 1, b - a, ((one((r + a) % n), 1),), ((one((r - a) % n), 1, False),))
                 for a, b in zip(cuts_in, cuts_in[1:]))
    return Form(n * n, n - 1, runs)


def _shuffle(collective, n, r, root, shards) -> Form:
    rest = others(n, r)
    if collective in (C.GATHER, C.SCATTER, C.BROADCAST):
        den = 1 if collective is C.BROADCAST else n
        outward = collective is not C.GATHER  # the root sends
        if r == root:
            return single(den, sent(rest, 1), ()) if outward else single(
                den, (), received(rest, 1, False))
        return single(den, (), ((one(root), 1, False),)) if outward else single(
            den, ((one(root), 1),), ())
    if collective in (C.ALL_GATHER, C.ALL_TO_ALL):
        return single(n if collective is C.ALL_GATHER else n * n, sent(rest, 1),
                      received(rest, 1, False))
    g = min(shards, n) if shards > 0 else n
    every = owners(0, g, n, g)

    def shard_of(p: int) -> int | None:
        j = -(-p * g // n)
        return j if j < g and j * n // g == p else None

    mine = shard_of(r)
    to_owners = but(every, mine) if mine is not None else [every]
    reduce = single(g, sent(to_owners, 1), received(rest, 1, True) if mine is not None else ())
    if collective is C.ALL_REDUCE:
        back = single(g, sent(rest, 1) if mine is not None else (), received(to_owners, 1, False))
        return concat(reduce, back)
    if collective is C.REDUCE:
        if r == root:
            theirs = shard_of(root)
            peers = but(every, theirs) if theirs is not None else [every]
            return concat(reduce, single(g, (), received(peers, 1, False)))
        return concat(reduce, single(g, ((one(root), 1),) if mine is not None else (), ()))
    D = lcm(g, n)
    W, K = D // g, D // n  # a shard's and a block's positions
    into = []
    for j in range(r * K // W, min(g, -(-(r + 1) * K // W))):
        a, b, owner = max(r * K, j * W), min((r + 1) * K, (j + 1) * W), j * n // g
        if a < b and owner != r:
            into.append((one(owner), b - a, False))
    out = spread(mine * W, (mine + 1) * W, K, r) if mine is not None else []
    return concat(reduce, single(D, tuple(out), tuple(into)))


def _one_device(collective, n, r, root) -> Form:
    def down(root: int) -> Form:  # the root sends its whole buffer to every other
        if r == root:
            return single(1, sent(others(n, root), 1), ())
        return single(1, (), ((one(root), 1, False),))

    if collective is C.BROADCAST:
        return down(root)
    if collective is C.ALL_GATHER:
        up = single(n, (), received(others(n, 0), 1, False)) if r == 0 else single(
            n, ((one(0), 1),), ())
        return concat(up, down(0))
    home = 0 if collective is C.REDUCE_SCATTER else root
    reduce = single(1, (), received(others(n, home), 1, True)) if r == home else single(
        1, ((one(home), 1),), ())
    if collective is C.ALL_REDUCE:
        return concat(reduce, down(root))
    if collective is C.REDUCE:
        return reduce
    blocks = single(n, sent(others(n, 0), 1), ()) if r == 0 else single(
        n, (), ((one(0), 1, False),))
    return concat(reduce, blocks)


def _rechd(collective, n, r, root) -> Form:
    """Reduce and reduce-scatter: the halving's plan, then its ``m`` owners' hand-out."""
    reduced = rechd_module.reduce_phase(n, r)
    m = reduced.den
    levels = m.bit_length() - 1
    halving = from_rounds(m, reduced.count, reduced.rounds)
    if collective is C.REDUCE:  # d < m owns position reversed(d) of m
        if r == root:
            return concat(halving, single(m, (), received(but(span(0, m), root), 1, False)))
        return concat(halving, single(m, ((one(root), 1),) if r < m else (), ()))
    D = lcm(m, n)
    W, K = D // m, D // n
    into = []
    for p in range(r * K // W, min(m, -(-(r + 1) * K // W))):
        a, b, owner = max(r * K, p * W), min((r + 1) * K, (p + 1) * W), _reversed(p, levels)
        if a < b and owner != r:
            into.append((one(owner), b - a, False))
    out = []
    if r < m:
        p = _reversed(r, levels)
        out = spread(p * W, (p + 1) * W, K, r)
    return concat(halving, single(D, tuple(out), tuple(into)))


def _reversed(p: int, bits: int) -> int:
    """``p``'s lowest ``bits`` bits in reverse order (halving's owner of position p)."""
    return int(format(p, f"0{bits}b")[::-1], 2) if bits else 0


def _two_level(inner, outer, collective, n, r, root, shards, L) -> Form:
    """Uniform groups of ``L`` consecutive participants, as ``two_level._sharded``."""
    G, (g, i) = n // L, divmod(r, L)
    base = g * L
    up = embed(form(C.REDUCE_SCATTER, inner, L, i), 1, base)
    if collective is C.REDUCE:
        home = root // L
        across = embed(form(C.REDUCE, outer, G, g, root=home, shards=shards), L, i, L)
        if r == root:
            down = single(L, (), received(but(span(home * L, home * L + L), root), 1, False))
        else:
            down = single(L, ((one(root), 1),) if g == home else (), ())
        return concat(up, across, down)
    across = embed(form(C.ALL_REDUCE, outer, G, g, shards=shards), L, i, L)
    if collective is C.ALL_REDUCE:
        return concat(up, across, embed(form(C.ALL_GATHER, inner, L, i), 1, base))
    # reduce-scatter: block r (of n, L positions each of n * L) from the member holding it
    lo, hi = r * L, r * L + L
    into = []
    for j in range(lo // n, min(L, -(-hi // n))):
        a, b = max(lo, j * n), min(hi, (j + 1) * n)
        if a < b and base + j != r:
            into.append((one(base + j), b - a, False))
    out = spread(i * n, (i + 1) * n, L, r, base, base + L)
    return concat(up, across, single(n * L, tuple(out), tuple(into)))
