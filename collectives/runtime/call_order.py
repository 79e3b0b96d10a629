"""The order of a communicator's calls: their numbers, and the turns of its native collectives.

Every rank numbers its calls alike (``seq``). Native collectives (MPI's ``Iallreduce``,
NCCL's ``allReduce``) pair across ranks by the order they are issued in, so each call that
runs one takes a place (a turn) in one order when it is issued and starts only in its turn
(``collectives.runtime.native_stage``): ``native_next`` is the next place to hand out,
``native_issued`` the first whose collective is not issued yet, and ``native_skipped`` the
places released by calls that ran no native collective after all.

``CallOrder`` is the ``Engine``'s base: these counters change only through its methods, which
the stages (``native_stage``, ``prepared``) and the hot path (``hot_path``) call. Each is a
few attribute operations, cheap enough for the hot path's every call.
"""

from __future__ import annotations

from typing import Any


class CallOrder:
    """Call numbers and native turns of one communicator (see the module's docstring)."""

    def __init__(self) -> None:
        self.seq = 0  # the latest call's number
        self.native_next = 0
        self.native_issued = 0
        self.native_skipped: set[int] = set()
        # the timeout the call holding the engine's ``busy`` lock was given (None: the
        # communicator's), for the hang guard (``collectives.runtime.hang_guard``)
        self.claim_timeout: Any = None

    def next_seq(self) -> int:
        """The number of a new call."""
        self.seq += 1
        return self.seq

    def reserve_turn(self) -> int:
        """A place in the order native collectives start in (they pair by issue order)."""
        self.native_next += 1
        return self.native_next - 1

    def release_turn(self, turn: int) -> None:
        """A reserved place that no native collective will take: later ones need not wait."""
        self.native_skipped.add(turn)

    def in_turn(self, turn: int) -> bool:
        """Whether ``turn`` is the next place in the native start order (places released by
        calls that ran no native collective are passed over)."""
        while self.native_issued in self.native_skipped:
            self.native_skipped.discard(self.native_issued)
            self.native_issued += 1
        return self.native_issued == turn

    def pass_turn(self) -> None:
        """The collective in the current turn is issued (for a run that holds the turn, its
        last one; for a schedule in turn, its last round): the next place's may start."""
        self.native_issued += 1

    def hot_call(self, timeout: Any) -> int:
        """The number of a call the hot path starts now (it holds ``busy``, and nothing is in
        flight or waiting for a turn): the next native place is taken and passed at once;
        ``timeout`` is what the hang guard allows the call."""
        self.claim_timeout = timeout
        self.native_next = self.native_issued = self.native_issued + 1
        self.seq += 1
        return self.seq

    def hot_call_dropped(self, seq: int) -> None:
        """The hot call ``seq`` (the latest ``hot_call``) started nothing: its number and
        native place are free again, for the engine's way to take."""
        self.seq = seq - 1
        self.native_next = self.native_issued = self.native_issued - 1
