"""The order in which native collectives are issued: call order, on every rank.

MPI matches collectives by the order each rank issues them on a communicator, so a call's
every MPI collective (its check, each piece of a large payload, a persistent start) must be
issued before the next call's first. A call that cannot issue everything at once (pieces go
one at a time, a persistent request may still be busy with an earlier call) holds back the
calls after it: the lane issues runs strictly first come, first served.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class Lane:
    """Runs waiting to issue their collectives, oldest first."""

    __slots__ = ("runs",)

    def __init__(self) -> None:
        self.runs: deque = deque()

    def join(self, run: Any) -> None:
        self.runs.append(run)
        self.pump()

    def pump(self) -> None:
        """Let the oldest runs issue what they can; stop at the first that cannot finish."""
        runs = self.runs
        while runs:
            if not runs[0].issue():
                return
            runs.popleft()

    def leave(self, run: Any) -> None:
        """A failed run issues nothing more (every rank's run fails at the same check)."""
        try:
            self.runs.remove(run)
        except ValueError:
            pass
        self.pump()

    def __len__(self) -> int:
        return len(self.runs)
