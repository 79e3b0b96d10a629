"""A transport's native collective as the data stage of an operation, started in its turn.

Native collectives (MPI's ``Iallreduce``, ...) are matched by the order in which ranks issue
them, not by tags, so they must start in call order on every rank even when an earlier call
is still agreeing on its arguments: :class:`NativeStage` waits for its turn.

A run that issues more collectives as it advances (``holds_turn = True``: the NCCL two-level
path issues an MPI all-reduce per chunk as each lands on the host, then NCCL's all-gather)
keeps the turn until it finishes. Its later collectives depend on when each rank's host sees
its copies land, so a next native call started meanwhile would meet them in a different
order on different ranks: two NCCL collectives swapped on one stream deadlock, and two MPI
all-reduces swapped on one communicator mix their data.
"""

from __future__ import annotations

from typing import Any

from ..ops import ReduceOp
from .calls import Call


class NativeStage:
    """Start a native collective in its turn, then advance it to completion."""

    __slots__ = ("call", "dst", "engine", "holding", "native", "op", "run", "seq", "src",
                 "turn")

    def __init__(self, engine: Any, native: Any, call: Call, src: Any, dst: Any, op: ReduceOp,
                 seq: int, turn: int | None = None):
        self.engine, self.native, self.call = engine, native, call
        self.src, self.dst, self.op, self.seq = src, dst, op, seq
        # the place in the native start order: reserved now, or when the call was issued
        self.turn = engine.reserve_turn() if turn is None else turn
        self.run = None
        self.holding = False  # started, and keeps the turn until it finishes

    def advance(self) -> bool:
        engine = self.engine
        if self.run is None:
            while engine.native_issued in engine.native_skipped:
                engine.native_skipped.discard(engine.native_issued)
                engine.native_issued += 1
            if engine.native_issued != self.turn:
                return False  # an earlier call has not issued its native collective yet
            self.run = self.native.start(self.call, self.src, self.dst, self.op, self.seq)
            self.holding = bool(getattr(self.run, "holds_turn", False))
            if not self.holding:
                engine.native_issued += 1
        done = self.run.advance()
        if done and self.holding:
            self.holding = False
            engine.native_issued += 1  # its last collective is issued: the next may start
        return done

    def abort(self) -> None:
        if self.run is None or self.holding:  # later calls must not wait for it
            self.holding = False
            self.engine.release_turn(self.turn)

    def pending_peers(self) -> list[int]:
        pending = getattr(self.run, "pending_peers", None)
        if pending is not None:
            return pending()
        return [r for r in range(self.engine.size) if r != self.engine.rank]
