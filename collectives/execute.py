"""Executors: run one schedule over a transport, in either way of calling.

* ``run_multi_device``: one controller holds every participant's buffer and performs every
  step itself. Because every step is element-wise (see ``schedule``), the whole schedule can
  run tile by tile: each cache-sized tile goes through all rounds while it is hot, and tiles
  run in parallel on the backend's workers. So any algorithm reads each input once and writes
  each output once from main memory.
* ``run_spmd``: each rank performs only its own steps, round by round: post every send of the
  round, then receive and combine each incoming range, then wait for the sends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from .ops import ReduceOp, accumulate
from .schedule import Schedule, element_ranges


class DeviceBackend(Protocol):
    """What the multi-device API needs from a backend that holds every buffer."""

    cost_model: object  # a collectives.select.CostModel

    def empty_like(self, like, shape, dtype): ...
    def empty_on(self, device, like, shape, dtype): ...
    def concatenate(self, stacked, axis): ...
    def copy(self, dst, src) -> None: ...
    def combine(self, op: ReduceOp, dst, srcs: Sequence) -> None: ...
    def combine_into(self, op: ReduceOp, dst, first, srcs: Sequence) -> None: ...
    def map_parallel(self, fn: Callable[[int, int], None], length: int, itemsize: int) -> None: ...


class Request(Protocol):
    def wait(self): ...


class PointToPoint(Protocol):
    """What the SPMD executor needs from a transport: non-blocking sends and receives.

    ``irecv(...).wait()`` returns an array holding the peer's data (possibly a view of the
    peer's own buffer); ``release`` tells the transport the executor is done with it.
    """

    rank: int
    size: int
    what: str  # the collective in progress, for error messages
    timeout: float  # seconds any wait may take before CollectiveTimeoutError

    def agree(self, key, item, timeout: float) -> list:
        """Every rank's ``item`` posted under ``key``, in rank order (small Python objects)."""
        ...

    def isend(self, buf: np.ndarray, dst: int, tag: tuple) -> Request: ...
    def irecv(self, like: np.ndarray, src: int, tag: tuple) -> Request: ...
    def release(self, request: Request) -> None: ...
    def waitall(self, requests: Sequence[Request]) -> None: ...


def _combiners(backend, op: ReduceOp, accumulation_fn):
    """``combine(dst, srcs)``: dst = op(dst, *srcs); ``combine_into(dst, first, srcs)``: dst =
    op(first, *srcs). ``accumulation_fn(list) -> array`` replaces the op where given."""
    if accumulation_fn is None:
        return (lambda dst, srcs: backend.combine(op, dst, srcs),
                lambda dst, first, srcs: backend.combine_into(op, dst, first, srcs))
    return (lambda dst, srcs: backend.copy(dst, accumulation_fn([dst, *srcs])),
            lambda dst, first, srcs: backend.copy(dst, accumulation_fn([first, *srcs])))


def run_multi_device(schedule: Schedule, inputs: Sequence, work: Sequence, op: ReduceOp,
                     backend: DeviceBackend, *, granule: int = 1,
                     input_offsets: Sequence[int] | None = None,
                     accumulation_fn=None) -> None:
    """Run ``schedule`` on flat ``work`` buffers, first filling them from flat ``inputs``.

    ``input_offsets[p]`` is where participant p's input lands in its work buffer (all-gather
    puts it at block p); by default inputs fill the whole buffer. ``inputs[p]`` may be None
    (a broadcast's non-roots bring nothing).
    """
    length = len(work[0])
    units = length // granule if granule else 0
    spans = element_ranges(schedule, units)
    combine, combine_into = _combiners(backend, op, accumulation_fn)
    plan = [[(s, lo * granule, hi * granule) for s, (lo, hi) in zip(rnd, bounds) if hi > lo]
            for rnd, bounds in zip(schedule.rounds, spans)]
    starts = list(input_offsets) if input_offsets is not None else [0] * len(work)

    # Whole-buffer inputs are not copied in up front: until a participant's tile is first
    # written, reads of it go straight to its input, and its first reduce reads the input as
    # the left operand. That saves one full pass over memory per participant.
    lazy = input_offsets is None and all(x is not None for x in inputs)

    def settle(rnd, a, b, ready):
        # A participant whose tile this round only partly wrote would mix work and input:
        # copy the rest of its input in now, so from here on its work tile is whole.
        written: dict[int, list[tuple[int, int]]] = {}
        for step, lo, hi in rnd:
            lo, hi = max(lo, a), min(hi, b)
            if lo < hi and not ready[step.dst]:
                written.setdefault(step.dst, []).append((lo, hi))
        for p, spans in written.items():
            at = a
            for lo, hi in sorted(spans):
                if at < lo:
                    backend.copy(work[p][at:lo], inputs[p][at:lo])
                at = max(at, hi)
            if at < b:
                backend.copy(work[p][at:b], inputs[p][at:b])
            ready[p] = True

    def run_tile(a: int, b: int) -> None:
        ready = [x is w for x, w in zip(inputs, work)] if lazy else [True] * len(work)
        if not lazy:
            for p, (x, w) in enumerate(zip(inputs, work)):
                if x is None or x is w:
                    continue
                lo, hi = max(a, starts[p]), min(b, starts[p] + len(x))
                if lo < hi:
                    backend.copy(w[lo:hi], x[lo - starts[p]:hi - starts[p]])
        for rnd in plan:
            for step, lo, hi in rnd:
                lo, hi = max(lo, a), min(hi, b)
                if lo >= hi:
                    continue
                srcs = [(work[q] if ready[q] else inputs[q])[lo:hi] for q in step.srcs]
                dst = work[step.dst][lo:hi]
                if step.reduce:
                    if ready[step.dst]:
                        combine(dst, srcs)
                    else:
                        combine_into(dst, inputs[step.dst][lo:hi], srcs)
                else:
                    backend.copy(dst, srcs[0])
            if lazy:
                settle(rnd, a, b, ready)
        for p in range(len(work)):
            if not ready[p]:  # never written: the result is the input itself
                backend.copy(work[p][a:b], inputs[p][a:b])

    backend.map_parallel(run_tile, length, work[0].itemsize if length else 1)


def run_spmd(schedule: Schedule, buf: np.ndarray, op: ReduceOp, transport: PointToPoint,
             *, granule: int = 1, seq: int = 0) -> None:
    """Run this rank's part of ``schedule`` on its flat working buffer ``buf`` in place.

    Optional transport hooks: ``irecv_into(dst, src, tag)`` receives a copy step straight
    into place (a round never reads a range it writes); ``abandon(requests)`` withdraws the
    receives of a round that failed, so nothing lands in ``buf`` afterwards.
    """
    rank = transport.rank
    units = len(buf) // granule if granule else 0
    spans = element_ranges(schedule, units)
    receive_into = getattr(transport, "irecv_into", None)
    for r, (rnd, bounds) in enumerate(zip(schedule.rounds, spans)):
        receives, sends = [], []
        try:
            for i, (step, (lo, hi)) in enumerate(zip(rnd, bounds)):
                lo, hi = lo * granule, hi * granule
                if hi <= lo:
                    continue
                if step.dst == rank:
                    tag = (seq, r, i)
                    if not step.reduce and receive_into is not None:
                        requests = [receive_into(buf[lo:hi], step.srcs[0], tag)]
                    else:
                        requests = [transport.irecv(buf[lo:hi], q, tag) for q in step.srcs]
                    receives.append((step, lo, hi, requests))
                elif rank in step.srcs:
                    sends.append(transport.isend(buf[lo:hi], step.dst, (seq, r, i)))
            for step, lo, hi, requests in receives:
                dst = buf[lo:hi]
                if step.reduce:
                    # The schedule's order of operands, so every rank computes the same bits.
                    accumulate(op, dst, (req.wait() for req in requests))
                elif receive_into is not None:
                    requests[0].wait()
                else:
                    np.copyto(dst, requests[0].wait())
                for req in requests:
                    transport.release(req)
            transport.waitall(sends)
        except BaseException:
            abandon = getattr(transport, "abandon", None)
            if abandon is not None:
                abandon([req for *_, requests in receives for req in requests])
            raise
