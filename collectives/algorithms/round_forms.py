"""One participant's rounds in closed form: runs of equal rounds, with peer sets for messages.

A ring's plan holds ``2 (n - 1)`` rounds and a shuffle's rounds ``n - 1`` messages each, but
what a round costs depends only on how many positions go to and come from which peers. So a
*form* gives a participant's rounds as runs ``(first, count, sends, recvs)``: ``count`` rounds
from round ``first`` on that cost the same, whatever their positions. Its messages:

* a peer set ``(ja, jb, a, b, num, den)`` stands for the participants ``a * (j * num // den)
  + b`` for ``ja <= j < jb``: one peer (``one(q)``), a range of ranks (``span``), the owners of
  a shuffle's shards (``j * n // g``), and their counterparts in every group of a two-level
  algorithm (``a`` the group size);
* ``sends``: ``(peers, width)``: a message of ``width`` positions to each peer;
* ``recvs``: ``(peers, width, reduce)``: a message from each (added where ``reduce``).

Widths are out of the form's ``den``, the plan's own, so that a round's load equals the plan's
bit for bit (``collectives.algorithms.closed_form`` prices forms). Plans of ``O(log n)`` steps
(the tree's, recursive halving-doubling's) are read from the plans themselves; the per-module
forms are in ``collectives.algorithms.module_forms``.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import lcm
from typing import NamedTuple

Peers = tuple[int, int, int, int, int, int]  # (ja, jb, a, b, num, den)
Run = tuple  # (first, count, sends, recvs)


class Form(NamedTuple):
    """``count`` rounds over positions out of ``den``; ``runs``: the participant's, in order."""

    den: int
    count: int  # type: ignore[assignment]  # a field named like tuple.count, as base.Phase
    runs: tuple[Run, ...]


def one(q: int) -> Peers:
    """Participant ``q`` alone."""
    return (0, 1, 1, q, 1, 1)


def span(lo: int, hi: int) -> Peers:
    """Participants ``lo .. hi - 1``."""
    return (lo, hi, 1, 0, 1, 1)


def owners(ja: int, jb: int, n: int, g: int) -> Peers:
    """The owners ``j * n // g`` of shards ``ja .. jb - 1`` (of ``g``, over ``n``)."""
    return span(ja, jb) if n == g else (ja, jb, 1, 0, n, g)


def size(peers: Peers) -> int:
    return peers[1] - peers[0]


def but(peers: Peers, j: int) -> list[Peers]:
    """``peers`` without index ``j`` (not the participant: the ``j`` of the set), non-empty parts."""
    ja, jb = peers[0], peers[1]
    if not ja <= j < jb:
        return [peers] if ja < jb else []
    return [p for p in ((ja, j, *peers[2:]), (j + 1, jb, *peers[2:])) if p[0] < p[1]]


def others(n: int, r: int) -> list[Peers]:
    """Every participant of ``n`` but ``r``."""
    return but(span(0, n), r)


def sent(peers: Sequence[Peers], width: int) -> tuple:
    return tuple((p, width) for p in peers)


def received(peers: Sequence[Peers], width: int, reduce: bool) -> tuple:
    return tuple((p, width, reduce) for p in peers)


def from_rounds(den: int, count: int, rounds) -> Form:
    """The form of a plan's (or a phase's) rounds, each a run of one."""
    runs = []
    for index, sends, recvs in rounds:
        runs.append((index, 1, tuple((one(d), hi - lo) for d, lo, hi in sends),
                     tuple((one(q), hi - lo, red) for _, srcs, lo, hi, red in recvs for q in srcs)))
    return Form(den, count, tuple(runs))


def overlay(count: int, den: int, sending: tuple[int, int], sends: tuple,
            receiving: tuple[int, int], recvs: tuple) -> Form:
    """Rounds ``[sending)`` send ``sends`` and rounds ``[receiving)`` receive ``recvs``: the
    runs where either happens."""
    cuts = sorted({*sending, *receiving})
    runs = []
    for lo, hi in zip(cuts, cuts[1:]):
        out = sends if sending[0] <= lo < sending[1] else ()
        into = recvs if receiving[0] <= lo < receiving[1] else ()
        if out or into:
            runs.append((lo, hi - lo, out, into))
    return Form(den, count, tuple(runs))


def single(den: int, sends: tuple, recvs: tuple, index: int = 0) -> Form:
    """One round (dropped where it holds nothing, as plans drop it)."""
    runs = ((index, 1, sends, recvs),) if sends or recvs else ()
    return Form(den, index + 1, runs)


def rescale(form: Form, den: int) -> Form:
    """The same rounds with widths out of ``den`` (a multiple of the form's)."""
    k = den // form.den
    if k == 1:
        return form
    runs = tuple((first, count, tuple((p, w * k) for p, w in sends),
                  tuple((p, w * k, red) for p, w, red in recvs))
                 for first, count, sends, recvs in form.runs)
    return Form(den, form.count, runs)


def concat(*forms: Form) -> Form:
    """Forms one after another, with a common ``den``."""
    den = lcm(*(f.den for f in forms))
    runs: list[Run] = []
    offset = 0
    for form in forms:
        runs.extend((first + offset, count, sends, recvs)
                     for first, count, sends, recvs in rescale(form, den).runs)
        offset += form.count
    return Form(den, offset, tuple(runs))


def embed(form: Form, a: int, b: int, den: int = 1) -> Form:
    """``form`` of a sub-group whose participant ``q`` is ``a * q + b``, its buffer one of
    ``den`` equal ranges of the whole (as ``base.embedded`` places it)."""
    def move(p: Peers) -> Peers:
        return (p[0], p[1], p[2] * a, p[3] * a + b, p[4], p[5])

    runs = tuple((first, count, tuple((move(p), w) for p, w in sends),
                  tuple((move(p), w, red) for p, w, red in recvs))
                 for first, count, sends, recvs in form.runs)
    return Form(form.den * den, form.count, runs)


def spread(lo: int, hi: int, width: int, skip: int, first: int = 0, last: int | None = None
           ) -> list[tuple[Peers, int]]:
    """Positions ``[lo, hi)`` cut along blocks of ``width`` positions (block ``p`` belongs to
    participant ``p``), as ``(peers, width)`` messages: every block they overlap but ``skip``'s,
    within blocks ``first .. last - 1``. Inner blocks are whole: one peer range for them."""
    a = max(lo // width, first)
    b = -(-hi // width) if last is None else min(-(-hi // width), last)
    if a >= b:
        return []

    def part(p: int) -> int:
        return min(hi, (p + 1) * width) - max(lo, p * width)

    out = [(one(p), part(p)) for p in sorted({a, b - 1}) if p != skip and part(p) > 0]
    if b - a > 2:
        out.extend((peers, width) for peers in but(span(a + 1, b - 1), skip)
                   if size(peers))
    return out


def in_range(peers: Peers, lo: int, hi: int) -> int:
    """How many of ``peers`` lie in ``[lo, hi)``."""
    ja, jb, a, b, num, den = peers

    def first_at_least(x: int) -> int:  # the least j whose participant is >= x
        u = -(-(x - b) // a)  # the least (j * num // den) that reaches x
        return -(-u * den // num)

    return max(0, min(jb, first_at_least(hi)) - max(ja, first_at_least(lo)))


def distinct(peers: Sequence[Peers]) -> int:
    """How many participants ``peers`` hold together: ranges merged, other sets counted as
    apart (the forms never repeat a participant across sets of other kinds)."""
    ranges, rest = [], 0
    for p in set(peers):
        if p[2] == 1 and p[4] == p[5]:
            ranges.append((p[0] + p[3], p[1] + p[3]))
        else:
            rest += size(p)
    total, end = 0, None
    for lo, hi in sorted(ranges):
        if end is None or lo >= end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total + rest
