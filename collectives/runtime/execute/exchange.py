"""All-to-all's executor: a plan whose positions name blocks, sent from one array into another.

An all-to-all plan places block ``(i, j)`` (what participant ``i`` sends to ``j``) at position
``i * n + j`` of a virtual buffer of ``n * n`` blocks, so the checker proves it like any other
plan. No participant holds that buffer: ``ExchangeRun`` reads a send's block ``(rank, j)``
from rows ``send[j]`` of the input and writes a receive's block ``(i, rank)`` into rows
``recv[i]`` of the output. Blocks may differ in size (``splits``); empty ones are not sent.
"""

from __future__ import annotations

from typing import Any

from ...algorithms.schedule import RankPlan


class ExchangeRun:
    """This rank's part of an all-to-all ``plan``: ``src`` and ``dst`` are flat arrays, and
    ``send_at[j]``/``recv_at[i]`` the element offsets of each block (``n + 1`` offsets each)."""

    __slots__ = ("dst", "k", "plan", "posted", "recv_at", "send_at", "seq", "src", "check",
                 "transport")
    knows_peers = True  # (pending_peers: the very ranks its round waits for)

    def __init__(self, plan: RankPlan, src: Any, dst: Any, send_at: list[int],
                 recv_at: list[int], transport: Any, *, seq: int, check: int):
        self.plan, self.src, self.dst = plan, src, dst
        self.send_at, self.recv_at = send_at, recv_at
        self.transport, self.seq, self.check = transport, seq, check
        self.k = 0
        self.posted: list | None = None

    def advance(self) -> bool:
        rounds = self.plan.rounds
        n = self.plan.size
        while self.k < len(rounds):
            index, sends, recvs = rounds[self.k]
            if self.posted is None:
                posted = []
                for _, (src,), lo, _, _ in recvs:
                    i = lo // n
                    a, b = self.recv_at[i], self.recv_at[i + 1]
                    if b > a:
                        posted.append((src, self.transport.recv(self.dst[a:b], src,
                                                                 self._tag(index, lo),
                                                                 in_place=True)))
                for dst, lo, _ in sends:
                    j = lo % n
                    a, b = self.send_at[j], self.send_at[j + 1]
                    if b > a:
                        posted.append((dst, self.transport.send(self.src[a:b], dst,
                                                                self._tag(index, lo))))
                self.posted = posted
            if not all(request.done() for _, request in self.posted):
                return False
            self.k += 1
            self.posted = None
        return True

    def _tag(self, index: int, position: int) -> tuple:
        return (self.seq, self.check, index, position)

    def pending_peers(self) -> list[int]:
        return sorted({peer for peer, request in self.posted or () if not request.done()})

    def abort(self) -> None:
        if self.posted:
            self.transport.cancel([request for _, request in self.posted])
