"""Reading the input where it lies: which steps of a rank's plan take the caller's input
directly, so that the SPMD executor never copies the whole input into its working buffer.

A plan runs in place on the working buffer. When the input is another array, copying it in
first costs a pass over memory the plan may not need: at two ranks a ring all-reduce sends
half of the input as it is, reduces the other half with a peer's data (which can read the
input and write the buffer in one pass) and receives the first half back, overwriting it. So
each range is *fresh* (the buffer does not hold it yet: its data is in the input) until a step
writes it:

* a send of a fresh range sends it from the input;
* the first reduce into a fresh range combines the input's range with what arrived, into the
  buffer (the same operands in the same order as after a copy: the same bits);
* a received copy overwrites its range;
* a range only partly fresh is filled from the input first, and whatever is still fresh at
  the end is filled last (a rank's block that no step touched).

The annotation depends only on the plan's rounds (offsets for one buffer length), so it is
computed once per rounds object and cached.
"""

from __future__ import annotations

FIRST_TOUCH_CACHE = 256  # annotated rounds kept (plans cache their offsets per length too)

_cache: dict[int, tuple] = {}


class Fresh:
    """The ranges ``[a, b)`` of the buffer still fresh, as sorted disjoint intervals."""

    __slots__ = ("spans",)

    def __init__(self, length: int):
        self.spans = [(0, length)] if length > 0 else []

    def state(self, a: int, b: int) -> str:
        """"fresh" (all of it), "written" (none of it) or "mixed"."""
        covered = 0
        for lo, hi in self.spans:
            if hi <= a or lo >= b:
                continue
            covered += min(hi, b) - max(lo, a)
        if covered == 0:
            return "written"
        return "fresh" if covered == b - a else "mixed"

    def take(self, a: int, b: int) -> list[tuple[int, int]]:
        """Mark ``[a, b)`` written; return the parts of it that were fresh."""
        taken, kept = [], []
        for lo, hi in self.spans:
            if hi <= a or lo >= b:
                kept.append((lo, hi))
                continue
            taken.append((max(lo, a), min(hi, b)))
            if lo < a:
                kept.append((lo, a))
            if hi > b:
                kept.append((b, hi))
        self.spans = kept
        return taken


def annotate(rounds: tuple, length: int) -> tuple[tuple, tuple]:
    """``(rounds, last_fills)``: each round as ``(index, sends, recvs, fills)`` where sends
    are ``(dst, a, b, lo, from_input)``, receives ``(srcs, a, b, reduce, lo, from_input)``
    and ``fills`` the ranges to copy from the input before the round is posted;
    ``last_fills`` what to copy once every round is done."""
    key = id(rounds)
    hit = _cache.get(key)
    if hit is not None and hit[0] is rounds and hit[1] == length:
        return hit[2]
    fresh = Fresh(length)
    out = []
    for index, sends, recvs in rounds:
        fills: list[tuple[int, int]] = []
        marked_sends = []
        for dst, a, b, lo in sends:  # sends read the buffer as it was before this round
            state = fresh.state(a, b)
            if state == "mixed":
                fills += fresh.take(a, b)
            marked_sends.append((dst, a, b, lo, state == "fresh"))
        marked_recvs = []
        for srcs, a, b, reduce, lo in recvs:
            state = fresh.state(a, b)
            taken = fresh.take(a, b)  # written by this round
            if reduce and state == "mixed":
                fills += taken
            marked_recvs.append((srcs, a, b, reduce, lo, reduce and state == "fresh"))
        out.append((index, tuple(marked_sends), tuple(marked_recvs), tuple(fills)))
    result = (tuple(out), tuple(fresh.spans))
    if len(_cache) >= FIRST_TOUCH_CACHE:
        _cache.clear()
    _cache[key] = (rounds, length, result)
    return result
