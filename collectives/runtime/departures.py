"""Ranks that leave, and the point-to-point messages they sent before they left.

A rank leaves when its program ends (an MPI rank, status 0) or its function raises or returns
with calls in flight (a thread rank). It tells its peers after which call it left (a failure
notice of kind "exited": their later collectives cannot finish and raise at once) and how many
messages it had posted to each of them, by tag (``exit_notice``). Its messages are not lost
with it: a receive from it is matched by one of them (messages of one source and tag are
matched in the order they were sent) or by none, and only then raises, at once, naming it:

* the receives from it, in flight or posted later, take its remaining messages in the order
  they were posted; those beyond the last raise ``PeerFailedError``;
* a send to it raises before it is posted (nothing would ever take it).

Messages between the ranks still there run as before. A receive counts once its message
arrived; one withdrawn after its timeout counts as having taken nothing (on MPI it may have
taken its message into scratch). A send counts once posted, even one withdrawn after its
timeout. Either way a receive from a rank that left may wait its own timeout instead of
raising at once, never the reverse: a receive never raises while a message it would take may
come. A notice whose counts are unknown (its rank's engine was gone) refuses no receive.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import PeerFailedError
from .transport import Failure, engine_of


class Ledger:
    """This rank's point-to-point messages on one communicator, counted by peer and tag."""

    __slots__ = ("left_at", "owed", "received", "sent", "why")

    def __init__(self) -> None:
        self.sent: Counter[tuple[int, int]] = Counter()  # (destination, tag): sends posted
        self.received: Counter[tuple[int, int]] = Counter()  # (source, tag): receives done
        # a rank that left: tag -> messages it sent here (None: unknown, every receive waits)
        self.owed: dict[int, Mapping[int, int] | None] = {}
        self.why: dict[int, str] = {}  # a rank that left: what its notice said
        self.left_at: dict[int, float] = {}  # a rank that left: when its notice was read

    def sent_by_peer(self) -> dict[int, dict[int, int]]:
        """What a notice of this rank's exit says it sent: destination -> tag -> count."""
        counts: dict[int, dict[int, int]] = {}
        for (peer, tag), count in list(self.sent.items()):  # (a copy: another thread may send)
            counts.setdefault(peer, {})[tag] = count
        return counts

    def has_left(self, peer: int) -> bool:
        return peer in self.owed

    def unmatched(self, source: int, tag: int, receives_before: int) -> bool:
        """Whether a receive from ``source`` (a rank that left) with ``tag``, behind
        ``receives_before`` receives of the same source and tag still in flight, can never
        be matched: every message the rank sent with that tag is taken or spoken for."""
        owed = self.owed[source]
        if owed is None:
            return False
        return receives_before >= owed.get(tag, 0) - self.received[source, tag]


def exit_notice(transport: Any, seq: int, message: str) -> Failure:
    """The notice a rank that leaves after call ``seq`` sends its peers, with the messages
    it posted to each and the calls it issued and had in flight (from its engine, if it has
    one)."""
    engine = engine_of(transport)
    if engine is None:
        return Failure(transport.rank, seq, "exited", message, None)
    return Failure(transport.rank, seq, "exited", message, engine.messages.sent_by_peer(),
                   engine.seq, engine.calls_pending())


def lost_with(notice: Failure, call: int) -> bool:
    """Whether a peer's ``call`` cannot finish for ``notice``'s rank: the call it failed in,
    and every later one; for a rank that left, the calls after ``seq`` that it had not
    finished (in flight when it left, or never issued; every one where it did not say). A
    call it finished after one still in flight is not lost: it said "after call 1" where
    call 4 had finished, and a peer still in call 4 failed it (thread ranks after a list's
    mismatch, whose later buckets were still agreeing)."""
    if notice.kind != "exited":
        return call >= notice.seq
    return call > notice.seq and (notice.issued is None or call > notice.issued
                                  or call in notice.pending)


def left(ledger: Ledger, notice: Failure, rank: int) -> None:
    """Note that ``notice``'s rank left, owing this rank (``rank``) the messages it sent it."""
    ledger.owed[notice.rank] = None if notice.sent is None else dict(notice.sent.get(rank, {}))
    ledger.why[notice.rank] = notice.message
    ledger.left_at[notice.rank] = time.monotonic()


def lost_message(ledger: Ledger, rank: int, receiving: bool, peer: int, tag: int
                 ) -> PeerFailedError:
    """The error of ``rank``'s message to or from ``peer`` (a rank that left) that nothing
    will match."""
    gone = f"rank {peer} left ({ledger.why[peer]})"
    if not receiving:
        return PeerFailedError(f"rank {rank}: send to rank {peer} (tag {tag}) cannot finish: "
                               f"{gone} and receives nothing more")
    sent = (ledger.owed[peer] or {}).get(tag, 0)
    having = (f"having sent this rank no message with tag {tag}" if sent == 0 else
              f"having sent this rank {sent} message(s) with tag {tag}, each matched by an "
              "earlier receive")
    return PeerFailedError(f"rank {rank}: recv from rank {peer} (tag {tag}) cannot finish: "
                           f"{gone}, {having}")


def waiting_receives(messages: Iterable[Any], source: int, tag: int) -> int:
    """How many of ``messages`` (stages of messages in flight) are receives from ``source``
    with ``tag`` whose message has not come yet."""
    return sum(1 for m in messages if m.receiving and not m.taken and m.peer == source
               and m.tag == tag)


def unmatched_receives(ledger: Ledger, source: int, messages: Iterable[Any]) -> list[Any]:
    """Of the receives from ``source`` (a rank that left) among ``messages`` (stages of
    messages in flight, in the order they were posted), those no message will match."""
    before: Counter[int] = Counter()
    lost = []
    for message in messages:
        if message.receiving and not message.taken and message.peer == source:
            if ledger.unmatched(source, message.tag, before[message.tag]):
                lost.append(message)
            before[message.tag] += 1
    return lost
