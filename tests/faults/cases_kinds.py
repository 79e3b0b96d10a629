"""The fault matrix over call kinds: every way of reducing a tensor list (plain calls, asynchronous
calls, a fused batch blocking and asynchronous, a batch tensor by tensor, buckets, prepared calls,
a sub-communicator) under every fault: a bad argument on one rank, lists that differ after both
were agreed (order, length, zero-size tensors), a missing rank with the call's own
``timeout=``, a rank whose code raises with calls in flight, and a wait refused for its
``timeout=``. Each cell: an error
on every rank naming the cause (and the failing rank), within a second or the call's own
timeout; nothing hangs; nothing wrong.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable

import ml_dtypes
import numpy as np

from collectives.ops import ReduceOp, result_dtype
from faults.kit import Call, Case, Ctx, ok, raises
from faults.steps import bucket_step, peer_failed

CASES: list[Case] = []
BOTH = ("threads", "mpi")
SIZES = (2, 3)
COMM_TIMEOUT = 5.0  # the communicator's: every cell must end well before it
CALL_TIMEOUT = 1.0  # the call's own, where a cell passes one

Run = Callable[..., list]


def _plain(comm, xs, op="sum", timeout=None):
    return [comm.all_reduce(x, op, timeout=timeout) for x in xs]


def _async(comm, xs, op="sum", timeout=None):
    handles = [comm.all_reduce(x, op, timeout=timeout, async_op=True) for x in xs]
    return [h.wait() for h in handles]


def _batch(comm, xs, op="sum", timeout=None):
    return comm.batch_all_reduce(xs, op, timeout=timeout)


def _batch_async(comm, xs, op="sum", timeout=None):
    return comm.batch_all_reduce(xs, op, timeout=timeout, async_op=True).wait()


def _batch_unfused(comm, xs, op="sum", timeout=None):
    return comm.batch_all_reduce(xs, op, timeout=timeout, bucket_bytes=0)


def _buckets(comm, xs, op="sum", timeout=None):
    return bucket_step(comm, xs, None, op, timeout=timeout, bucket_bytes=0)


def _prepared(comm, xs, op="sum", timeout=None):
    outs = [np.empty(x.shape, _result_dtype(op, x.dtype)) for x in xs]
    calls = [comm.all_reduce_init(x, op, out=o, timeout=timeout) for x, o in zip(xs, outs)]
    for call in calls:
        call.start().wait(timeout)
    return outs


def _result_dtype(op, dtype):
    """The dtype of ``op``'s result (an integer MEAN's is float64); a bad ``op``'s, the input's:
    the call itself must refuse it (a raise here would leave the peers waiting)."""
    try:
        return result_dtype(ReduceOp.parse(op), dtype)
    except (TypeError, ValueError):
        return dtype


SUBS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _subcomm(comm, xs, op="sum", timeout=None):
    sub = SUBS.get(comm)
    if sub is None:  # (split once, in the first step: every rank is there)
        sub = SUBS[comm] = comm.split(0)
    return _batch(sub, xs, op, timeout)


KINDS: dict[str, Run] = {"plain": _plain, "async": _async, "batch": _batch,
                         "batch-async": _batch_async, "batch-unfused": _batch_unfused,
                         "buckets": _buckets, "prepared": _prepared, "subcomm": _subcomm}


def tensors(ctx: Ctx, shapes) -> list[np.ndarray]:
    """This rank's tensors: small integers, so every sum is exact in any order."""
    return [np.full(s, float(ctx.rank + 1 + k), np.float32) for k, s in enumerate(shapes)]


def sums(ctx: Ctx, shapes) -> list[np.ndarray]:
    total = sum(range(1, ctx.size + 1))
    return [np.full(s, float(total + ctx.size * k), np.float32) for k, s in enumerate(shapes)]


def run(kind: str, shapes, **kwargs) -> Callable[[Ctx], Call]:
    """Every rank reduces its tensors of ``shapes`` with ``kind``: the reference sums."""
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, shapes)
        return Call(lambda comm: KINDS[kind](comm, xs, **kwargs), expect=ok(sums(ctx, shapes)))
    return step


# --- a bad argument on one rank, after the list was agreed: peers hear at once -----------------

L = [(2, 3), (5,), (3, 2)]
ASYNC_KINDS = ("async", "buckets", "prepared")  # the kinds that issue a call before waiting


def bad_op_on(kind: str, bad_rank: int = 0):
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, L)
        # (an asynchronous kind may learn of the verdict while issuing its next call: a
        # broken communicator then, and the error says by what)
        broken = raises("CommunicatorBrokenError", match="median", within=1.0)
        if ctx.rank == bad_rank:
            expect = raises("ValueError", match="median", within=1.0)
            return Call(lambda comm: KINDS[kind](comm, xs, op="median"),
                        expect=expect | broken if kind in ASYNC_KINDS else expect)
        expect = peer_failed(bad_rank, "median")
        if kind in ASYNC_KINDS:
            expect = expect | raises("CommunicatorBrokenError", match=rf"rank {bad_rank}\b.*median",
                                     within=1.0)
        return Call(lambda comm: KINDS[kind](comm, xs), expect=expect)
    return step


for kind in KINDS:
    CASES.append(Case(f"kinds-{kind}-bad-arg-one-rank", (run(kind, L), bad_op_on(kind)),
                      where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))

# --- a dtype no op reduces, on every rank: refused at once, and nothing breaks ---------------------


def unreducible(kind: str):
    """ml_dtypes' float8_e5m2 (its kind "f", where its siblings' is "V") was reduced in eight
    bits; it is refused like them, on every rank, before any data moves."""
    def step(ctx: Ctx) -> Call:
        xs = [x.astype(ml_dtypes.float8_e5m2) for x in tensors(ctx, L)]
        return Call(lambda comm: KINDS[kind](comm, xs),
                    expect=raises("TypeError", match="float8_e5m2, which cannot be reduced",
                                  within=1.0), caught=True)
    return step


for kind in KINDS:
    CASES.append(Case(f"kinds-{kind}-unreducible-dtype", (run(kind, L), unreducible(kind),
                                                          run(kind, L)),
                      where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))

# --- lists that differ after both were agreed: a mismatch on every rank --------------------------

L1, L2 = [(2, 3), (3, 2)], [(3, 2), (2, 3)]  # the same sizes in another order
# MPI pairs the starts of a persistent all-reduce by request, not by start order, and the
# check riding in its data is the signature's: two agreed calls started in other orders on
# two ranks each meet their own kind, and return (right sums, wrong order of calls)
PERSISTENT_ORDER = (("mpi", "the check riding in a persistent all-reduce carries no call "
                            "number: asynchronous calls started in other orders pair by request"),)
LONG, SPLIT = [(6,)], [(3,), (3,)]  # one tensor against two of half its size
# zero-size tensors move no data, so no check rides with them: two empty shapes, and an empty
# tensor against data (thread ranks returned at once, beside peers that waited them out)
EMPTY, EMPTY_FLAT, SOME = [(0, 3)], [(0,)], [(3,)]


def differing(kind: str, mine, theirs):
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, mine if ctx.rank == 0 else theirs)
        # (an asynchronous kind may learn of it while issuing its next call: the
        # communicator is broken then, and the error says by what)
        return Call(lambda comm: KINDS[kind](comm, xs),
                    expect=raises("CollectiveMismatchError", "PeerFailedError", within=1.0)
                    | raises("CommunicatorBrokenError", match="CollectiveMismatchError",
                             within=1.0), same=False)
    return step


for kind in KINDS:
    for name, (first, second) in {"order": (L1, L2), "length": (LONG, SPLIT),
                                  "zero-size-shape": (EMPTY, EMPTY_FLAT),
                                  "zero-size-beside-data": (EMPTY_FLAT, SOME)}.items():
        CASES.append(Case(f"kinds-{kind}-mismatch-{name}-after-agreement",
                          (run(kind, first), run(kind, second), differing(kind, first, second)),
                          where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0,
                          xfail=PERSISTENT_ORDER if (kind, name) == ("async", "order") else ()))

# --- a missing rank: the call's own timeout bounds every wait ------------------------------------


def missing_last(kind: str):
    def step(ctx: Ctx) -> Call | None:
        if ctx.rank == ctx.size - 1:
            return None  # this rank stays away
        xs = tensors(ctx, L)
        return Call(lambda comm: KINDS[kind](comm, xs, timeout=CALL_TIMEOUT),
                    expect=raises("CollectiveTimeoutError", "PeerFailedError",
                                  within=CALL_TIMEOUT + 1.5))
    return step


for kind in KINDS:
    CASES.append(Case(f"kinds-{kind}-own-timeout", (run(kind, L), missing_last(kind)),
                      where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))

# --- a rank whose own code raises with calls in flight: its peers hear at once -------------------


def raising_midway(kind: str):
    """Rank 0 issues its first bucket (asynchronous kinds) or nothing, then its code raises."""
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, L)
        if ctx.rank != 0:
            # (or, where it learns of it while issuing its next call, a broken communicator
            # that says why)
            expect = peer_failed(0, "RuntimeError") | raises(
                "CommunicatorBrokenError", match=r"rank 0\b.*RuntimeError", within=1.0)
            if kind == "batch-async":  # (rank 0 issued the whole batch: it may finish)
                expect = expect | ok(sums(ctx, L))
            return Call(lambda comm: KINDS[kind](comm, xs), expect=expect, same=False)

        def body(comm):
            if kind == "async":
                comm.all_reduce(xs[0], async_op=True)
            elif kind == "buckets":
                comm.buckets(xs, bucket_bytes=0).ready(0, xs[0])
            elif kind == "batch-async":
                comm.batch_all_reduce(xs, async_op=True)
            raise RuntimeError("boom in the rank's own code, calls in flight")
        return Call(body, expect=raises("RuntimeError"))
    return step


for kind in KINDS:
    CASES.append(Case(f"kinds-{kind}-raising-rank", (run(kind, L), raising_midway(kind)),
                      where=("threads",), sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))

# --- a wait refused for its timeout: the call is still in flight, and still unwaited ------------


def _refused_wait(wait) -> str:
    try:
        wait(timeout=-1)
    except ValueError as exc:
        return "refused" if "timeout" in str(exc) else f"ValueError: {exc}"
    return "accepted"


def _issue(kind: str, comm, xs):
    """Issue ``xs``'s calls as ``kind`` does; return (the first wait, the ones for the result, a
    second issue, which must be refused until the first is waited for, or None)."""
    if kind == "async":
        handles = [comm.all_reduce(x, async_op=True) for x in xs]
        return handles[0].wait, lambda: [h.wait() for h in handles], None
    if kind == "batch-async":
        handle = comm.batch_all_reduce(xs, async_op=True)
        return handle.wait, handle.wait, None
    if kind == "buckets":
        buckets = comm.buckets(xs, bucket_bytes=0)
        for k, x in enumerate(xs):
            buckets.ready(k, x)
        return buckets.wait, buckets.wait, None  # (a ready() again would end the step)
    outs = [np.empty_like(x) for x in xs]
    calls = [comm.all_reduce_init(x, out=o) for x, o in zip(xs, outs)]
    for call in calls:
        call.start()
    return calls[0].wait, lambda: [call.wait() for call in calls], calls[0].start


def bad_wait_timeout(kind: str):
    """Every rank's wait(timeout=-1) raises ValueError naming ``timeout``, and breaks nothing: a
    second start of the same call is refused as before any wait (a prepared call's let a
    second run share the first's buffers: wrong sums on thread ranks), and the right wait
    returns the right sums."""
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, L)

        def body(comm):
            first, results, again = _issue(kind, comm, xs)
            said = [_refused_wait(first)]
            if again is not None:
                try:
                    again()
                    said.append("second start accepted")
                except Exception as exc:  # noqa: BLE001 - judged below
                    said.append("refused" if "again" in str(exc) or "already" in str(exc)
                                else f"{type(exc).__name__}: {exc}")
            if said != ["refused"] * len(said):
                raise AssertionError(f"{kind}: {said}")
            return results()
        return Call(body, expect=ok(sums(ctx, L), within=2.0))
    return step


for kind in ("async", "batch-async", "buckets", "prepared"):
    CASES.append(Case(f"kinds-{kind}-bad-wait-timeout", (run(kind, L), bad_wait_timeout(kind)),
                      where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))



def late_bad_ready(ctx: Ctx) -> Call:
    """Rank 0 marks a tensor ready twice once every bucket has started: a ValueError, and its
    step is over (its buckets in flight pair with its peers', who get their sums); the next
    ``ready`` is the next step's on every rank (it said "already marked ready" before)."""
    xs = tensors(ctx, L)
    step1 = sums(ctx, L)

    def body(comm):
        buckets = comm.buckets(xs, bucket_bytes=0)
        for k, x in enumerate(xs):
            buckets.ready(k, x)
        if comm.rank == 0:
            try:
                buckets.ready(1, xs[1])
                raise AssertionError("a second ready(1, x) was accepted")
            except ValueError as exc:
                assert "already marked ready" in str(exc), exc
        else:
            got = buckets.wait()
            assert all(np.array_equal(g, w) for g, w in zip(got, step1)), got
        for k, x in enumerate(xs):
            buckets.ready(k, 2 * x)
        return buckets.wait()
    return Call(body, expect=ok([2 * s for s in step1], within=2.0))


CASES.append(Case("buckets-step-over-after-a-late-bad-ready", (run("buckets", L), late_bad_ready),
                  where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))

# --- the broken promises of the training step, one case each ------------------------------------

XS = [(4,), (3, 2)]


def one_rank_bad_batch(bad_kwargs: dict, error: str, match: str, bad_xs=None):
    """Rank 0 passes a bad argument to a batch its peers make right (the list agreed before):
    rank 0 raises ``error`` naming it, its peers ``PeerFailedError`` naming rank 0, within 1 s."""
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, XS)
        if ctx.rank == 0:
            mine = bad_xs(xs) if bad_xs is not None else xs
            return Call(lambda comm: comm.batch_all_reduce(mine, **bad_kwargs),
                        expect=raises(error, match=match, within=1.0))
        return Call(lambda comm: comm.batch_all_reduce(xs), expect=peer_failed(0, match))
    return step


BATCH = run("batch", XS)
ONE_RANK_BAD_BATCH = {
    "bucket-bytes-negative": ({"bucket_bytes": -1}, "ValueError", "bucket_bytes=-1", None),
    "bucket-bytes-text": ({"bucket_bytes": "64M"}, "TypeError", "bucket_bytes='64M'", None),
    "bucket-bytes-none": ({"bucket_bytes": None}, "TypeError", "bucket_bytes=None", None),
    "xs-none": ({}, "TypeError", "xs must be a list", lambda xs: None),
    "masked-in-batch": ({}, "TypeError", "MaskedArray",
                        lambda xs: [np.ma.masked_array(xs[0]), xs[1]]),
    "complex-max": ({"op": "max"}, "TypeError", "complex",
                    lambda xs: [x.astype(np.complex64) for x in xs]),
    "bad-op": ({"op": "median"}, "ValueError", "median", None),
    "mixed-libraries": ({}, "TypeError", "one library", lambda xs: [xs[0], _jax(xs[1])]),
}


def _jax(x):
    import jax.numpy as jnp  # (imported here: only these cases pay JAX's start)

    return jnp.asarray(x)


JAX_START = 110.0  # seconds JAX's first import may take: it compiles its modules in a fresh venv


def jax_loaded(ctx: Ctx) -> Call:
    """Rank 0, the one rank these cases give a JAX array, imports JAX first, and every rank
    waits for it at a barrier: its start takes seconds and is not part of what is timed. (Only
    rank 0: the others never touch JAX, and each import costs seconds of CPU.)"""
    def load(comm) -> None:
        if ctx.rank == 0:
            _jax(np.zeros(1))
        comm.barrier(timeout=JAX_START)
    return Call(load, expect=ok(check=lambda _: None))


for name, (kwargs, error, match, bad_xs) in ONE_RANK_BAD_BATCH.items():
    first = (jax_loaded, BATCH) if name == "mixed-libraries" else (BATCH,)
    # (a hang limit, not a bound: JAX's first import in a fresh environment compiles its
    # modules, once more than 30 s on a loaded 2-core machine)
    CASES.append(Case(f"batch-one-rank-bad-{name}",
                      (*first, one_rank_bad_batch(kwargs, error, match, bad_xs)),
                      where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT,
                      limit=120.0 if name == "mixed-libraries" else 30.0))


def masked_plain(ctx: Ctx) -> Call:
    x = np.full(5, float(ctx.rank + 1))
    if ctx.rank == 0:
        return Call("all_reduce", (np.ma.masked_array(x),),
                    expect=raises("TypeError", match="MaskedArray", within=1.0))
    return Call("all_reduce", (x,), expect=peer_failed(0, "MaskedArray"))


def jax_out(ctx: Ctx) -> Call:
    x = np.full(5, float(ctx.rank + 1))
    if ctx.rank == 0:
        out = _jax(x)  # made before the call: only the call is timed
        return Call(lambda comm: comm.all_reduce(x, out=out),
                    expect=raises("TypeError", match="out", within=1.0))
    return Call("all_reduce", (x,), expect=peer_failed(0, "out"))


CASES.append(Case("plain-one-rank-jax-out", (jax_loaded, run("plain", [(5,)]), jax_out), where=BOTH,
                  sizes=SIZES, timeout=COMM_TIMEOUT, limit=30.0))
CASES.append(Case("plain-one-rank-masked", (run("plain", [(5,)]), masked_plain), where=BOTH,
                  sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))


def bad_ready_index(ctx: Ctx) -> Call:
    """Rank 0 marks tensor 1.5 ready: it raises naming ``k``; its peers hear of it."""
    xs = tensors(ctx, XS)
    if ctx.rank != 0:
        # (a peer may learn of the verdict while issuing its next bucket: a broken
        # communicator then, and the error says by what, as ``bad_op_on``'s)
        return Call(lambda comm: KINDS["buckets"](comm, xs),
                    expect=peer_failed(0, "k=1.5") | raises(
                        "CommunicatorBrokenError", match=r"rank 0\b.*k=1\.5", within=1.0))

    def body(comm):
        comm.buckets(xs, bucket_bytes=0).ready(1.5, xs[1])
    return Call(body, expect=raises("TypeError", match="k=1.5", within=1.0))


CASES.append(Case("buckets-one-rank-bad-ready-index", (run("buckets", XS), bad_ready_index),
                  where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))


def too_many_buckets(kind: str):
    """An asynchronous batch, or buckets, of more buckets than the in-flight limit: refused on
    every rank before any bucket is issued, as a ValueError saying how many and naming the
    knob, and the communicator still works (the batch said the rank had too many handles
    unwaited, with none; the buckets issued 1024 of theirs, then said so: a wait() cannot come
    before the last bucket)."""
    from collectives.runtime.in_flight import MAX_IN_FLIGHT

    def step(ctx: Ctx) -> Call:
        xs = [np.full(2, float(ctx.rank + 1), np.float32) for _ in range(MAX_IN_FLIGHT + 1)]

        def body(comm):
            try:
                if kind == "buckets":
                    bucket_step(comm, xs, bucket_bytes=0)
                else:
                    comm.batch_all_reduce(xs, bucket_bytes=0, async_op=True)
            except Exception as exc:  # noqa: BLE001 - what it says is the outcome
                refusal = f"{type(exc).__name__}: {exc}"
            else:
                return "issued"
            after = comm.all_reduce(np.ones(3))
            return refusal if float(after[0]) == ctx.size else f"then wrong: {after}"

        def refused(got) -> str | None:
            said = (f"ValueError: the list makes {MAX_IN_FLIGHT + 1} buckets" if kind == "buckets"
                    else f"ValueError: this asynchronous batch would issue {MAX_IN_FLIGHT + 1} "
                    "calls")
            return None if got.startswith(said) and "bucket_bytes" in got else f"got {got!r}"
        return Call(body, expect=ok(check=refused), same=False)
    return step


for kind in ("batch-async", "buckets"):
    CASES.append(Case(f"{kind}-over-the-limit-refused-up-front", (too_many_buckets(kind),),
                      where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))


def waited_twice(ctx: Ctx) -> Call:
    """Every handle's ``wait()`` of one run returns the same result, however often it is asked
    (MEAN: a second wait must not divide again): asynchronous calls, an asynchronous batch,
    and prepared all-reduce and reduce, started three times each (on MPI they take the hot
    path, whose run a wait finishes)."""
    x = np.full(4, float(ctx.rank + 1))

    def body(comm):
        handles = [comm.all_reduce(x, "mean", async_op=True),
                   comm.batch_all_reduce([x, x], "mean", async_op=True)]
        got = [[np.array(h.wait(), copy=True) for _ in range(3)] for h in handles]
        prepared = [comm.all_reduce_init(x, "mean", out=np.empty(4)),
                    comm.reduce_init(x, "mean", root=0, out=np.empty(4))]
        for call in prepared:
            for _ in range(3):
                call.start()
                got.append([np.array(call.wait(), copy=True) for _ in range(3)])
        return [float(np.asarray(r).reshape(-1)[0]) if r.dtype != object else None
                for waits in got for r in waits]

    mean = (ctx.size + 1) / 2  # (exact: halves)
    want = [mean] * 15 + [mean if ctx.rank == 0 else None] * 9
    return Call(body, expect=ok(check=lambda got: None if got == want else
                                f"got {got}, want {want}"), same=False)


CASES.append(Case("every-wait-of-a-run-returns-its-result", (waited_twice,), where=BOTH,
                  sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))


def dropped_failure(bad: str):
    """Every rank issues an asynchronous all-reduce and drops its handle unwaited; it fails
    (rank 0's ``out=`` does not fit, after the signature was agreed: on rank 0 alone; or
    rank 0's dtype cannot be reduced: on every rank). The next calls run, with their sums, on
    every rank: the failure raised at the next call made that call go unissued on the ranks
    that had heard of it, so that the ranks' calls paired off by one (wrong sums, no error)."""
    def step(ctx: Ctx) -> Call:
        x = np.full(4, float(ctx.rank + 1))
        out = np.empty(5) if bad == "out" and ctx.rank == 0 else None
        if bad == "dtype" and ctx.rank == 0:
            x = x.astype(object)

        def body(comm):
            if bad == "out":
                comm.all_reduce(np.ones(4))  # (agreed: the bad out= fails on rank 0 alone)
            comm.all_reduce(x, out=out, async_op=True)  # dropped at once
            time.sleep(0.2)  # (it fails meanwhile)
            gc.collect()
            return [float(comm.all_reduce(np.full(4, 10.0 * k))[0]) for k in (1, 2, 3)]

        want = [10.0 * k * ctx.size for k in (1, 2, 3)]
        return Call(body, expect=ok(check=lambda got: None if got == want else
                                    f"got {got}, want {want}"))
    return step


for bad in ("out", "dtype"):
    CASES.append(Case(f"dropped-failed-handle-{bad}-later-calls-pair-alike", (dropped_failure(bad),),
                      where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))
