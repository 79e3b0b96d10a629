"""Refusing the calls a rank's peers make where this rank found a bad argument before it issued
any (``CallRunner.refuse``; the ``refusing`` methods of ``collectives.api``).

This rank raises its error; its peers must too, at once, and the ranks' calls must still pair
afterwards. So the rank runs, for each call its peers make at this point, a call of its own
that carries the error into that call's agreement: each of theirs meets a refusal (they raise
``PeerFailedError`` naming this rank), and no data moves where the peers had not agreed the
call before.

How many calls is that? Most calls are one call on every rank. A batch's buckets, issued
before it waits on any (asynchronous, or as ``comm.buckets``), are several: a bad ``op`` found
once the buckets are known is refused once for each (``count``). A bad list, or a bad
``bucket_bytes``, leaves this rank without the buckets its peers made of their lists: it
refuses the first call saying it does not know (``ISSUED_UNKNOWN``), the verdict of that call
tells it how many calls its peers issued together there (``PEERS_ISSUED``, set on its error),
and it refuses the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from .agreement import ISSUED_UNKNOWN, PEERS_ISSUED

F = TypeVar("F", bound=Callable[..., Any])
BAD_INPUT = (TypeError, ValueError, IndexError)  # what a call's argument checks raise


def refuse(runner: Any, what: str, error: Exception, count: int | None = None,
           issued: int = 1) -> NoReturn:
    """Raise ``error``, this rank's bad argument to ``what``, after refusing ``count`` calls
    its peers make at this point (None: as many as they issued together there, learnt from
    the first refusal's verdict), one of ``issued`` calls issued together each.
    ``runner``: the communicator's ``CallRunner``."""
    left = 1 if count is None or runner.comm.size == 1 else count
    while left > 0:
        try:
            runner.start(what, None, False, None, refused=error,
                         issued=ISSUED_UNKNOWN if count is None else issued)
        except Exception as got:  # noqa: BLE001 - start raises the error it carries
            if got is not error:  # (broken: no later call pairs, and every rank hears of
                break             # that; this rank's error is still its own)
        left -= 1
        if count is None and runner.comm.size > 1:  # (the peers' calls here, this one too)
            count = issued = getattr(error, PEERS_ISSUED, 1)
            left = count - 1
    raise error


def refusing(what: str) -> Callable[[F], F]:
    """A Communicator method whose bad arguments its peers hear of at once: a ``TypeError``,
    ``ValueError`` or ``IndexError`` raised before the method issued any call goes through
    ``refuse`` (one raised after, from a call already issued, was reported by it)."""
    def wrap(method: F) -> F:
        @functools.wraps(method)
        def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
            engine = self.calls.engine
            issued = engine.seq
            try:
                return method(self, *args, **kwargs)
            except BAD_INPUT as exc:
                if engine.seq != issued or engine.busy.locked() or self.size == 1:
                    raise  # (issued, or raised inside a call: the pipeline told its peers)
                refuse(self.calls, what, exc)
        return checked  # type: ignore[return-value]
    return wrap
