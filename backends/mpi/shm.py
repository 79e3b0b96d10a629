"""All-reduce through MPI-3 shared memory, for ranks that all share one node (``"shm"``).

The payload goes in rounds of at most ``tuning.SHM_ROUND_BYTES``, through a shared window
(``Win.Allocate_shared``) of two buffers per rank, used by alternate rounds; a buffer holds
one slot per rank, at the same bytes for every call, so a slot's role never changes. In round
k every rank copies the parts of its input that other ranks reduce into their slots of its
buffer; after a barrier each rank reduces its ``1/n`` slice of the round from its own input
and every other rank's buffer, in rank order, into its own slot (publishing it) and its
result, a cache-sized block at a time; after the next barrier it copies the other slices out
of their owners' slots. One barrier serves two rounds: after barrier k a rank copies round
k-1's slices out, reduces round k and copies round k+1 in, so a call of r rounds takes r + 1
barriers. Where ranks may read each other's memory (``shm_direct``), large payloads skip the
copy-in: the reduction reads the peers' inputs where they lie. Where every rank's input and
result lie in arrays every rank maps (``shm_shared``: ``Communicator.shared_empty``), the call
is one round through them: each rank reduces its slice from the inputs where they lie and
writes it into every rank's result, and the barrier after that ends the call. Each slice is
reduced once, by its owner, in rank order (with NumPy: NaN propagates, every dtype works), so
every rank holds the same bits.

Why the buffers never clash: round k's copy-in writes the slots others reduce, of buffer
k % 2, after barrier k-1; the others are then past round k-2's reduce (before barrier k-1)
and read only the owners' slots of buffer k % 2 (round k-2's copy-out), which round k's
copy-in leaves alone; the owner overwrites its slot in round k's reduce, after barrier k,
when every rank has copied round k-2 out. A call's last barrier orders its last copy-out
before the next call's first reduce the same way (rounds are numbered across calls).

The first barrier is an ``Ibarrier`` on the node's communicator, issued through the lane like
every native collective, so concurrent calls keep their order; each buffer starts with a
header holding the call's check value, so ranks that disagree about the call all see it
there and raise. Past it every rank is in the same call, and the later barriers are flags in
the window (each rank's latest round number): MPICH may deliver a completed barrier's message
only at the sender's next MPI call, which a rank busy reducing does not make. A wait between
rounds spins (``tuning.SHM_SPIN_SECONDS``, none on an oversubscribed node) before the
transport's waiting policy may yield. The window is made, at a barrier every rank has passed,
by the first call, and stays until ``free()``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from collectives.arrays import NUMPY
from collectives.errors import CollectiveMismatchError
from collectives.ops import ReduceOp
from collectives.runtime.calls import Call

from . import shm_direct, shm_shared, tuning
from .runs import STALL_POLLS, note_stall
from .shm_window import FLAG, HEADER, SharedWindow


class ShmRun:
    """One shared-memory all-reduce: [grow,] copy in, then per barrier: copy the previous
    round out, reduce this one, copy the next one in (module docstring)."""

    __slots__ = ("barrier", "call", "direct", "dst", "lane", "natives", "op", "phase", "places",
                 "polls", "reads", "round", "rounds", "seq", "shm", "since", "slot", "span", "src",
                 "start_round", "views")
    holds_turn = False  # (``collectives.runtime.transport.NativeRun``)

    def __init__(self, shm: SharedWindow, call: Call, src: Any, dst: Any, op: ReduceOp,
                 seq: int, natives: Any):
        self.shm, self.call, self.op, self.seq = shm, call, op, seq
        self.natives, self.lane = natives, natives.lane
        # in flight: peers asking what this rank runs hear of it, and a stall asks them
        # (``runs.note_stall``), as the other native runs do
        natives.inflight[seq] = call
        self.polls, self.since = 0, 0.0
        self.src = dst if src is None else src
        self.dst = dst
        self.phase = "in"  # or "growing", decided when this run reaches the head of the lane
        self.barrier: Any = None
        self.slot = shm.slot_bytes() // dst.itemsize  # elements of a rank's slice of a round
        self.span = self.slot * shm.n  # elements per round
        self.rounds = max(1, -(-len(dst) // self.span))
        # peers' inputs read where they lie (shm_direct), a choice every rank makes alike
        least = tuning.SHM_DIRECT_BYTES
        self.direct = shm.direct and least is not None and dst.nbytes >= least
        self.reads: shm_direct.PeerInputs | None = None
        # input and result in shared arrays: one round through them (module docstring)
        self.places = shm_shared.place_of(shm.shared, self.src, dst)
        self.views: shm_shared.SharedRun | None = None
        if self.places is not None:
            self.direct, self.span, self.rounds = False, len(dst), 1
        self.round = 0  # the round reduced after the next barrier
        self.start_round = 0  # the window's round number of this call's round 0
        self.lane.join(self)  # (may issue at once: every field is set before)


    def _barrier(self) -> None:
        self.shm.win.Sync()  # our stores are visible before the peers pass the barrier
        self.barrier = self.shm.node.Ibarrier()

    def issue(self) -> bool:
        """The lane's side: issue the first barrier, once this call's first round is in."""
        shm = self.shm
        if self.phase == "in" and not shm.fits():
            self.barrier = shm.node.Ibarrier()  # every rank is done with the old window
            self.phase = "growing"
            return False
        if self.phase == "in":
            self.start_round = shm.calls
            shm.calls += self.rounds + 1  # (the last barrier counts as a round: parity moves on)
            header = self._header(shm.me, 0)
            header[0], header[1] = self.call.check, self.seq
            shm_shared.publish(header, self.places)
            self._first()
            self._barrier()
            self.phase = "rounds"
        return False  # the lane moves on once the result is copied out (``_advance``)

    def _first(self) -> None:
        if self.direct:
            self.src = shm_direct.publish(self._header(self.shm.me, 0), self.src)
        self._copy_in(0)

    def advance(self) -> bool:
        try:
            done = self._advance()
        except BaseException:
            self.lane.leave(self)
            self.natives.inflight.pop(self.seq, None)
            raise
        if done:
            self.natives.inflight.pop(self.seq, None)
            return True
        self.polls += 1
        if self.polls % STALL_POLLS == 0:
            note_stall(self)
        return False

    def _advance(self) -> bool:
        if self.lane.runs:
            self.lane.pump()
        # round after round while the others keep up: back in the engine a wait may sleep
        while self.barrier is not None and self._passed():
            self.barrier = None
            if self.phase == "growing":
                self.shm.grow()
                self.phase = "in"
                self.lane.pump()
                return False
            if self._step():
                return True
        return False

    def _step(self) -> bool:
        """After a barrier: the previous round out, this one reduced, the next one in;
        True once the last round is out."""
        self.shm.win.Sync()
        k = self.round
        if k == 0:
            self._check()
            if self.direct:
                shm = self.shm
                step = max(tuning.SHM_BLOCK_BYTES // self.dst.itemsize, 1)
                self.reads = shm_direct.PeerInputs(
                    self._headers(), shm.me, self.dst.dtype, step,
                    shm.scratch(shm.n * step * self.dst.itemsize))
            if self.places is not None:
                self.views = shm_shared.SharedRun(self.shm.shared, self._headers(), self.dst)
        else:
            self._copy_out(k - 1)
        if k == self.rounds:
            self.phase = "done"
            self.lane.leave(self)  # the next run may write its input now
            return True
        self._reduce(k)
        self.round = k + 1
        if k + 1 < self.rounds:
            self._copy_in(k + 1)
        # past the first barrier every rank is in this call (its check passed): the others
        # wait on flags in the window, not on MPI messages (MPICH may deliver a finished
        # barrier's message only at the sender's next MPI call)
        self.barrier = self.start_round + k + 1
        self.shm.arrive(self.barrier)
        return False

    def _passed(self) -> bool:
        """Whether the barrier is complete, spinning on it for up to ``shm.spin`` seconds:
        between rounds a peer is a round's work away at most, and a wait that yields the core
        on a busy host loses a time slice per round."""
        barrier = self.barrier
        test = barrier.Test if not isinstance(barrier, int) else lambda: self.shm.arrived(barrier)
        if test():
            return True
        if self.phase != "rounds" or not self.shm.spin:
            return False
        until = time.perf_counter() + self.shm.spin
        while time.perf_counter() < until:
            if test():
                return True
        return False

    def _offset(self, k: int) -> int:
        return FLAG + ((self.start_round + k) % 2) * self.shm.half

    def _header(self, rank: int, k: int) -> np.ndarray:
        offset = self._offset(k)
        return self.shm.segments[rank][offset:offset + HEADER].view(np.int64)

    def _slot(self, rank: int, k: int, owner: int, length: int) -> np.ndarray:
        """The first ``length`` elements of slot ``owner`` (what rank ``owner`` reduces) in
        rank ``rank``'s buffer of this call's round ``k``."""
        start = self._offset(k) + HEADER + owner * self.shm.slot
        return self.shm.segments[rank][start:start + length * self.dst.itemsize].view(self.dst.dtype)

    def _slices(self, k: int) -> list[tuple[int, int]]:
        """Every rank's slice of round ``k``, as positions in the payload."""
        base = k * self.span
        count, n = min(self.span, len(self.dst) - base), self.shm.n
        return [(base + p * count // n, base + (p + 1) * count // n) for p in range(n)]

    def _headers(self) -> list[np.ndarray]:
        return [self._header(r, 0) for r in range(self.shm.n)]

    def _check(self) -> None:
        shm = self.shm
        checks = {int(self._header(r, 0)[0]) for r in range(shm.n)}
        if checks != {self.call.check}:
            raise CollectiveMismatchError(
                f"rank {shm.me}: call {self.seq}: ranks called different collectives, or the same "
                f"one with different arguments, at this point (this rank: {self.call.describe()});"
                " every rank must make the same calls in the same order")
        why = shm_shared.disagreement(self._headers())
        if why is not None:
            raise CollectiveMismatchError(f"rank {shm.me}: call {self.seq} "
                                          f"({self.call.describe()}): {why}")

    def _copy_in(self, k: int) -> None:
        """The slices of round ``k`` other ranks reduce go into this rank's buffer; its own
        stays where it is (the reduction reads it from the input)."""
        me = self.shm.me
        if self.direct or self.places is not None:
            return  # the others read it where it lies
        for p, (lo, hi) in enumerate(self._slices(k)):
            if p != me and hi > lo:
                self._slot(me, k, p, hi - lo)[:] = self.src[lo:hi]

    def _reduce(self, k: int) -> None:
        """This rank's slice of round ``k``, from every rank's data in rank order (its own
        from its input), into its buffer (for the others) and its result, a cache-sized
        block at a time."""
        me, dst, reads = self.shm.me, self.dst, self.reads
        lo, hi = self._slices(k)[me]
        if self.views is not None:
            step = max(tuning.SHM_BLOCK_BYTES // dst.itemsize, 1)
            self.views.reduce(self.op, dst, lo, hi, self.shm.scratch(step * dst.itemsize))
            return
        slots = [self._slot(r, k, me, hi - lo) for r in range(self.shm.n)]
        published = slots[me]
        step = max(tuning.SHM_BLOCK_BYTES // dst.itemsize, 1)
        for a in range(0, hi - lo, step):
            b = min(a + step, hi - lo)
            if reads is not None:
                data = reads.blocks(lo + a, lo + b, self.src)
            else:
                data = [self.src[lo + a:lo + b] if r == me else slot[a:b] for r, slot in enumerate(slots)]
            block = published[a:b]
            NUMPY.combine_into(self.op, block, data[0], data[1:])
            dst[lo + a:lo + b] = block  # (still in cache; in place, src block a:b is read)

    def _copy_out(self, k: int) -> None:
        me, dst = self.shm.me, self.dst
        if self.views is not None:
            return  # each owner wrote its slice into every rank's result
        for p, (lo, hi) in enumerate(self._slices(k)):
            if p != me and hi > lo:
                dst[lo:hi] = self._slot(p, k, p, hi - lo)

    def pending_peers(self) -> list[int]:
        return [r for r in range(self.shm.n) if r != self.shm.me]
