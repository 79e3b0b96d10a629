"""A transport's native collective as the data stage of an operation, started in its turn.

Native collectives (MPI's ``Iallreduce``, ...) are matched by the order in which ranks issue
them, not by tags, so they must start in call order on every rank even when an earlier call
is still agreeing on its arguments: ``NativeStage`` waits for its turn.

A run that issues more collectives as it advances (``holds_turn = True``: the NCCL two-level
path issues an MPI all-reduce per chunk as each lands on the host, then NCCL's all-gather)
keeps the turn until it finishes. Its later collectives depend on when each rank's host sees
its copies land, so a next native call started meanwhile would meet them in a different
order on different ranks: two NCCL collectives swapped on one stream deadlock, and two MPI
all-reduces swapped on one communicator mix their data.

Where the transport's data channel shares that order (``schedules_in_native_order``: NCCL,
whose send/recv and collectives run one after another on one stream), a schedule's rounds are
placed in it too: ``ScheduleInTurn`` posts a plan's first round in the call's turn and
keeps the turn until its last round is posted. Otherwise a rank whose agreement on a new
call finished early would put the call's rounds on its stream before a later call's NCCL
collective, and a rank still agreeing would put them after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..ops import ReduceOp
from .calls import Call

if TYPE_CHECKING:
    from .transport import NativeRun


class NativeStage:
    """Start a native collective in its turn, then advance it to completion."""

    __slots__ = ("call", "dst", "done", "engine", "holding", "native", "op", "run", "seq",
                 "src", "turn")

    def __init__(self, engine: Any, native: Any, call: Call, src: Any, dst: Any,
                 op: ReduceOp | None, seq: int, turn: int | None = None):
        self.engine, self.native, self.call = engine, native, call
        self.src, self.dst, self.op, self.seq = src, dst, op, seq
        # the place in the native start order: reserved now, or when the call was issued
        self.turn = engine.reserve_turn() if turn is None else turn
        self.run: NativeRun | None = None
        self.holding = False  # started, and keeps the turn until it finishes
        self.done = False

    def advance(self) -> bool:
        if self.done:
            return True
        engine = self.engine
        if self.run is None:
            if not engine.in_turn(self.turn):
                return False  # an earlier call has not issued its native collective yet
            self.run = self.native.start(self.call, self.src, self.dst, self.op, self.seq)
            self.holding = self.run.holds_turn
            if not self.holding:
                engine.pass_turn()
        done = self.run.advance()
        if done and self.holding:
            self.holding = False
            engine.pass_turn()  # its last collective is issued: the next may start
        if done:  # the buffers are the caller's again (a fused bucket is reused only where
            self.done = True  # nothing refers to it, algorithms/reuse.py)
            self.run = self.src = self.dst = None
        return done

    def abort(self) -> None:
        if self.done:
            return
        if self.run is None or self.holding:  # later calls must not wait for it
            self.holding = False
            self.engine.release_turn(self.turn)
        abandon = getattr(self.run, "abandon", None)  # (what the transport may still write
        if abandon is not None:  # into stays alive: ``NativeRun``)
            abandon()

    def pending_peers(self) -> list[int]:
        if self.done:
            return []
        if self.run is not None:
            return self.run.pending_peers()
        return [r for r in range(self.engine.size) if r != self.engine.rank]


class ScheduleInTurn:
    """A plan's run (``SpmdRun``, ``ExchangeRun``) whose rounds start in the call's native turn and keep it
    until the last round is posted (for data channels in the natives' order)."""

    __slots__ = ("engine", "finished", "run", "started", "trace", "turn")

    def __init__(self, engine: Any, run: Any, turn: int | None = None):
        self.engine, self.run = engine, run
        self.turn = engine.reserve_turn() if turn is None else turn
        self.trace = getattr(run, "trace", None)  # (the timeline names the stage after the run's plan)
        self.started = self.finished = False

    def advance(self) -> bool:
        if not self.started:
            if not self.engine.in_turn(self.turn):
                return False  # an earlier call's collective or rounds come first
            self.started = True
        done = self.run.advance()
        if done and not self.finished:
            self.finished = True
            self.engine.pass_turn()  # every round is posted: the next may start
        return done

    def abort(self) -> None:
        if not self.finished:  # later calls must not wait for it
            self.finished = True
            self.engine.release_turn(self.turn)
        self.run.abort()

    def pending_peers(self) -> list[int]:
        if self.started:
            return self.run.pending_peers()
        return [r for r in range(self.engine.size) if r != self.engine.rank]

    @property
    def knows_peers(self) -> bool:
        return self.started and getattr(self.run, "knows_peers", False)
