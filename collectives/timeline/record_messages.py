"""Point-to-point messages on the timeline: each ``send``, ``recv``, ``isend``, ``irecv``.

A message is recorded as a call is (``record_calls``): a span of category ``call``, named ``send``
or ``recv``, from the moment it was posted to its completion, on the communicator's track
(blocking ``send``/``recv``) or on an asynchronous lane (``isend``/``irecv``, with
``"async": true``), with the ``message`` stage and its waits inside. Its args are the
message's: ``peer``, ``tag``, ``bytes``, ``dtype``, ``shape``, and ``message``, its number
among the messages this rank recorded on the communicator. Messages are numbered apart from
collectives (they take no call number: a collective's waits are matched across ranks by
it), so a message's waits carry ``message`` instead of ``call``. The span ends with its
``outcome``: ``ok``, ``timed out``, or the error's class (with the ``error`` itself).

Only called while ``recorder.ON`` is true.
"""

from __future__ import annotations

from typing import Any

from ..errors import CollectiveTimeoutError
from . import record_calls
from . import recorder as rec

OK = {"outcome": "ok"}  # (one dict for every message that succeeds: its JSON is cached)
_signatures: dict[tuple, dict] = {}  # a message's (name, peer, tag, dtype, shape) -> its args


class MessageTrace(record_calls.OpTrace):
    """A message's spans: its waits are numbered by message, and its end says the outcome."""

    __slots__ = ("number", "waiting")

    def __init__(self, track: record_calls.Track, tid: int, lane: bool, number: int, args: dict,
                 peer: int):
        super().__init__(track, tid, lane, number, args)
        self.waiting = {"for": [peer]}  # (a message waits for its peer alone)
        self.number = f'"message":{number}'

    def unblock(self) -> None:
        if self.waited:
            ts = rec.now()
            rec.complete(self.pid, self.tid, "wait", "wait", self.waited, ts - self.waited,
                         (self.waiting, self.number))
            self.waited = 0

    def closing(self, error: BaseException | None) -> dict:
        if error is None:
            return OK
        outcome = ("timed out" if isinstance(error, CollectiveTimeoutError)
                   else type(error).__name__)
        return {"outcome": outcome, "error": f"{type(error).__name__}: {error}"}


def issued(comm: Any, op: Any, name: str, peer: int, tag: int, array: Any, async_op: bool,
           t0: int) -> None:
    """A message was posted (``array``: as the caller gave it): its span begins at ``t0``."""
    where = record_calls.track(comm)
    where.messages += 1
    number = where.messages
    args = _signature(name, peer, tag, array)
    if async_op:
        tid, last = where.take_lane()
    else:
        tid, last = where.tid, where.end
    trace = MessageTrace(where, tid, async_op, number, args, peer)
    extra = f'"message":{number},"async":true' if async_op else f'"message":{number}'
    trace.begin(name, "call", (args, extra), ts=max(t0, last) or rec.now())
    op.trace = trace


def _signature(name: str, peer: int, tag: int, array: Any) -> dict:
    """A message's args, the same dict for every message alike (never change it)."""
    shape, dtype = tuple(array.shape), str(array.dtype)
    key = (name, peer, tag, dtype, shape)
    found = _signatures.get(key)
    if found is None:
        if len(_signatures) > 4096:
            _signatures.clear()
        found = _signatures[key] = {"peer": peer, "tag": tag, "bytes": int(array.nbytes),
                                    "dtype": dtype, "shape": list(shape)}
    return found
