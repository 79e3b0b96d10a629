"""The SPMD executor: one rank's plan over point-to-point messages, as a state machine.

A rank runs its rounds in order. Each round it posts every receive, then every send, then
combines each received range as it arrives (a reduce step's sources strictly in the plan's
order, so every rank computes the same bits) and finishes the round once its sends are done.
``SpmdRun.advance`` does whatever can be done now and returns; whoever waits for the
collective (a blocking call, ``Work.wait()``, a progress thread) calls it again until it
reports completion. So blocking and asynchronous calls are one and the same object.

Message tags are ``(seq, check, round, position)``: the call's sequence number on the
communicator, the call signature's check value (a mismatch between ranks never pairs up
silently), the round, and the range's position, which names one message between two ranks in
one round. Transports map them onto what they have (MPI: an integer tag and MPI's in-order
matching between two ranks).
"""

from __future__ import annotations

from typing import Any, Protocol

from ...algorithms.schedule import RankPlan
from ...arrays import ArrayBackend
from ...ops import ReduceOp
from ...timeline import record_calls, recorder
from .first_touch import annotate


class Request(Protocol):
    """A posted send or receive."""

    data: Any  # a receive's data, once done (the receive buffer, scratch, or the peer's memory)

    def done(self) -> bool:
        """Whether it has completed (raises the transport's error if it failed)."""
        ...


class PointToPoint(Protocol):
    """What the SPMD executor needs from a transport."""

    rank: int
    size: int
    arrays: ArrayBackend

    def send(self, data: Any, dst: int, tag: tuple) -> Request:
        """Post a send of ``data``, which stays untouched until the request is done."""
        ...

    def recv(self, into: Any, src: int, tag: tuple, *, in_place: bool) -> Request:
        """Post a receive of ``into``'s shape and dtype. With ``in_place`` the data lands in
        ``into``; otherwise wherever the transport likes (``request.data``), readable until
        ``release``."""
        ...

    def release(self, request: Request) -> None:
        """The executor is done reading a receive's data."""
        ...

    def cancel(self, requests: list) -> None:
        """Withdraw receives of a run that failed, so nothing lands in its buffer later."""
        ...


class SpmdRun:
    """This rank's part of ``plan`` on its flat working buffer ``buf``, in place."""

    __slots__ = ("arrays", "buf", "check", "k", "last_fills", "op", "posted", "rounds", "sends",
                 "seq", "src", "trace", "transport")
    knows_peers = True  # (pending_peers: the very ranks its round waits for)

    def __init__(self, plan: RankPlan, buf: Any, op: ReduceOp | None, transport: PointToPoint, *,
                 granule: int = 1, seq: int = 0, check: int = 0, src: Any = None):
        """``src``: the input, when it is not already in ``buf`` (same length, no shared
        memory): steps read it where it lies (``.first_touch``) instead of a copy."""
        units = len(buf) // granule if granule else 0
        self.rounds, self.last_fills = annotate(plan.offsets(units, granule), len(buf))
        self.src = src
        if src is None:
            self.last_fills = ()
        self.buf, self.op, self.transport = buf, op, transport
        self.arrays = transport.arrays
        self.seq, self.check = seq, check
        self.k = 0
        # this round's receives, [srcs, a, b, reduce, requests, sources combined so far,
        # whether the first combines with the input], and its sends, (dst, request)
        self.posted: list | None = None
        self.sends: list = []
        self.trace = record_calls.RunTrace(plan, buf, transport) if recorder.ON else None

    def advance(self) -> bool:
        """Do what can be done without waiting; True once every round is complete."""
        rounds = self.rounds
        while self.k < len(rounds):
            if self.posted is None:
                if self.trace is not None:
                    self.trace.posted(self)
                self._post_round(rounds[self.k])
            if not self._finish_round():
                if self.trace is not None:
                    self.trace.blocked(self)
                return False
            if self.trace is not None:
                self.trace.round_done(self)
            self.k += 1
            self.posted = None
        if self.last_fills:  # ranges no step wrote: this rank's input as it is
            self._fill(self.last_fills)
            self.last_fills = ()
        if self.buf is not None:  # done: the buffers are the caller's again (a fused bucket
            self.buf = self.src = None  # is reused only where nothing refers to it, reuse.py)
            self.sends = []
        return True

    def _fill(self, ranges) -> None:
        buf, src, copy = self.buf, self.src, self.arrays.copy
        for a, b in ranges:
            copy(buf[a:b], src[a:b])

    def _post_round(self, rnd) -> None:
        index, sends, recvs, fills = rnd
        if fills and self.src is not None:
            self._fill(fills)
        transport, buf, seq, check = self.transport, self.buf, self.seq, self.check
        src = self.src if self.src is not None else buf
        posted = []
        for srcs, a, b, reduce, lo, first in recvs:
            tag = (seq, check, index, lo)
            in_place = not reduce and len(srcs) == 1
            requests = [transport.recv(buf[a:b], q, tag, in_place=in_place) for q in srcs]
            # first: the buffer does not hold this range yet: the first source combines with
            # the input's range (the same operands in the same order as after a copy)
            posted.append([srcs, a, b, reduce, requests, 0, first and self.src is not None])
        self.posted = posted
        self.sends = [(dst, transport.send((src if fresh else buf)[a:b], dst,
                                           (seq, check, index, lo)))
                      for dst, a, b, lo, fresh in sends]

    def _finish_round(self) -> bool:
        transport, arrays = self.transport, self.arrays
        complete = True
        assert self.posted is not None  # _post_round posted this round
        for entry in self.posted:
            srcs, a, b, reduce, requests, nxt, first = entry
            if nxt == len(requests):
                continue
            if not reduce:  # a copy step, received in place
                if requests[0].done():
                    entry[5] = 1
                else:
                    complete = False
                continue
            # reduce: combine sources strictly in order, each as soon as it (and all before
            # it) has arrived
            assert self.op is not None  # (plans without an op have no reduce steps)
            dst = self.buf[a:b]
            while nxt < len(requests) and requests[nxt].done():
                if self.trace is not None:
                    self.trace.reduce_begins()
                if first and nxt == 0:
                    arrays.combine_into(self.op, dst, self.src[a:b], (requests[0].data,))
                else:
                    arrays.combine(self.op, dst, (requests[nxt].data,))
                if self.trace is not None:
                    self.trace.reduce_ends(srcs[nxt], b - a)
                transport.release(requests[nxt])
                nxt += 1
            entry[5] = nxt
            if nxt < len(requests):
                complete = False
        if not complete:
            return False
        for _, request in self.sends:
            if not request.done():
                return False
        return True

    def pending_peers(self) -> list[int]:
        """The ranks this run still waits for (for timeout messages)."""
        if self.posted is None:
            return []
        waiting = {q for srcs, _, _, _, _, nxt, _ in self.posted for q in srcs[nxt:]}
        waiting.update(dst for dst, request in self.sends if not request.done())
        return sorted(waiting)

    def abort(self) -> None:
        """Withdraw this round's receives (the run failed)."""
        if self.posted:
            requests = [r for entry in self.posted for r in entry[4][entry[5]:]]
            self.transport.cancel(requests)
