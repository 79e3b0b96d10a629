"""Multi-device fault cases (one process holds every device's array): bad input, unusual but
valid input, ``out=`` aliasing, NaN and inf, overflow, huge shards and concurrent callers.

The worker calls ``collectives.<method>`` with a list of one array per device (``Ctx.size``
devices); a result is one array per device, each compared with the float64 reference and all
bitwise identical. ``faults.table`` gathers them.
"""

from __future__ import annotations

import threading

import numpy as np

from collectives.tools.reference import reference
from faults import bodies
from faults.cases_inputs import HUGE, matrix, memmapped, read_only
from faults.kit import Call, Case, Ctx, ok, raises
from faults.steps import COUNT, inputs

ALGORITHMS = ("one_device", "ring", "rechd", "tree", "shuffle")
CASES: list[Case] = []


def add(name: str, step, **meta) -> None:
    CASES.append(Case(name, (step,), where=("multi",), **meta))


def everywhere(ctx: Ctx, value) -> list:
    return [value] * ctx.size


X = np.arange(COUNT, dtype=np.float64)
X3 = [X, X, X]

BAD = {  # name: (function, args, kwargs, error(s), message)
    "values-none": ("all_reduce", (None,), {}, "TypeError", "one array per device"),
    "values-an-array": ("all_reduce", (X,), {}, "TypeError", "one array per device"),
    "values-a-string": ("all_reduce", ("abc",), {}, "TypeError", "one array per device"),
    "values-empty": ("all_reduce", ([],), {}, "ValueError", "values is empty"),
    "values-item-none": ("all_reduce", ([X, None, X],), {}, "TypeError", r"values\[1\] is None"),
    "values-shapes-differ": ("all_reduce", ([X, X[:5], X],), {}, "ValueError",
                             r"values\[1\] has shape"),
    "values-dtypes-differ": ("all_reduce", ([X, X.astype(np.float32), X],), {}, "TypeError",
                             r"values\[1\] has dtype float32"),
    "values-object-dtype": ("all_reduce", ([np.array([{}], dtype=object)] * 3,), {}, "TypeError",
                            "cannot be reduced"),
    "values-string-dtype": ("all_reduce", ([np.array(["a"])] * 3,), {}, "TypeError",
                            "cannot be reduced"),
    "op-unknown": ("all_reduce", (X3, "median"), {}, "ValueError", "not a reduction"),
    # (None stood for "no op" inside: it passed the checks, then an AttributeError mid-run)
    "op-none": ("all_reduce", (X3, None), {}, "ValueError", "op=None is not a reduction"),
    "op-none-reduce": ("reduce", (X3, None), {}, "ValueError", "op=None is not a reduction"),
    "op-none-reduce-scatter": ("reduce_scatter", (X3, None), {}, "ValueError",
                               "op=None is not a reduction"),
    "op-max-complex": ("all_reduce", ([X.astype(np.complex128)] * 3, "max"), {}, "TypeError",
                       "not defined"),
    "op-sum-bool": ("all_reduce", ([X > 1] * 3, "sum"), {}, "TypeError", "accepts max, min"),
    "algorithm-unknown": ("all_reduce", (X3, "sum", "butterfly"), {}, "ValueError",
                          "unknown algorithm"),
    "algorithm-malformed": ("all_reduce", (X3, "sum", "ring/tree/ring"), {}, "ValueError",
                            "malformed"),
    "shards-negative": ("all_reduce", (X3,), {"shards": -1}, "ValueError", "shards=-1"),
    "shards-float": ("all_reduce", (X3,), {"shards": 2.5}, "ValueError", "shards=2.5"),
    "groups-overlapping": ("all_reduce", (X3, "sum", "pscpu/pscpu"), {"groups": [[0, 1], [1, 2]]},
                           "ValueError", "exactly one"),
    "out-count": ("all_reduce", (X3,), {"out": [np.empty(COUNT)] * 2}, "ValueError",
                  "2 arrays for 3 devices"),
    # (a combine into its flat view, still 2-D, said "operands of a combine differ in length")
    "out-matrix": ("all_reduce", (X3,), {"out": [matrix((1, COUNT))] * 3},
                   "TypeError", r"out\[0\] is a numpy\.matrix"),
    "out-shape": ("all_reduce", (X3,), {"out": [np.empty(COUNT + 1)] * 3}, "ValueError",
                  r"out\[0\] has shape"),
    "out-dtype": ("all_reduce", (X3,), {"out": [np.empty(COUNT, np.float32)] * 3}, "TypeError",
                  r"out\[0\] has dtype"),
    "out-read-only": ("all_reduce", (X3,), {"out": [np.empty(COUNT), read_only(X), np.empty(COUNT)]},
                      "ValueError", r"out\[1\] is read-only"),
    "out-not-contiguous": ("all_reduce", (X3,), {"out": [np.empty(2 * COUNT)[::2]] * 3},
                           "ValueError", "not C-contiguous"),
    "out-an-array": ("all_reduce", (X3,), {"out": np.empty(COUNT)}, ("TypeError", "ValueError"),
                     "out"),
    "reduce-root-out-of-range": ("reduce", (X3,), {"root": 3}, "ValueError", "root=3"),
    "reduce-root-float": ("reduce", (X3,), {"root": 0.0}, "TypeError", "root must be an integer"),
    "broadcast-no-devices": ("broadcast", (X, 0), {}, "ValueError", "names no device"),
    "broadcast-algorithm-lacks-it": ("broadcast", (X, 3, "rechd"), {}, "ValueError",
                                     "has no broadcast"),
    "all-gather-axis": ("all_gather", (X3,), {"axis": 1}, "ValueError", "axis=1"),
    "reduce-scatter-scalars": ("reduce_scatter", ([np.float64(1)] * 3,), {}, "ValueError",
                               "scalars"),
    "batch-device-counts-differ": ("batch_all_reduce", ([X3, [X, X]],), {}, "ValueError",
                                   r"value_lists\[1\] has 2 devices"),
    "batch-spec-malformed": ("batch_all_reduce", ([X3],), {"algorithm": "pscpu:2k"}, "ValueError",
                             "algorithm 'pscpu:2k' is not well formed"),
    "batch-not-a-list": ("batch_all_reduce", (None,), {}, "TypeError", "value_lists must be a list"),
    # TensorFlow's packing knobs (accepted silently, or a bare TypeError from deep inside)
    "batch-agg-bytes-negative": ("batch_all_reduce", ([X3],), {"agg_small_grads_max_bytes": -5},
                                 "ValueError", "agg_small_grads_max_bytes must be 0"),
    "batch-agg-group-negative": ("batch_all_reduce", ([X3],), {"agg_small_grads_max_bytes": 64,
                                                              "agg_small_grads_max_group": -1},
                                 "ValueError", "agg_small_grads_max_group must be 0"),
    "batch-num-packs-float": ("batch_all_reduce", ([X3],), {"num_packs": 2.5}, "TypeError",
                              "num_packs=2.5 must be a whole number"),
    "batch-num-packs-bool": ("batch_all_reduce", ([X3],), {"num_packs": True}, "TypeError",
                             "num_packs=True must be a whole number"),
    # an empty list is checked as any other (it returned [] whatever the arguments)
    "batch-empty-op-unknown": ("batch_all_reduce", ([], "median"), {}, "ValueError",
                               "not a reduction"),
    "batch-empty-spec-unknown": ("batch_all_reduce", ([], "sum", "nope"), {}, "ValueError",
                                 "unknown algorithm"),
    "batch-empty-bucket-bytes": ("batch_all_reduce", ([],), {"bucket_bytes": -5}, "ValueError",
                                 "bucket_bytes=-5"),
    "batch-empty-compression": ("batch_all_reduce", ([], "max"), {"compression": "fp16"},
                                "ValueError", "compression"),
    "batch-empty-groups-text": ("batch_all_reduce", ([],), {"groups": "x"}, "TypeError",
                                "groups='x' must be a group size"),
    "batch-empty-groups-zero": ("batch_all_reduce", ([],), {"groups": 0}, "ValueError",
                                "groups=0 must be a positive group size"),
    "batch-empty-groups-overlap": ("batch_all_reduce", ([],), {"groups": [[0], [0]]},
                                   "ValueError", r"groups=\[\[0\], \[0\]\] must split"),
    "huge": ("all_reduce", ([HUGE] * 3,), {}, "MemoryError", "allocate"),
    "masked": ("all_reduce", ([X, np.ma.masked_array(X, mask=X > 5), X],), {}, "TypeError",
               r"values\[1\] is a numpy\.ma\.MaskedArray.*filled"),
    "masked-batch": ("batch_all_reduce", ([[X, X, np.ma.masked_array(X)]],), {}, "TypeError",
                     r"value_lists\[0\]\[2\] is a numpy\.ma\.MaskedArray"),
}

for name, (function, args, kwargs, error, match) in BAD.items():
    errors = (error,) if isinstance(error, str) else error
    add(f"bad-{name}", lambda ctx, f=function, a=args, k=kwargs, e=errors, m=match: Call(
        f, a, dict(k), raises(*e, match=m, within=1.0)))


def valid(make, function: str = "all_reduce", op: str = "sum", **kwargs):
    """Every device brings ``make(x)`` of its exact input; each gets the reference of those."""
    def step(ctx: Ctx) -> Call:
        xs = [make(x) for x in inputs(ctx, count=12)]
        want = reference([np.asarray(x) for x in xs], op)
        return Call(function, (xs, op), kwargs, ok(everywhere(ctx, want)))
    return step


add("valid-lists", valid(lambda x: x.astype(int).tolist()))
add("valid-0d", valid(lambda x: np.asarray(x[3])))
add("valid-empty", valid(lambda x: x[:0]))
add("valid-strided", valid(lambda x: x[::3]))
add("valid-fortran", valid(lambda x: np.asfortranarray(x.reshape(3, 4))))
add("valid-read-only", valid(read_only))
add("valid-matrix", valid(lambda x: np.matrix(x.reshape(3, 4))))
add("valid-memmap", valid(memmapped))
add("valid-big-endian", valid(lambda x: x.astype(">f8")))
add("valid-int-mean", valid(lambda x: x.astype(np.int16), op="mean"))
add("valid-reduce", lambda ctx: Call("reduce", (inputs(ctx), "sum"), {"root": 2},
                                     ok(reference(inputs(ctx), "sum"))))
add("valid-broadcast", lambda ctx: Call("broadcast", (X, ctx.size), {}, ok(everywhere(ctx, X))))
add("valid-reduce-scatter-fewer-rows", lambda ctx: Call(
    "reduce_scatter", (inputs(ctx, count=2),), {},
    ok([reference(inputs(ctx, count=2), "sum")[i * 2 // ctx.size:(i + 1) * 2 // ctx.size]
        for i in range(ctx.size)])))
add("valid-batch-empty", lambda ctx: Call("batch_all_reduce", ([],), {}, ok([])))

# --- out= aliasing: the right answer or a clear error, never a wrong answer ------------------------


def aliased(kind: str, algorithm: str):
    def step(ctx: Ctx) -> Call:
        xs = inputs(ctx)
        want = ok(everywhere(ctx, reference(xs, "sum"))) | raises("ValueError", match="out")
        if kind == "overlapping":  # out[i] is values[i] shifted by one element
            bufs = [np.concatenate([x, [0.0]]) for x in xs]
            return Call("all_reduce", ([b[:COUNT] for b in bufs], "sum", algorithm),
                        {"out": [b[1:] for b in bufs]}, want)
        values = [x.copy() for x in xs]
        out = {"in-place": values, "reversed": values[::-1],
               "shared": [np.empty(COUNT)] * ctx.size}[kind]
        return Call("all_reduce", (values, "sum", algorithm), {"out": out}, want)
    return step


for kind in ("in-place", "reversed", "shared", "overlapping"):
    for algorithm in ALGORITHMS:
        add(f"alias-out-{kind}-{algorithm}", aliased(kind, algorithm), sizes=(3, 4))

# --- NaN, inf and overflow ------------------------------------------------------------------------


def special(kind: str, op: str, algorithm: str = "auto", function: str = "all_reduce"):
    def step(ctx: Ctx) -> Call:
        xs = bodies.special_values(ctx, kind)
        full = reference(xs, op)
        return Call(function, (xs, op), {"algorithm": algorithm},
                    ok(full if function == "reduce" else everywhere(ctx, full)))
    return step


for algorithm in ALGORITHMS:
    for op in ("max", "min"):
        add(f"nan-{op}-{algorithm}", special("nan", op, algorithm))
    add(f"inf-sum-{algorithm}", special("inf", "sum", algorithm))
add("nan-reduce-max", special("nan", "max", function="reduce"))


def overflowing(dtype, op: str = "sum"):
    def step(ctx: Ctx) -> Call:
        base = 3 ** 25 if op == "prod" else np.iinfo(dtype).max // 2 + 10
        xs = [np.full(COUNT, base + p, dtype=dtype) for p in range(ctx.size)]
        return Call("all_reduce", (xs, op), {}, ok(everywhere(ctx, bodies.wrapped(xs, op))))
    return step


add("overflow-int8-sum", overflowing(np.int8))
add("overflow-uint64-sum", overflowing(np.uint64))
add("overflow-int64-prod", overflowing(np.int64, "prod"))
add("overflow-int8-mean", overflowing(np.int8, "mean"))

# --- concurrent callers: the multi-device API holds no state between calls -------------------------


def concurrent_callers(ctx: Ctx) -> Call:
    def body(module):
        wrong = []

        def worker(k):
            try:
                for i in range(30):
                    values = [np.full(1000, float(d + k + i)) for d in range(ctx.size)]
                    got = module.all_reduce(values, "sum", "ring")
                    want = sum(d + k + i for d in range(ctx.size))
                    if not all((g == want).all() for g in got):
                        wrong.append(f"thread {k} call {i}")
            except Exception as exc:  # noqa: BLE001 - reported as a failure
                wrong.append(f"thread {k}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return wrong

    return Call(body, expect=ok([]))


add("threads-concurrent-callers", concurrent_callers)
add("shards-huge", lambda ctx: Call(
    "all_reduce", (inputs(ctx, count=3), "sum", "ring"), {"shards": 10**6},
    ok(everywhere(ctx, reference(inputs(ctx, count=3), "sum")), within=1.0)), limit=3.0)
