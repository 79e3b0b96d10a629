"""Failure notices and status questions between ranks, on a communicator of their own.

* A rank that fails sends a pickled :class:`~collectives.runtime.transport.Failure` to every peer
  (``Isend``: small, so eager; nothing waits for it). Peers poll for them in slow waits.
* A rank whose call times out asks every peer what it is doing. Peers answer from inside
  their own waits (whenever they poll), with the activity they last published and the native
  calls they have in flight (number, check value, description): a peer that is busy outside
  the library, or gone, does not answer, and is reported as such. A native call that waits
  long asks the same question without waiting for the answers (``ask_later``) and compares
  check values when they come.
* Across hosts, questions go to the ranks of this rank's own node only, and a timeout's notice
  too: MPI's first message to a peer whose host died can block inside MPI (a connection being
  retried, holding MPI's lock), and the rank that asks is the one that suspects a dead peer.
  Peers on other nodes that are alive time out by themselves.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

from mpi4py import MPI

from collectives.runtime.transport import SILENT, Failure, describe_activity

FAILURE, QUESTION, ANSWER = 1, 2, 3
ANSWER_POLL = 1e-3  # seconds between polls while waiting for answers


class Notices:
    """This rank's side of the notice communicator."""

    def __init__(self, comm: Any, near: Any = None):
        """``near``: the ranks of this rank's node (None: every rank), those it asks and
        tells of a timeout."""
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.peers = [r for r in range(self.size) if r != self.rank]
        self.near = [r for r in (self.peers if near is None else sorted(near)) if r != self.rank]
        self.activity: Any = None
        self.calls: dict = {}  # native calls in flight, by number: the transport's
        self._sent: list = []  # (request, buffer): notices and answers still in flight
        self._question = 0
        self._answers: dict[int, tuple] = {}

    def _post(self, obj: Any, dst: int, tag: int) -> None:
        if self.comm is None:
            return
        blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._sent.append((self.comm.Isend([blob, MPI.BYTE], dst, tag), blob))
        except MPI.Exception:
            pass  # a peer MPI can no longer reach: it hears nothing, as it would if dead
        self._sent = [(r, b) for r, b in self._sent if not _test(r)]

    def _take(self, tag: int) -> tuple[int, Any] | None:
        """One pending message with ``tag``: ``(source, object)``."""
        if self.comm is None:  # freed: a progress thread may still poll once
            return None
        status = MPI.Status()
        message = self.comm.Improbe(MPI.ANY_SOURCE, tag, status)
        if message is None:
            return None
        blob = bytearray(status.Get_count(MPI.BYTE))
        message.Recv([blob, MPI.BYTE])
        return status.Get_source(), pickle.loads(blob)

    def notify(self, failure: Failure) -> None:
        for peer in self.near if failure.kind == "timeout" else self.peers:
            self._post(failure, peer, FAILURE)

    def poll(self) -> Failure | None:
        self.serve()
        got = self._take(FAILURE)
        return got[1] if got is not None else None

    def serve(self) -> None:
        """Answer the questions peers asked since the last poll."""
        while True:
            got = self._take(QUESTION)
            if got is None:
                return
            source, number = got
            calls = {seq: (call.check, call.describe()) for seq, call in list(self.calls.items())}
            self._post((number, describe_activity(self.activity), calls), source, ANSWER)

    def ask_later(self) -> int:
        """Ask the peers of this node; the answers come with :meth:`answers`."""
        self._question += 1
        for peer in self.near:
            self._post(self._question, peer, QUESTION)
        self._answers: dict[int, tuple] = {}
        return self._question

    def answers(self, number: int) -> dict[int, dict]:
        """The native calls each peer that answered question ``number`` had in flight."""
        self.serve()
        while (got := self._take(ANSWER)) is not None:
            source, (asked, _, calls) = got
            if asked == number:
                self._answers[source] = calls
        return self._answers

    def ask(self, timeout: float) -> dict[int, tuple]:
        """What each peer of this node says it is doing, ``(seq, text, phase)``; peers that do
        not answer within ``timeout`` are described as such."""
        number = self.ask_later()
        peers = self.near
        answers: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        while len(answers) < len(peers) and time.monotonic() < deadline:
            self.serve()  # a peer asking at the same time must hear from us too
            got = self._take(ANSWER)
            if got is None:
                time.sleep(ANSWER_POLL)
                continue
            source, (asked, said, _) = got
            if asked == number:  # answers to an earlier question come late: dropped
                answers[source] = said
        for peer in peers:
            answers.setdefault(peer, (None, f"did not answer within {timeout:g} s (busy outside "
                                            "the library, or gone)", SILENT))
        return answers

    def free(self) -> None:
        """Forget the communicator (its owner frees it)."""
        self.comm = None
        for request, _ in self._sent:  # notices to dead peers never complete
            try:
                request.Cancel()
            except MPI.Exception:
                pass
        self._sent = []


def _test(request: Any) -> bool:
    try:
        return request.Test()
    except MPI.Exception:
        return True  # failed: nothing more will come of it
