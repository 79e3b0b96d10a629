"""The fast path on the timeline (``runtime.hot_path``): a call as one complete event on its
communicator's track (``record_calls``), or, where it must wait after all, as a span that the
operation that waits records its waits inside, and ends."""

from __future__ import annotations

from typing import Any

from . import recorder as rec
from .record_calls import OpTrace, describe, track


def fast_waits(fast: Any, seq: int, t0: int, op: Any) -> None:
    """A call of the fast path that must wait after all: its span opens (from ``t0``) and the
    operation that waits records its waits inside it, and ends it."""
    where = track(fast.comm)
    name, args = describe(fast.call, fast.comm.size)
    op.trace = OpTrace(where, where.tid, False, seq, args)
    op.trace.begin(name, "call", (args, f'"call":{seq},"path":"fast"'), ts=max(t0, where.end))
    where.fast = seq


def fast_path(fast: Any, seq: int, t0: int) -> None:
    """A call of the fast path, as one span."""
    where = track(fast.comm)
    if where.fast == seq:  # the operation that waited ended its span
        where.fast = 0
        return
    name, args = describe(fast.call, fast.comm.size)
    ts, t0 = rec.now(), max(t0, where.end)
    rec.complete(where.pid, where.tid, name, "call", t0, ts - t0,
                 (args, f'"call":{seq},"path":"fast"'))
    where.end = ts
