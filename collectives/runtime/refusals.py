"""Refusing the calls a rank's peers make where this rank found a bad argument before it issued
any (``CallRunner.refuse``; the ``refusing`` methods of ``collectives.api``).

This rank raises its error; its peers must too, at once, and the ranks' calls must still pair
afterwards. So the rank runs, for each call its peers make at this point, a call of its own
that carries the error into that call's agreement: each of theirs meets a refusal (they raise
``PeerFailedError`` naming this rank), and no data moves where the peers had not agreed the
call before.

How many calls is that? Most calls are one call on every rank. A batch's buckets, issued
before it waits on any (asynchronous, or as ``comm.buckets``), are several, and only its peers
know how many they made of their lists (this rank's list may be what is wrong: a tensor of a
dtype of its own makes a bucket of its own). So this rank refuses the first call saying it
does not know (``ISSUED_UNKNOWN``), the verdict of that call tells it how many calls its
peers issued together there (``PEERS_ISSUED``, set on its error), and it refuses the rest.
Where the ranks agreed a bucket of the list already, its count is theirs (``count``). The
rest go out at once, as asynchronous calls (each waits a round trip for its peer call's
agreement: a list of a thousand buckets took 3.7 s one after another, 1 s so). A rank alone
has nobody to tell: it only raises.

A method that makes something for later calls (a prepared call, buckets) makes no call of its
own, and a refusal there would meet whatever call its peers make next: they lose that call,
the refusing rank makes it after them, and every later call pairs with the next one of its
peers (sums of other steps, without a word, where the signatures agree). So such a method
makes a call all the same (``setting_up``): one that moves no data and is agreed every time,
which a bad argument on one rank refuses on every rank.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import numpy as np

from ..algorithms.schedule import Collective
from .agreement import ISSUED_UNKNOWN, PEERS_ISSUED, issued_alone
from .calls import Call, check_of
from .results import Ready

F = TypeVar("F", bound=Callable[..., Any])
BAD_INPUT = (TypeError, ValueError, IndexError)  # what a call's argument checks raise


def refuse(runner: Any, what: str, error: Exception, count: int | None = None,
           issued: int = 1) -> NoReturn:
    """Raise ``error``, this rank's bad argument to ``what``, after refusing ``count`` calls
    its peers make at this point (None: as many as they issued together there, learnt from
    the first refusal's verdict), one of ``issued`` calls issued together each.
    ``runner``: the communicator's ``CallRunner``."""
    if runner.comm.size == 1:
        raise error  # (no peer to tell)
    if count is None:
        vars(error).pop(PEERS_ISSUED, None)  # (a count an earlier refusal left on it)
        if not _refused(runner, what, error, ISSUED_UNKNOWN):
            raise error
        count = issued = vars(error).pop(PEERS_ISSUED, 1)  # (the user's error keeps none)
        count -= 1
    # (the rest all at once: each waits for its peer call's agreement, and one after another,
    # a list of hundreds of buckets took seconds)
    handles = []
    for _ in range(count):
        handle = _refused(runner, what, error, issued, async_op=True)
        if handle is None:
            break
        handles.append(handle)  # (waited below, broken or not: its error is reported here)
        if runner.engine.broken is not None:
            break
    for handle in handles:
        try:
            handle.wait()
        except Exception:  # noqa: BLE001 - its refusal, or the break it caused
            pass
    raise error


def refuse_rest(runner: Any, what: str, error: Exception, started: int, total: int,
                ahead: bool) -> NoReturn:
    """Raise ``error``, met while a list's buckets (``total``) are issued, ``started`` of them
    on their way: refused for the calls its peers make of the rest. Before any has started,
    as many as they say (this rank's list may not be theirs: ``refuse``'s unknown count);
    else every one left where they issue them all before waiting on any (``ahead``:
    asynchronous, or buckets), or the one they wait on."""
    if started == 0:
        refuse(runner, what, error)
    if ahead:
        refuse(runner, what, error, total - started, total)
    refuse(runner, what, error, 1, 1)


def _refused(runner: Any, what: str, error: Exception, issued: int,
             async_op: bool = False) -> Any:
    """One call refused with ``error`` (its handle, where ``async_op``); None where the
    communicator is broken (no later call pairs, and every rank hears of that; this rank's
    error is still its own). An earlier call's error that its start reports (a failed
    handle dropped unwaited) is raised: the call was not issued, as any call's then."""
    try:
        return runner.start(what, None, async_op, None, refused=error, issued=issued)
    except Exception as got:  # noqa: BLE001 - start raises the error it carries
        if got is error:
            return True
        if runner.engine.broken is not None:
            return None
        raise


@contextmanager
def refused_to_peers(comm: Any, what: str, errors: tuple = BAD_INPUT) -> Iterator[None]:
    """Inside, an error of ``errors`` (an argument check's) raised before ``comm`` issued any
    call reaches its peers at once: ``refuse`` (one raised after, from a call already
    issued, was reported by it). For callers that check arguments of their own before
    their calls (``refusing``; an adapter's several calls)."""
    engine = comm.calls.engine
    issued = engine.seq
    try:
        yield
    except errors as exc:
        if engine.seq != issued or engine.busy.locked() or comm.size == 1:
            raise  # (issued, or raised inside a call: the pipeline told its peers)
        batch = comm.calls.batch
        if batch is None:
            refuse(comm.calls, what, exc)
        else:  # (a bucket's own call, or a DDP hook's: this one call alone; its peers' count
            # would be the whole batch's, not what is left)
            refuse(comm.calls, what, exc, 1, issued_alone(batch))


def refusing(what: str) -> Callable[[F], F]:
    """A Communicator method whose bad arguments its peers hear of at once
    (``refused_to_peers``)."""
    def wrap(method: F) -> F:
        @functools.wraps(method)
        def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
            with refused_to_peers(self, what):
                return method(self, *args, **kwargs)
        return checked  # type: ignore[return-value]
    return wrap


def setting_up(what: str) -> Callable[[F], F]:
    """A Communicator method that makes, on every rank at one point of its calls, what later
    calls use (``*_init``'s prepared call, ``buckets``) and otherwise makes no call: it makes
    one (``set_up``), so that its bad argument on one rank is refused there on every rank and
    the ranks' later calls still pair (see the module's docstring); a ``timeout`` argument
    bounds that call's wait for its peers."""
    def wrap(method: F) -> F:
        @functools.wraps(method)
        def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
            # (any error: the method makes no call, and its peers wait in their set-up's; a
            # MemoryError on one rank left them waiting out their timeout)
            with refused_to_peers(self, what, (Exception,)):
                made = method(self, *args, **kwargs)
            set_up(self, what, kwargs.get("timeout"))
            return made
        return checked  # type: ignore[return-value]
    return wrap


def set_up(comm: Any, what: str, timeout: float | None = None) -> None:
    """The call a ``setting_up`` method makes on every rank: it moves no data, and its
    signature (``what``'s alone) is agreed every time, so a peer that refused its own set-up
    is heard of here, and one that makes another call here is told it disagrees."""
    if comm.size == 1:
        return  # (no peer to pair with)
    runner = comm.calls
    key = ("set up", what)
    call = runner.cache.get(key)
    if call is None:
        call = Call(Collective.ALL_REDUCE, (0,), np.dtype(np.uint8), None, 0, what, 0, None,
                    shown_as=what)
        call.signature = (what,) + (None,) * (len(call.signature) - 1)
        call.check = check_of(call.signature)
        call.run_as = what  # (no data stage: a zero-size call is agreed every time)
        runner.cache[key] = call
    runner.start(what, lambda seq: (call, [], Ready()), False, timeout)
