"""Inputs and bodies the generic steps cannot express: NaN and inf patterns, integer overflow,
overlapping buffers, a rank whose own code raises, and two threads on one communicator."""

from __future__ import annotations

import math
import threading
import time

import numpy as np

from collectives import CollectiveError
from collectives.tools.reference import reference
from faults.kit import Call, Ctx, ok, raises
from faults.steps import COUNT, inputs, tolerance


def special_values(ctx: Ctx, kind: str, dtype=np.float64) -> list[np.ndarray]:
    """Every rank's input with NaN or inf at known places, the rest small integers."""
    xs = [np.arange(COUNT, dtype=dtype) + p for p in range(ctx.size)]
    last = ctx.size - 1
    if kind == "nan":  # NaN on one rank at 1, on another at 3, on every rank at 5
        xs[0][1] = xs[last][3] = np.nan
        for x in xs:
            x[5] = np.nan
    else:  # inf meets -inf at 0 (NaN), inf alone at 2, -inf everywhere at 4
        xs[0][0], xs[1][0], xs[0][2] = np.inf, -np.inf, np.inf
        for x in xs:
            x[4] = -np.inf
    return xs


def special(kind: str, op: str, method: str = "all_reduce", dtype=np.float64, **kwargs):
    """A step reducing ``special_values``: NaN propagates through every op, as in NumPy."""

    def step(ctx: Ctx) -> Call:
        xs = special_values(ctx, kind, dtype)
        full = reference(xs, op)
        rtol = tolerance(op, dtype)
        if method == "reduce":
            return Call(method, (xs[ctx.rank], op), kwargs,
                        ok(full if ctx.rank == 0 else None, rtol=rtol), same=False)
        if method == "reduce_scatter":
            n, i = ctx.size, ctx.rank
            return Call(method, (xs[ctx.rank], op), kwargs,
                        ok(full[i * COUNT // n:(i + 1) * COUNT // n], rtol=rtol), same=False)
        return Call(method, (xs[ctx.rank], op), kwargs, ok(full, rtol=rtol))

    return step


def wrapped(xs: list[np.ndarray], op: str) -> np.ndarray:
    """Integer SUM/PROD in Python's unbounded integers, wrapped into the dtype as NumPy wraps;
    MEAN is the exact sum, divided once in float64 (an integer MEAN sums in float64, as
    ``numpy.mean`` does: it does not wrap)."""
    dtype = xs[0].dtype
    bits = dtype.itemsize * 8
    columns = zip(*(x.tolist() for x in xs))
    if op == "prod":
        exact = [math.prod(int(v) for v in col) for col in columns]
    else:
        exact = [sum(int(v) for v in col) for col in columns]
    low = np.array([v % (1 << bits) for v in exact], dtype=np.uint64 if bits == 64 else np.int64)
    if op == "mean":
        return np.array(exact, dtype=np.float64) / len(xs)
    return low.astype(dtype)  # two's complement: the low bits, reinterpreted


def overflowing(dtype, op: str = "sum", algorithm: str = "auto"):
    """Inputs whose SUM or PROD overflows ``dtype``: the result wraps, the same on every rank
    (a MEAN's sum, in float64, does not)."""

    def step(ctx: Ctx) -> Call:
        info = np.iinfo(dtype)
        base = 3 ** 25 if op == "prod" else info.max // 2 + 10
        xs = [np.full(COUNT, base + p, dtype=dtype) for p in range(ctx.size)]
        return Call("all_reduce", (xs[ctx.rank], op, algorithm), {}, ok(wrapped(xs, op)))

    return step


def overlapping(algorithm: str, shift: int = 1):
    """``x = buf[0:6]`` and ``out = buf[shift:shift + 6]``: the right sum, or a clear error."""

    def step(ctx: Ctx) -> Call:
        xs = inputs(ctx)
        buf = np.zeros(COUNT + shift)
        buf[:COUNT] = xs[ctx.rank]
        x, out = buf[:COUNT], buf[shift:shift + COUNT]
        want = ok(reference(xs, "sum")) | raises("ValueError", match="out")
        return Call("all_reduce", (x, "sum", algorithm), {"out": out}, want)

    return step


def boom(comm) -> None:
    raise RuntimeError("boom in the rank's own code")


# --- two threads on one communicator ------------------------------------------------------------

def second_call_while_first_waits(ctx: Ctx):
    """Rank 0 has one thread waiting inside an all-reduce (rank 1 is late) when a second thread
    calls: the second call must raise ConcurrentCallError at once, and the first still return
    the right result once rank 1 comes."""
    xs = inputs(ctx)
    want = reference(xs, "sum")
    if ctx.rank != 0:
        return Call("all_reduce", (xs[ctx.rank],), {"timeout": 2.0}, ok(want),
                    delay=0.8 if ctx.rank == 1 else 0.0)

    def body(comm):
        first: dict = {}

        def waiter():
            try:
                first["result"] = comm.all_reduce(xs[0], timeout=2.0)
            except Exception as exc:  # noqa: BLE001 - reported below
                first["error"] = f"{type(exc).__name__}: {exc}"

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.3)  # the first call is now waiting for rank 1
        start = time.monotonic()
        try:
            comm.all_reduce(xs[0], timeout=0.5)
            second = "returned"
        except Exception as exc:  # noqa: BLE001 - reported below
            second = type(exc).__name__
        took = time.monotonic() - start
        thread.join()
        return {"second": second, "second_seconds": round(took, 3),
                "first": "error" if "error" in first else
                         ("right" if np.array_equal(first.get("result"), want) else "wrong"),
                "first_error": first.get("error")}

    def check(r) -> str | None:
        if r["second"] != "ConcurrentCallError" or r["second_seconds"] > 0.5:
            return f"second call: {r['second']} after {r['second_seconds']} s"
        if r["first"] != "right":
            return f"first call: {r['first']} {r['first_error'] or ''}"
        return None

    return Call(body, expect=ok(check=check), same=False)


def two_threads_hammering(ctx: Ctx, algorithm: str = "auto"):
    """Two threads on every rank, 20 all-reduces each on one communicator. Thread k of rank r
    reduces ``2 ** (2 r + k)`` everywhere, so any sum that pairs one call of each rank has
    exactly one of the bits 2r, 2r + 1 for every rank r, in every element: the ranks may pair
    different threads' calls (nothing can tell them apart) but a result mixing calls, or
    holding stale data, shows. A call may fail (ConcurrentCallError, a timeout, a mismatch),
    never return such a wrong result."""
    n = ctx.size

    def pairs_one_call_per_rank(got) -> bool:
        if got.shape != (COUNT,) or not (got == got[0]).all() or got[0] != int(got[0]):
            return False
        bits = int(got[0])
        return all(((bits >> (2 * r)) & 3) in (1, 2) for r in range(n)) and bits < 4 ** n

    def body(comm):
        tally = {"right": 0, "wrong": [], "errors": []}
        lock = threading.Lock()

        def worker(k):
            x = np.full(COUNT, 2.0 ** (2 * comm.rank + k))
            for _ in range(20):
                try:
                    got = comm.all_reduce(x, "sum", algorithm, timeout=0.5)
                except Exception as exc:  # noqa: BLE001 - tallied below
                    name = type(exc).__name__
                    with lock:
                        tally["errors"].append(name if isinstance(exc, CollectiveError)
                                               else f"not a CollectiveError: {name}: {exc}")
                    return  # like a real thread: the error ends it
                with lock:
                    if pairs_one_call_per_rank(got):
                        tally["right"] += 1
                    else:
                        tally["wrong"].append(got.tolist())

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return tally

    def check(t) -> str | None:
        strangers = [e for e in t["errors"] if e.startswith("not a CollectiveError")]
        if t["wrong"] or strangers:
            return (f"{len(t['wrong'])} wrong results (first {t['wrong'][:2]}), {t['right']} "
                    f"right, errors {t['errors']}")
        return None

    return Call(body, expect=ok(check=check), same=False)


def one_comm_per_thread(ctx: Ctx):
    """Two communicators (MPI), each used by its own thread: both get every result right."""
    n = ctx.size

    def body(comm):
        from collectives.backends import mpi

        comms = [mpi.init(timeout=5.0), mpi.init(timeout=5.0)]
        wrong = []

        def worker(k):
            try:
                for i in range(20):
                    got = comms[k].all_reduce(np.full(5, comm.rank + k * 10.0 + i))
                    if not np.array_equal(got, np.full(5, n * (n - 1) / 2 + n * (k * 10.0 + i))):
                        wrong.append(f"thread {k} call {i}: {got}")
            except Exception as exc:  # noqa: BLE001 - reported as a failure
                wrong.append(f"thread {k}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return wrong

    return Call(body, expect=ok([]), same=False)

