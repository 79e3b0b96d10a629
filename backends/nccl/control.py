"""The host side of the NCCL transport, over MPI: agreements, failure notices, activity.

NCCL moves the data; what the core exchanges about calls goes over MPI on duplicates of the
user's communicator, so it never meets user messages:

* ``control``: the core's agreements (small NumPy arrays) as point-to-point messages whose tag
  packs the call number, the check value's part, the round and the range position;
* notices: a rank that fails tells every peer (non-blocking sends, never waited for);
* activity: what this rank is doing (``publish_activity``); a peer that times out asks every
  rank, and ranks answer whenever they wait in the library.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import numpy as np

from collectives.arrays import NUMPY
from collectives.runtime.activity import SILENT, describe_activity
from collectives.runtime.transport import Failure

# Tag fields: call number (12 bits), check part (2), round (7), range position (8).
_SEQ, _CHECK, _ROUND, _POS = 12, 2, 7, 8
QUERY, ANSWER = 1, 2


def control_tag(tag: tuple) -> int:
    """An MPI tag (< 2**29) for the core's ``(seq, check, round, position)``."""
    seq, check, index, pos = tag
    value = seq % (1 << _SEQ)
    value = (value << _CHECK) | (check % (1 << _CHECK))
    value = (value << _ROUND) | (index % (1 << _ROUND))
    return (value << _POS) | (pos % (1 << _POS))


def tag_seq(tag: int) -> int:
    """The call number (mod 4096) that ``control_tag`` packed into ``tag``."""
    return tag >> (_CHECK + _ROUND + _POS)


class _Send:
    __slots__ = ("dst", "request")
    data = None

    def __init__(self, request, dst: int):
        self.request, self.dst = request, dst

    def done(self) -> bool:
        return self.request.Test()


class _Recv:
    __slots__ = ("data", "into", "request", "src")

    def __init__(self, request, data, into, src: int):
        self.request, self.data, self.into, self.src = request, data, into, src

    def done(self) -> bool:
        if not self.request.Test():
            return False
        if self.into is not None:
            NUMPY.copy(self.into, self.data)
            self.into = None
        return True


class MpiChannel:
    """A ``PointToPoint`` over an mpi4py communicator, for host (NumPy) buffers."""

    arrays = NUMPY

    def __init__(self, comm: Any):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def send(self, data, dst: int, tag: tuple) -> _Send:
        buf = np.ascontiguousarray(data)
        return _Send(self.comm.Isend(buf.view(np.uint8).reshape(-1), dst, control_tag(tag)), dst)

    def recv(self, into, src: int, tag: tuple, *, in_place: bool) -> _Recv:
        data = np.empty(into.shape, into.dtype)
        request = self.comm.Irecv(data.view(np.uint8).reshape(-1), src, control_tag(tag))
        return _Recv(request, data, into if in_place else None, src)

    def release(self, request: _Recv) -> None:
        request.data = None


    def cancel(self, requests: list) -> None:
        for r in requests:
            try:
                r.request.Cancel()
                r.request.Test()
            except Exception:  # noqa: BLE001 - already complete, or not cancellable
                pass

    def waiting_from_call(self, seq: int) -> bool:
        """Whether a peer's first pending message belongs to call ``seq`` (an agreement this
        rank skipped)."""
        from mpi4py import MPI

        status = MPI.Status()
        for peer in range(self.size):
            if peer != self.rank and self.comm.Iprobe(peer, MPI.ANY_TAG, status):
                if tag_seq(status.Get_tag()) == seq % (1 << _SEQ):
                    return True
        return False


class Notices:
    """Failure notices and activity queries between the ranks (MPI, host side)."""

    def __init__(self, comm: Any):
        self.comm = comm  # a duplicate of the world: notices never meet other messages
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.activity: Any = None
        self._sent: list = []  # notices and answers in flight (never waited for)
        # messages sent to and received from each peer: what a free drains (the MPI
        # transport's ``draining``); after ``free`` nothing is sent or taken here
        self.sent, self.received = [0] * self.size, [0] * self.size
        self.freed = False

    def _send(self, blob: np.ndarray, peer: int, tag: int) -> None:
        self._sent.append((blob, self.comm.Isend(blob, peer, tag)))
        self.sent[peer] += 1

    def _recv(self, blob: np.ndarray, peer: int, tag: int) -> None:
        self.comm.Recv(blob, peer, tag)
        self.received[peer] += 1

    def notify(self, failure: Failure) -> None:
        if self.freed:
            return
        blob = np.frombuffer(pickle.dumps(failure), np.uint8).copy()
        for peer in range(self.size):
            if peer != self.rank:
                self._send(blob, peer, 0)

    def poll(self) -> Failure | None:
        """A peer's failure notice, if one arrived; also answers activity queries."""
        from mpi4py import MPI

        if self.freed:
            return None
        self.answer()
        status = MPI.Status()
        if not self.comm.Iprobe(MPI.ANY_SOURCE, 0, status):
            return None
        blob = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        self._recv(blob, status.Get_source(), 0)
        return pickle.loads(blob.tobytes())

    def answer(self) -> None:
        """Answer every pending activity query with what this rank is doing."""
        from mpi4py import MPI

        if self.freed:
            return
        status = MPI.Status()
        while self.comm.Iprobe(MPI.ANY_SOURCE, QUERY, status):
            asker = status.Get_source()
            self._recv(np.empty(1, np.uint8), asker, QUERY)
            blob = np.frombuffer(pickle.dumps(describe_activity(self.activity)), np.uint8).copy()
            self._send(blob, asker, ANSWER)
        self._sent = [(b, r) for b, r in self._sent if not r.Test()]

    def ask(self, timeout: float) -> dict[int, tuple]:
        """Every peer's ``(call number or None, description)``; peers that do not answer
        within ``timeout`` seconds are reported as such."""
        from mpi4py import MPI

        query = np.zeros(1, np.uint8)
        for peer in range(self.size):
            if peer != self.rank and not self.freed:
                self._send(query, peer, QUERY)
        answers: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        status = MPI.Status()
        while len(answers) < self.size - 1 and time.monotonic() < deadline:
            self.answer()
            if not self.freed and self.comm.Iprobe(MPI.ANY_SOURCE, ANSWER, status):
                blob = np.empty(status.Get_count(MPI.BYTE), np.uint8)
                self._recv(blob, status.Get_source(), ANSWER)
                answers[status.Get_source()] = pickle.loads(blob.tobytes())
            else:
                time.sleep(1e-3)
        for peer in range(self.size):
            if peer != self.rank and peer not in answers:
                answers[peer] = (None, f"did not answer within {timeout:g} s (busy outside the "
                                       "library, or stuck)", SILENT)
        return answers

    def free(self) -> tuple[list[int], list[int], list]:
        """Stop sending and taking notices (the transport frees the communicator once they
        are drained): the counts of messages sent to and received from each peer, and the
        sends in flight, as ``(request, buffer)``."""
        self.freed = True
        sends, self._sent = [(r, b) for b, r in self._sent], []
        return self.sent, self.received, sends
