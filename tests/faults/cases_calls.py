"""Fault cases about calls beyond plain blocking collectives: point-to-point messages, every
root-taking call, dtypes that are not plain numbers, ``timeout=`` everywhere, asynchronous and
prepared calls, Python objects, logging, and the multi-device calls' own arguments.
``faults.table`` gathers them (``CASES``: SPMD; ``MULTI``: multi-device).
"""

from __future__ import annotations

import threading
import time

import ml_dtypes
import numpy as np

from collectives.tools.reference import reference
from faults import calls_bodies as cb
from faults.cases_inputs import read_only
from faults.kit import Call, Case, Ctx, ok, raises
from faults.steps import COUNT, bad, good, inputs, peer_failed

CASES: list[Case] = []
MULTI: list[Case] = []
THREADS = {"where": ("threads",)}


def add(name: str, *steps, **meta) -> None:
    CASES.append(Case(name, steps, **meta))


def add_multi(name: str, step, **meta) -> None:
    MULTI.append(Case(name, (step,), where=("multi",), **meta))


def then_usable(ctx: Ctx) -> Call:
    return good(seed=7)(ctx)


X = np.arange(COUNT, dtype=np.float64)

# --- point-to-point: withdrawn receives and sends, a receiver that raised, bad timeouts --------

add("p2p-withdrawn-recv-loses-nothing", cb.p2p_after_withdrawn_recv, timeout=2.0, limit=14)
for count, size in ((4, "small"), (100_000, "large")):
    add(f"p2p-header-came-as-withdrawn-loses-nothing-{size}", cb.p2p_header_came_as_withdrawn(count),
        where=("mpi",), timeout=2.0, limit=14)
add("p2p-withdrawn-send", cb.p2p_send_withdrawn, timeout=2.0, limit=8, **THREADS)
add("p2p-send-to-raising-rank", cb.p2p_send_to_raising_rank, timeout=5.0, **THREADS)
add("p2p-recv-from-raising-rank", cb.p2p_recv_from_raising_rank, timeout=5.0, **THREADS)
add("p2p-messages-of-a-rank-that-left", cb.p2p_messages_of_a_rank_that_left, timeout=5.0,
    sizes=(2, 3), **THREADS)
add("p2p-failed-message-after-a-rank-left", cb.p2p_failed_message_after_a_rank_left,
    timeout=5.0, **THREADS)
add("p2p-leaving-with-blocks", cb.leaving_a_with_block, timeout=5.0, sizes=(3,))
add("p2p-recv-bad-timeout", cb.p2p_bad_timeout, timeout=2.0, limit=8)
add("p2p-object-dtype", cb.p2p_object_dtype, timeout=2.0, limit=8)

# --- every root-taking call checks its root --------------------------------------------------

for root, error in ((3, "ValueError"), (-1, "ValueError"), (1.5, "TypeError"), (True, "TypeError")):
    add(f"bad-root-gather-{root}", bad("gather", X, root=root, error=error, match="root"),
        then_usable, timeout=2.0)
add("bad-root-scatter", bad("scatter", np.ones((3, 2)), root=3, error="ValueError",
                            match="root=3"), then_usable, timeout=2.0)
add("bad-root-broadcast-object", bad("broadcast_object", "hello", root=3, error="ValueError",
                                     match="root=3"), then_usable, timeout=2.0)
add("bad-root-reduce-init", bad("reduce_init", X, root=-1, error="ValueError", match="root=-1"),
    then_usable, timeout=2.0)


def _one_rank_bad_gather_root(ctx: Ctx) -> Call:
    if ctx.rank == 1:
        return Call("gather", (X,), {"root": 1.5}, raises("TypeError", match="root", within=1.0),
                    caught=True)
    return Call("gather", (X,), {"root": 0}, peer_failed(1, "TypeError"), caught=True)


add("one-rank-bad-gather-root", _one_rank_bad_gather_root, then_usable, timeout=2.0)

# --- dtypes that are not plain numbers: broadcast and scatter carry the whole dtype -------------

PAIR = np.dtype([("a", "<i4"), ("b", "<f8")])
ODD_DTYPES = {
    "structured": lambda n: np.array([(i, i / 2) for i in range(n)], PAIR),
    "float8": lambda n: np.arange(n, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn),
    "int4": lambda n: (np.arange(n) % 7).astype(ml_dtypes.int4),
}
for name, make in ODD_DTYPES.items():
    add(f"dtype-{name}-broadcast", cb.odd_dtype("broadcast", make), then_usable)
    add(f"dtype-{name}-scatter", cb.odd_dtype("scatter", make), then_usable)
add("dtype-too-elaborate-broadcast", cb.elaborate_dtype_broadcast, then_usable, timeout=2.0)

# --- timeout= is checked everywhere, and a timeout never breaks a finished call ---------------

add("wait-timeout-negative", cb.wait_with_bad_timeout(-1, "ValueError"))
add("wait-timeout-string", cb.wait_with_bad_timeout("soon", "TypeError"))
# The same all-reduce again (MPI: the fast path of repeated small calls), then bad timeouts.
add("fast-path-timeout-negative", good(), good(),
    bad("all_reduce", X, timeout=-1, error="ValueError", match="timeout"), then_usable)
add("fast-path-timeout-string", good(), good(),
    bad("all_reduce", X, timeout="soon", error="TypeError", match="timeout"), then_usable)
add("wait-timeout-on-finishing-call", cb.timeout_as_call_finishes, timeout=3.0, limit=12,
    sizes=(2,))

# --- asynchronous calls: the limit on calls in flight, and failed calls do not pile up ---------

add("async-limit-agreed", cb.async_limit, timeout=5.0, limit=30, sizes=(2,))
add("async-failed-calls-released", cb.failed_async_released, timeout=2.0)

# --- prepared calls ---------------------------------------------------------------------------

add("prepared-failed-agreement-agrees-again", cb.prepared_mismatch_twice, timeout=2.0)
add("bad-broadcast-init-read-only-x",
    bad("broadcast_init", read_only(X), error="ValueError", match="x is read-only"), then_usable)


# Making a prepared call or buckets makes no call of its own but is a step every rank takes: a
# bad argument on one rank raises there on every rank, and the ranks' later calls still pair
# (refused through the peers' next call, whatever it was, every later call met the peers' next
# one: 101 and 301 where 1 and 201 were right, without a word).
MAKING = {
    "all-reduce-init": lambda comm, bad: comm.all_reduce_init(
        X, out=np.empty(3) if bad else np.empty_like(X)),
    "reduce-init": lambda comm, bad: comm.reduce_init(X, root=-1 if bad else 0,
                                                      out=np.empty_like(X)),
    "broadcast-init": lambda comm, bad: comm.broadcast_init(read_only(X) if bad else X.copy()),
    "all-gather-init": lambda comm, bad: comm.all_gather_init(
        X, out=np.empty(3) if bad else np.empty(comm.size * COUNT)),
    "reduce-scatter-init": lambda comm, bad: comm.reduce_scatter_init(
        np.ones(2 * comm.size), out=np.empty(3) if bad else np.empty(2)),
    "buckets": lambda comm, bad: comm.buckets([X], bucket_bytes=-1 if bad else 0),
}


def _one_rank_bad_making(make):
    def step(ctx: Ctx) -> Call:
        if ctx.rank == 1:
            return Call(lambda comm: make(comm, True), expect=raises(
                "ValueError", "TypeError", within=1.0), caught=True)
        return Call(lambda comm: make(comm, False), expect=peer_failed(1, "Error"),
                    caught=True, same=False)
    return step


for name, make in MAKING.items():
    add(f"one-rank-bad-{name}-then-plain-calls", _one_rank_bad_making(make), good(seed=7),
        good(seed=8), timeout=2.0)
add("prepared-failed-start-leaves-nothing-to-wait-for", cb.prepared_failed_start, timeout=2.0,
    sizes=(2,))

# --- objects, mismatches found in the data, timeouts told by a peer, logging ------------------


def _unpicklable_on_one_rank(ctx: Ctx) -> Call:
    if ctx.rank == 1:
        return Call("all_gather_object", (threading.Lock(),), {},
                    raises("TypeError", match="pickle", within=1.0), caught=True)
    return Call("all_gather_object", (ctx.rank,), {}, peer_failed(1, "pickle"), caught=True)


add("all-gather-object-unpicklable", _unpicklable_on_one_rank, then_usable, timeout=3.0)


def _unpicklable_root(ctx: Ctx) -> Call:
    if ctx.rank == 0:
        return Call("broadcast_object", (threading.Lock(),), {},
                    raises("TypeError", match="pickle", within=1.0), caught=True)
    return Call("broadcast_object", (), {}, peer_failed(0, "pickle"), caught=True)


add("broadcast-object-unpicklable", _unpicklable_root, then_usable, timeout=3.0)


def _agreed_then_mixed(ctx: Ctx) -> Call:
    """Rank 0 all-reduces while the others reduce onto it, both signatures agreed before."""
    x = inputs(ctx)[ctx.rank]
    method, args, kwargs = (("all_reduce", (x, "sum"), {}) if ctx.rank == 0
                            else ("reduce", (x, "sum"), {"root": 0}))
    return Call(method, args, kwargs, raises("CollectiveError", within=2.5))


add("mismatch-agreed-all-reduce-vs-reduce", good(), good("reduce"), _agreed_then_mixed,
    timeout=1.0)
add("peer-timeout-is-a-timeout", cb.told_of_a_timeout, timeout=5.0)
add("detail-logs-every-call", cb.detail_logs_every_call, timeout=5.0)

# --- multi-device: device counts, reduce into a device's own input, accumulation_fn ------------

for value, error in ((2.5, "TypeError"), (None, "TypeError"), (True, "TypeError"),
                     ("abc", "TypeError")):
    add_multi(f"bad-broadcast-devices-{value}", lambda ctx, v=value, e=error: Call(
        "broadcast", (X, v), {}, raises(e, match="devices", within=1.0)))
    add_multi(f"bad-scatter-devices-{value}", lambda ctx, v=value, e=error: Call(
        "scatter", (np.ones((3, 2)), v), {}, raises(e, match="devices", within=1.0)))


def _reduce_into_input(algorithm: str, root: int, into: int):
    """``reduce(values, root=root, out=values[into])``: the right total, or a clear error."""
    def step(ctx: Ctx) -> Call:
        values = [x.copy() for x in inputs(ctx)]
        want = ok(reference(inputs(ctx), "sum")) | raises("ValueError", match="out")
        return Call("reduce", (values, "sum"), {"root": root, "algorithm": algorithm,
                                                "out": values[into]}, want, same=False)
    return step


for algorithm in ("one_device", "ring", "rechd", "tree", "shuffle"):
    for into in (0, 1):
        add_multi(f"reduce-root-1-out-is-values-{into}-{algorithm}",
                  _reduce_into_input(algorithm, 1, into), sizes=(3, 4))

WRONG_SHAPES = {"scalar": lambda xs: np.sum(xs), "short": lambda xs: xs[0][:1],
                "2d": lambda xs: np.stack(xs)}
for name, fn in WRONG_SHAPES.items():
    for function in ("all_reduce", "reduce"):
        add_multi(f"accumulation-fn-{name}-{function}", lambda ctx, f=fn, g=function: Call(
            g, (inputs(ctx), "sum"), {"accumulation_fn": f},
            raises("ValueError", match="accumulation_fn", within=1.0)))
add_multi("accumulation-fn-right", lambda ctx: Call(
    "all_reduce", (inputs(ctx), "sum"), {"accumulation_fn": lambda xs: np.sum(xs, axis=0)},
    ok([reference(inputs(ctx), "sum")] * ctx.size)))



def _from_root_then_a_batch(kind: str):
    """An asynchronous broadcast (or scatter), then a batch, then the broadcast's wait, rank 1
    10 ms late, ten times: every result right. (A broadcast's data stage is validated once
    the root's descriptor comes, on whichever thread advances it, and took the batch being
    issued there into its check value: ranks that saw it at other moments disagreed, a
    mismatch, and the communicator broke.)"""
    def step(ctx: Ctx) -> Call:
        def body(comm):
            for _ in range(10):
                if ctx.rank == 1:
                    time.sleep(0.01)
                if kind == "broadcast":
                    handle = comm.broadcast(np.full(5, float(ctx.rank + 1), np.float32), root=0,
                                            async_op=True)
                    want = np.full(5, 1.0, np.float32)
                else:
                    rows = np.arange(ctx.size * 5, dtype=np.float32).reshape(ctx.size, 5)
                    handle = comm.scatter(rows if ctx.rank == 0 else None, root=0,
                                          async_op=True)
                    want = rows[ctx.rank]
                summed = comm.batch_all_reduce([np.ones(100000, np.float32)])
                assert np.array_equal(handle.wait(), want)
                assert np.array_equal(summed[0], np.full(100000, float(ctx.size), np.float32))
        return Call(body, expect=ok(None, within=5.0))
    return step


for kind in ("broadcast", "scatter"):
    add(f"async-{kind}-then-a-batch-with-a-late-rank", _from_root_then_a_batch(kind),
        timeout=5.0, limit=30.0)
