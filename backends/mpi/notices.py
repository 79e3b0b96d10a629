"""Failure notices and status questions between ranks, on a communicator of their own.

* A rank that fails sends a pickled ``Failure`` to every peer
  (``Isend``: small, so eager; nothing waits for it). Peers poll for them in slow waits.
* A rank whose call times out asks every peer what it is doing. Peers answer from inside
  their own waits (whenever they poll), with the activity they last published: a peer that
  is busy outside the library, or gone, does not answer, and is reported as such. A native
  call that waits long asks without waiting for the answers (``ask_later``), about one call
  number (the oldest native call in flight): peers answer with the call they run under that
  number (check value, description), and the asker compares check values when they come.
  A question and its answer stay small however many calls are in flight.
* Across hosts, questions go to the ranks of this rank's own node only, and the notice of a
  timeout or of a transfer MPI failed here (kind "lost") too: MPI's first message to a peer
  whose host died can block inside MPI (a connection being retried, holding MPI's lock), one
  to a peer that exited can crash it (over UCX: SIGSEGV in ``MPI_Isend``, the rank gone
  without a word), and the rank that asks or tells is the one that suspects a dead peer.
  Peers on other nodes that are alive time out by themselves.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from collectives.runtime.activity import SILENT, describe_activity
from collectives.runtime.transport import Failure

FAILURE, QUESTION, ANSWER = 1, 2, 3
ANSWER_POLL = 1e-3  # seconds between polls while waiting for answers
PRUNE_AFTER = 16  # sends in flight before the finished ones are let go
KEEP_QUESTIONS = 8  # answers are kept for this many of this rank's latest questions


class Notices:
    """This rank's side of the notice communicator.

    Two threads use it at once (a blocking call's wait, and the progress thread of calls in
    flight): a lock keeps the buffers of sends in flight alive until MPI is done with them,
    and answers land in one store, by question, whichever thread receives them.
    """

    def __init__(self, comm: Any, near: Any = None):
        """``near``: the ranks of this rank's node (None: every rank), those it asks and
        tells of a timeout."""
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.peers = [r for r in range(self.size) if r != self.rank]
        self.near = [r for r in (self.peers if near is None else sorted(near)) if r != self.rank]
        self.activity: Any = None
        self.calls: dict = {}  # native calls in flight, by number: the transport's
        # the transport's other calls in flight, by number: (check, description) or None
        self.other_call: Callable[[int], tuple | None] = lambda seq: None
        # the check values of the transport's calls in flight, by number
        self.checks_in_flight: Callable[[], dict[int, int] | None] = lambda: None
        self._lock = threading.Lock()
        self._sent: list = []  # (request, buffer): notices and answers still in flight
        self._prune_at = PRUNE_AFTER  # test the sends in flight once there are this many
        self._question = 0
        # messages sent to and received from each peer here: what a free drains (draining)
        self.sent = [0] * self.size
        self.received = [0] * self.size
        self._replies: dict[int, dict[int, tuple]] = {}  # question -> peer -> (said, calls)

    def _post(self, obj: Any, dst: int, tag: int) -> None:
        blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if self.comm is None:
                return
            try:
                self._sent.append((self.comm.Isend([blob, MPI.BYTE], dst, tag), blob))
            except MPI.Exception:
                return  # a peer MPI can no longer reach: it hears nothing, as it would if dead
            self.sent[dst] += 1
            if len(self._sent) >= self._prune_at:  # amortised: a send costs O(1) tests
                self._sent = [(r, b) for r, b in self._sent if not _test(r)]
                self._prune_at = 2 * len(self._sent) + PRUNE_AFTER

    def _take(self, tag: int) -> tuple[int, Any] | None:
        """One pending message with ``tag``: ``(source, object)``."""
        with self._lock:  # (``free`` may forget the communicator meanwhile: not under MPI)
            comm = self.comm
            if comm is None:  # freed: a progress thread may still poll once
                return None
            status = MPI.Status()
            message = comm.Improbe(MPI.ANY_SOURCE, tag, status)  # matched: no other thread
            if message is None:                                  # gets it
                return None
            blob = bytearray(status.Get_count(MPI.BYTE))
            message.Recv([blob, MPI.BYTE])
            self.received[status.Get_source()] += 1
        return status.Get_source(), pickle.loads(blob)

    def notify(self, failure: Failure) -> None:
        for peer in self.near if failure.kind in ("timeout", "lost") else self.peers:
            self._post(failure.addressed_to(peer), peer, FAILURE)  # (an exit's counts: its own)

    def poll(self) -> Failure | None:
        self.serve()
        got = self._take(FAILURE)
        return got[1] if got is not None else None

    def serve(self) -> None:
        """Answer the questions peers asked since the last poll: what this rank does, and
        the native call it runs under the number the asker is stalled in (if asked)."""
        while True:
            got = self._take(QUESTION)
            if got is None:
                return
            source, (number, about) = got
            call = self.calls.get(about) if about is not None else None
            # (a call under that number this rank runs otherwise, by a schedule: its check
            # tells the asker, whose native call under it waits for this rank in vain)
            theirs = ((call.check, call.describe_fully()) if call is not None else
                      self.other_call(about) if about is not None else None)
            calls = {about: theirs} if theirs is not None else {}
            said = describe_activity(self.activity, self.checks_in_flight())
            self._post((number, said, calls), source, ANSWER)

    def ask_later(self, about: int | None = None) -> int:
        """Ask the peers of this node what they do (and which native call they run under
        number ``about``); the answers come with ``answers``. One message per peer,
        however many calls this rank has in flight."""
        with self._lock:
            self._question += 1
            number = self._question
            self._replies[number] = {}
            for old in [q for q in self._replies if q <= number - KEEP_QUESTIONS]:
                del self._replies[old]  # answers to those that still come are dropped
        for peer in self.near:
            self._post((number, about), peer, QUESTION)
        return number

    def _collect(self) -> None:
        """Receive the answers that came, into the store (for whichever question asked)."""
        while (got := self._take(ANSWER)) is not None:
            source, (number, said, calls) = got
            with self._lock:
                replies = self._replies.get(number)
                if replies is not None:  # else an answer to a question long given up
                    replies[source] = (said, calls)

    def answers(self, number: int) -> dict[int, dict]:
        """The native calls each peer that answered question ``number`` has in flight."""
        self.serve()
        self._collect()
        with self._lock:
            return {peer: calls for peer, (_, calls) in self._replies.get(number, {}).items()}

    def ask(self, timeout: float) -> dict[int, tuple]:
        """What each peer of this node says it is doing, ``(seq, text, phase)``; peers that do
        not answer within ``timeout`` are described as such."""
        number = self.ask_later()
        peers = self.near
        deadline = time.monotonic() + timeout
        while True:
            self.serve()  # a peer asking at the same time must hear from us too
            self._collect()
            with self._lock:
                answers = {peer: said for peer, (said, _) in
                           self._replies.get(number, {}).items()}
            if len(answers) >= len(peers) or time.monotonic() >= deadline:
                break
            time.sleep(ANSWER_POLL)
        for peer in peers:
            answers.setdefault(peer, (None, f"did not answer within {timeout:g} s (busy outside "
                                            "the library, or gone)", SILENT))
        return answers

    def free(self) -> tuple[list[int], list[int], list]:
        """Stop using the communicator (its owner frees it once drained: ``draining``): the
        counts of messages sent to and received from each peer, and the sends in flight."""
        with self._lock:
            self.comm = None
            sends, self._sent = self._sent, []
            return self.sent, self.received, sends


def _test(request: Any) -> bool:
    try:
        return request.Test()
    except MPI.Exception:
        return True  # failed: nothing more will come of it
