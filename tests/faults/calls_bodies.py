"""Bodies of the ``faults.cases_calls`` cases that the generic steps cannot express: several
calls on one rank (point-to-point, handles, prepared calls) judged together."""

from __future__ import annotations

import gc
import logging
import os
import re
import time
import weakref

import numpy as np

from collectives import CollectiveError, CollectiveTimeoutError
from collectives.tools.reference import reference
from faults.bodies import boom
from faults.kit import Call, Ctx, Expect, ok, raises
from faults.steps import COUNT, inputs, peer_failed


def expecting_value(want):
    """``ok`` with a check: the body's return value equals ``want`` (lists, numbers, None)."""
    return ok(check=lambda got: None if got == want else f"got {got!r}, want {want!r}")


def name_of(exc: BaseException) -> str:
    return type(exc).__name__


# --- point-to-point ---------------------------------------------------------------------------

def p2p_after_withdrawn_recv(ctx: Ctx) -> Call:
    """Rank 0's first receive times out (withdrawn); rank 1 then sends two messages with the
    same tag: rank 0's next two receives get both, in order (none is lost)."""
    def body(comm):
        if comm.rank == 0:
            try:
                comm.recv(np.zeros(4), 1, tag=5, timeout=0.3)
                first = "returned"
            except CollectiveTimeoutError:
                first = "timed out"
            # rank 1 sends once told the receive was withdrawn (a message that came before
            # the withdrawal is the withdrawn receive's, by design: on a loaded machine a
            # fixed delay could not tell the two apart)
            comm.send(np.zeros(1), 1, tag=6)
            got = [float(comm.recv(np.zeros(4), 1, tag=5, timeout=10.0)[0]) for _ in range(2)]
            return [first, *got]
        if comm.rank == 1:
            comm.recv(np.zeros(1), 0, tag=6, timeout=10.0)
            comm.send(np.full(4, 1.0), 0, tag=5)
            comm.send(np.full(4, 2.0), 0, tag=5)
        return None

    return Call(body, expect=expecting_value(["timed out", 1.0, 2.0] if ctx.rank == 0 else None),
                same=False)


def p2p_header_came_as_withdrawn(count: int):
    """Rank 0's receive is withdrawn after its message's header came (as when a rank that was
    not running finds both its deadline passed and the message there; forced here through
    the MPI channel: the header's receive posted, the message sent and matched, then the
    withdrawal): its next two receives get both messages of ``count`` float64, in order
    (none is lost; a large one's data follows its header in messages of their own)."""
    def step(ctx: Ctx) -> Call:
        def body(comm):
            if comm.rank == 0:
                channel = comm.transport.p2p
                take = channel.recv(np.zeros(count), 1, (5, 0, 0, 0), in_place=True)
                take.done()  # (the header's receive is posted; nothing has come yet)
            comm.barrier()
            # (sent before rank 0 receives them: a send that waits for its receive must not
            # block the barrier)
            sends = [comm.isend(np.full(count, value), 0, tag=5) for value in (1.0, 2.0)
                     ] if comm.rank == 1 else []
            comm.barrier()  # (the first message's header matched the posted receive)
            for send in sends:
                send.wait(10.0)
            if comm.rank != 0:
                return None
            channel.cancel([take])
            got = [comm.recv(np.zeros(count), 1, tag=5, timeout=10.0) for _ in range(2)]
            return [sorted(set(g.tolist())) for g in got]

        return Call(body, expect=expecting_value([[1.0], [2.0]] if ctx.rank == 0 else None),
                    same=False)
    return step


def p2p_send_withdrawn(ctx: Ctx) -> Call:
    """Rank 0's send times out (rank 1 has posted no receive yet): a CollectiveTimeoutError
    (not an internal error), and the message is withdrawn: rank 1 receives the next one."""
    def body(comm):
        if comm.rank == 0:
            try:
                comm.send(np.full(4, 1.0), 1, tag=3, timeout=0.3)
                first = "returned"
            except CollectiveTimeoutError:
                first = "timed out"
            except Exception as exc:  # noqa: BLE001 - the defect under test
                first = f"{name_of(exc)}: {exc}"
            comm.send(np.full(4, 2.0), 1, tag=3, timeout=1.0)
            return first
        if comm.rank == 1:
            time.sleep(0.6)
            return float(comm.recv(np.zeros(4), 0, tag=3, timeout=1.0)[0])
        return None

    want = {0: "timed out", 1: 2.0}.get(ctx.rank)
    return Call(body, expect=expecting_value(want), same=False)


def _message_to_a_raising_rank(message):
    """Rank 1's own code raises while rank 0 posts ``message(comm)`` to or from it (before
    rank 1 sent anything): rank 0 hears within a second, not at its message's timeout."""
    def step(ctx: Ctx) -> Call:
        if ctx.rank == 1:
            return Call(boom, expect=raises("RuntimeError"))
        if ctx.rank == 0:
            return Call(message, expect=peer_failed(1, "RuntimeError"))
        return Call(lambda comm: None, expect=ok(None))
    return step


p2p_send_to_raising_rank = _message_to_a_raising_rank(lambda comm: comm.send(np.ones(4), 1))
p2p_recv_from_raising_rank = _message_to_a_raising_rank(lambda comm: comm.recv(np.zeros(4), 1))


def p2p_messages_of_a_rank_that_left(ctx: Ctx) -> Call:
    """The last rank posts two messages to rank 0, then its code raises (it leaves): rank 0
    still receives both, in order, one of them through the first of two receives in flight;
    the second of those, a receive with another tag and a send to the rank raise
    ``PeerFailedError`` at once (not at their timeout); ranks still there exchange messages
    as before, and their collectives raise ``CommunicatorBrokenError``."""
    leaver = ctx.size - 1

    def leave(comm):
        comm.isend(np.full(4, 6.0), 0, tag=8)
        comm.isend(np.full(4, 7.0), 0, tag=8)
        raise RuntimeError("boom after sending")

    def attempt(call) -> str:
        try:
            call()
            return "returned"
        except CollectiveError as exc:
            return name_of(exc) if f"rank {leaver}" in str(exc) else f"{name_of(exc)}: {exc}"

    def stay(comm):
        time.sleep(0.3)  # (it has left by then: its notice may come before or during a call)
        outcomes: list = []
        if comm.rank == 0:
            outcomes.append(float(comm.recv(np.zeros(4), leaver, tag=8)[0]))
            first, extra = (comm.irecv(np.zeros(4), leaver, tag=8) for _ in range(2))
            outcomes.append(float(first.wait()[0]))
            start = time.monotonic()
            outcomes += [attempt(extra.wait),
                         attempt(lambda: comm.recv(np.zeros(4), leaver, tag=9)),
                         attempt(lambda: comm.send(np.ones(4), leaver, tag=8))]
            outcomes.append(time.monotonic() - start < 1.0)
        if comm.size > 2 and comm.rank == 0:
            comm.send(np.full(4, 5.0), 1, tag=2)
        elif comm.size > 2 and comm.rank == 1:
            outcomes.append(float(comm.recv(np.zeros(4), 0, tag=2)[0]))
        # (issued before the notice came: PeerFailedError; after it: CommunicatorBrokenError)
        collective = attempt(lambda: comm.all_reduce(np.ones(2)))
        outcomes.append("refused" if collective in ("PeerFailedError", "CommunicatorBrokenError")
                        else collective)
        return outcomes

    if ctx.rank == leaver:
        return Call(leave, expect=raises("RuntimeError"))
    broken = "refused"
    want = ([6.0, 7.0] + ["PeerFailedError"] * 3 + [True, broken] if ctx.rank == 0
            else [5.0, broken])
    return Call(stay, expect=expecting_value(want), same=False)


def p2p_object_dtype(ctx: Ctx) -> Call:
    """Arrays of Python objects are refused by a send (naming ``x``) and a receive (naming
    ``out``) before anything is posted, as by collectives (thread ranks handed the receiver
    the sender's very objects; MPI raised NumPy's own error from inside the library)."""
    def body(comm):
        if comm.rank == 0:
            comm.send(np.array([{"a": 1}, None], dtype=object), 1, timeout=1.0)
        elif comm.rank == 1:
            comm.recv(np.empty(2, dtype=object), 0, timeout=1.0)
    if ctx.rank > 1:
        return Call(body, expect=ok(None), same=False)
    argument = "x" if ctx.rank == 0 else "out"
    return Call(body, expect=raises("TypeError", match=rf"{argument} has dtype object",
                                    within=0.5), caught=True, same=False)


def p2p_failed_message_after_a_rank_left(ctx: Ctx) -> Call:
    """After the last rank left, a message between ranks 0 and 1 that fails (sent with
    another dtype) is its own failure: rank 0's other receive from rank 1, posted later,
    still takes its message (it was abandoned with the communicator)."""
    def body(comm):
        first = comm.irecv(np.zeros(2), 1, tag=1) if comm.rank == 0 else None
        comm.all_reduce(np.ones(2))
        if comm.rank == 2:
            raise RuntimeError("rank 2 leaves")
        if comm.rank == 1:
            time.sleep(0.3)  # (rank 2 has left)
            try:
                comm.send(np.zeros(2, np.int32), 0, tag=1, timeout=1.0)
            except CollectiveError:
                pass  # (the mismatch is rank 0's to report)
            comm.send(np.full(2, 9.0), 0, tag=2, timeout=2.0)
            return None
        second = comm.irecv(np.zeros(2), 1, tag=2)
        got = []
        for handle in (first, second):
            try:
                got.append(float(handle.wait()[0]))
            except CollectiveError as exc:
                got.append(name_of(exc))
        return got

    if ctx.rank == 2:
        return Call(body, expect=raises("RuntimeError"))
    want = ["CollectiveMismatchError", 9.0] if ctx.rank == 0 else None
    return Call(body, expect=expecting_value(want), same=False)


def leaving_a_with_block(ctx: Ctx) -> Call:
    """On a child communicator, the last rank's error leaves its ``with`` block, then rank 1's
    too, right after it posted a message to rank 0: rank 0 still receives that message (an
    abandoned rank's sends stay posted), and a receive from rank 1 beyond it raises
    ``PeerFailedError`` at once (the second rank to leave told no one: the first had broken
    the child already)."""
    def body(comm):
        child = comm.dup()
        if comm.rank >= 1:
            if comm.rank == 1:
                time.sleep(0.3)  # (after the last rank left)
            try:
                with child:
                    if comm.rank == 1:
                        child.isend(np.full(2, 6.0), 0, tag=1)
                    raise RuntimeError("leaves the block")
            except RuntimeError:
                pass
            comm.barrier()
            return None
        time.sleep(0.6)
        got = [float(child.recv(np.zeros(2), 1, tag=1)[0])]
        start = time.monotonic()
        try:
            child.recv(np.zeros(2), 1, tag=1)
            got.append("received")
        except CollectiveError as exc:
            got.append(name_of(exc))
        got.append(time.monotonic() - start < 1.0)
        comm.barrier()
        return got

    want = [6.0, "PeerFailedError", True] if ctx.rank == 0 else None
    return Call(body, expect=expecting_value(want), same=False)


def p2p_bad_timeout(ctx: Ctx) -> Call:
    """Receives with a bad ``timeout=`` raise naming it before anything is posted: the message
    rank 1 then sends reaches the next good receive."""
    def body(comm):
        if comm.rank == 0:
            outcomes = []
            for timeout in ("soon", -1):
                try:
                    comm.recv(np.zeros(4), 1, timeout=timeout)
                    outcomes.append("returned")
                except (TypeError, ValueError) as exc:
                    outcomes.append(name_of(exc) if "timeout" in str(exc) else str(exc))
            outcomes.append(float(comm.recv(np.zeros(4), 1, timeout=1.0)[0]))
            return outcomes
        if comm.rank == 1:
            time.sleep(0.3)
            comm.send(np.full(4, 1.0), 0)
        return None

    want = ["TypeError", "ValueError", 1.0] if ctx.rank == 0 else None
    return Call(body, expect=expecting_value(want), same=False)


# --- dtypes that are not plain numbers --------------------------------------------------------

def same_bytes(want: np.ndarray):
    def check(got) -> str | None:
        if (isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
                and got.tobytes() == want.tobytes()):
            return None
        described = f"{got.dtype}{got.shape}" if isinstance(got, np.ndarray) else repr(got)
        return f"got {described}, want {want.dtype}{want.shape} with the root's bytes"
    return check


def odd_dtype(method: str, make):
    """Broadcast (or scatter) of ``make(n)``'s dtype from root 0; the others pass None and
    must get the root's dtype and bytes."""
    def step(ctx: Ctx) -> Call:
        if method == "broadcast":
            x = make(COUNT)
            return Call(method, (x if ctx.rank == 0 else None,), {}, ok(check=same_bytes(x)))
        rows = make(ctx.size * 4).reshape(ctx.size, 4)
        return Call(method, (rows if ctx.rank == 0 else None,), {},
                    ok(check=same_bytes(rows[ctx.rank])), same=False)
    return step


ELABORATE = np.dtype([(f"field_{i:02d}_with_a_long_name", "<f8") for i in range(40)])


def elaborate_dtype_broadcast(ctx: Ctx) -> Call:
    """A dtype whose description does not fit the broadcast's opening: refused up front."""
    if ctx.rank == 0:
        return Call("broadcast", (np.zeros(2, ELABORATE),), {},
                    raises("TypeError", match="dtype", within=1.0), caught=True)
    return Call("broadcast", (None,), {}, peer_failed(0, "dtype"), caught=True)


# --- timeouts ---------------------------------------------------------------------------------

def _right(got, want) -> bool:
    return isinstance(got, np.ndarray) and np.array_equal(got, want)


def wait_with_bad_timeout(timeout, error: str):
    """``handle.wait(timeout=<bad>)`` raises naming ``timeout`` and breaks nothing: the same
    handle's ``wait()`` then returns the result, and the next call works."""
    def step(ctx: Ctx) -> Call:
        xs = inputs(ctx)
        want = reference(xs, "sum")

        def body(comm):
            handle = comm.all_reduce(xs[comm.rank], async_op=True)
            try:
                handle.wait(timeout=timeout)
                first = "returned"
            except Exception as exc:  # noqa: BLE001 - judged below
                first = name_of(exc) if "timeout" in str(exc) else f"{name_of(exc)}: {exc}"
            return [first, _right(handle.wait(), want), _right(comm.all_reduce(xs[comm.rank]),
                                                              want)]

        return Call(body, expect=expecting_value([error, True, True]))
    return step


def timeout_as_call_finishes(ctx: Ctx) -> Call:
    """Rank 0 waits 0.1 s on a call rank 1 joins 0.2 s late. Rank 0 may time out (then the
    communicator is broken) or get the result, should the call finish meanwhile: then the
    communicator must still work."""
    xs = inputs(ctx)
    want = reference(xs, "sum")

    def body(comm):
        x = xs[comm.rank]
        try:
            if comm.rank == 0:
                first = _right(comm.all_reduce(x, async_op=True).wait(timeout=0.1), want)
            else:
                time.sleep(0.2)
                first = _right(comm.all_reduce(x), want)
        except CollectiveError as exc:
            first = name_of(exc)
        try:
            second = _right(comm.all_reduce(x), want)
        except CollectiveError as exc:
            second = name_of(exc)
        return [first, second]

    def check(got) -> str | None:
        first, second = got
        if ctx.rank != 0:  # the late ranks may finish, or hear of rank 0's timeout
            return None
        if first is True and second is not True:
            return f"the wait returned the result, yet the next call raised {second}"
        if first not in (True, "CollectiveTimeoutError"):
            return f"the wait gave {first}"
        if first == "CollectiveTimeoutError" and second != "CommunicatorBrokenError":
            return f"after a timeout the next call gave {second}"
        return None

    return Call(body, expect=ok(check=check), same=False)


# --- asynchronous calls -----------------------------------------------------------------------

def async_limit(ctx: Ctx) -> Call:
    """Rank 0 holds the most point-to-point receives in flight (rank 1 answers later): a
    collective is not held back by them (its limit counts collective handles, alike on every
    rank), but rank 0's next receive is refused there alone, when it is issued; then every
    message pairs up and the communicator works."""
    from collectives.runtime.in_flight import MAX_IN_FLIGHT

    def body(comm):
        receives = ([comm.irecv(np.zeros(1), 1, tag=9) for _ in range(MAX_IN_FLIGHT)]
                    if comm.rank == 0 else [])
        x = np.ones(3)
        collective = _right(comm.all_reduce(x, async_op=True).wait(), np.full(3, 2.0))
        outcome = "no receive past the limit"
        if comm.rank == 0:
            try:
                comm.irecv(np.zeros(1), 1, tag=9)
                outcome = "a receive past the limit was issued"
            except CollectiveError as exc:
                outcome = f"{name_of(exc)} at issue: {exc}"
        comm.all_reduce(x)  # (rank 1 sends only after rank 0 has tried)
        if comm.rank == 1:
            sends = [comm.isend(np.zeros(1), 0, tag=9) for _ in range(MAX_IN_FLIGHT)]
            for s in sends:
                s.wait()
        for r in receives:
            r.wait()
        return [collective, outcome, _right(comm.all_reduce(x), np.full(3, 2.0))]

    def check(got) -> str | None:
        collective, outcome, after = got
        if collective is not True:
            return f"rank {ctx.rank}: the collective beside the receives gave {collective}"
        want = r"CollectiveError at issue: .*in flight" if ctx.rank == 0 else "no receive"
        if not re.match(want, outcome, re.S):
            return f"rank {ctx.rank}: {outcome!r}, want {want!r}"
        return None if after is True else f"the next call gave {after}"

    return Call(body, expect=ok(check=check), same=False)


def settle(refs: list, seconds: float = 1.0) -> int:
    """How many of ``refs`` still live once collected (other ranks' threads may hold a
    failed call's error, and so its cycle of frames, for a moment: give them a second)."""
    deadline = time.monotonic() + seconds
    while True:
        gc.collect()
        alive = sum(r() is not None for r in refs)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def failed_async_released(ctx: Ctx) -> Call:
    """40 asynchronous all-reduces that fail (the last rank passes another dtype), each
    finished, then waited for and dropped: none stays held (its input is freed), and none is reported again
    by a later call."""
    def body(comm):
        odd = comm.rank == comm.size - 1
        refs, errors = [], set()
        for _ in range(40):
            x = np.ones(1000, np.float32 if odd else np.float64)
            refs.append(weakref.ref(x))
            handle = comm.all_reduce(x, async_op=True)
            while not handle.is_completed():  # (it fails before anyone waits for it)
                time.sleep(0.001)
            try:
                handle.wait()
            except CollectiveError as exc:
                errors.add(name_of(exc))
            del handle, x
        alive = settle(refs)
        try:
            after = _right(comm.all_reduce(np.ones(4)), np.full(4, float(comm.size)))
        except CollectiveError as exc:
            after = f"{name_of(exc)}: {exc}"
        return [sorted(errors), alive, after]

    return Call(body, expect=expecting_value([["CollectiveMismatchError"], 0, True]))


# --- prepared calls ---------------------------------------------------------------------------

def prepared_mismatch_twice(ctx: Ctx) -> Call:
    """A prepared all-reduce whose ranks disagree on the shape fails its agreement at every
    start (never skipping it after the first failure), and the communicator stays usable."""
    def body(comm):
        odd = comm.rank == comm.size - 1
        x = np.ones(COUNT + odd)
        prepared = comm.all_reduce_init(x, out=np.empty_like(x))
        outcomes = []
        for _ in range(2):
            try:
                prepared.start().wait()
                outcomes.append("returned")
            except CollectiveError as exc:
                outcomes.append(name_of(exc))
        try:
            outcomes.append(_right(comm.all_reduce(np.ones(COUNT)),
                                   np.full(COUNT, float(comm.size))))
        except CollectiveError as exc:
            outcomes.append(name_of(exc))
        return outcomes

    return Call(body, expect=expecting_value(["CollectiveMismatchError"] * 2 + [True]))


def prepared_failed_start(ctx: Ctx) -> Call:
    """A prepared call's ``start()`` that fails (here the communicator broke after a timeout)
    leaves nothing to wait for: ``wait()`` raises its error (it returned the last run's
    ``out`` without a word, though the input had changed since)."""
    def body(comm):
        x, out = np.ones(COUNT), np.zeros(COUNT)
        prepared = comm.all_reduce_init(x, out=out)
        outcomes = [_right(prepared.start().wait(), np.full(COUNT, float(comm.size)))]
        if comm.rank == 1:
            time.sleep(0.6)
        try:  # rank 0 times out: the communicator breaks on every rank
            comm.all_reduce(np.ones(3), timeout=0.2)
        except CollectiveError:
            pass
        x[:] = 50.0
        for then in (prepared.start, prepared.wait):
            try:
                then()
                outcomes.append("returned")
            except CollectiveError as exc:
                outcomes.append(name_of(exc))
        return outcomes

    return Call(body, expect=expecting_value([True, "CommunicatorBrokenError",
                                              "CommunicatorBrokenError"]))


# --- timeouts told by a peer, logging ---------------------------------------------------------

def told_of_a_timeout(ctx: Ctx) -> Call | None:
    """The last rank never calls; rank 0 times out first (0.5 s) and tells rank 1 (3 s):
    rank 1's error is a PeerFailedError *and* a CollectiveTimeoutError naming the missing
    rank, at once."""
    last = ctx.size - 1
    if ctx.rank == last:
        return None
    x = inputs(ctx)[ctx.rank]
    if ctx.rank != 1:
        return Call("all_reduce", (x,), {"timeout": 0.5},
                    raises("CollectiveTimeoutError", within=1.5))

    def body(comm):
        try:
            comm.all_reduce(x, timeout=3.0)
            return "returned"
        except Exception as exc:  # noqa: BLE001 - judged below
            kinds = sorted(c.__name__ for c in type(exc).__mro__
                           if c.__name__ in ("PeerFailedError", "CollectiveTimeoutError"))
            return [kinds, list(getattr(exc, "missing", []))]

    want = expecting_value([["CollectiveTimeoutError", "PeerFailedError"], [last]])
    return Call(body, expect=Expect(want.outcomes, within=1.5))


def detail_logs_every_call(ctx: Ctx) -> Call:
    """With ``COLLECTIVES_DEBUG=detail`` each rank logs every call it makes: the repeated
    small all-reduces (MPI's fast path) and a prepared call's starts among them."""
    def body(comm):
        lines: list[str] = []

        class Keep(logging.Handler):
            def emit(self, record):
                text = record.getMessage()
                if text.startswith(f"rank {comm.rank}: call") and "all_reduce(float64[" in text:
                    lines.append(text)

        top = logging.getLogger("collectives")
        level, handlers = top.level, list(top.handlers)
        keep = Keep(logging.DEBUG)
        calls = logging.getLogger("collectives.calls")
        calls.addHandler(keep)
        os.environ["COLLECTIVES_DEBUG"] = "detail"
        try:
            child = comm.dup()  # reads the setting
            child.barrier()  # every rank made its child before the setting goes
        finally:
            os.environ.pop("COLLECTIVES_DEBUG", None)
        try:
            for _ in range(5):
                child.all_reduce(np.ones(4))
            prepared = child.all_reduce_init(np.ones(3), out=np.empty(3))
            for _ in range(3):
                prepared.start().wait()
            child.barrier()  # every rank logged before the logger is restored
        finally:
            calls.removeHandler(keep)
            top.setLevel(level)
            top.handlers[:] = handlers
        return [sum("[4]" in line for line in lines), sum("[3]" in line for line in lines)]

    return Call(body, expect=expecting_value([5, 3]))
