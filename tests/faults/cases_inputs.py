"""SPMD fault cases about what ranks pass: bad input of every kind, unusual but valid input,
aliasing, NaN and inf, integer overflow, unchecked mismatches, huge sizes, bad timeouts and
two threads on one communicator. ``faults.table`` gathers them."""

from __future__ import annotations

import warnings

import numpy as np

from collectives.tools.reference import expected_outputs, reference
from faults import bodies
from faults.cases_kinds import KINDS
from faults.kit import Call, Case, Ctx, ok, raises
from faults.steps import COUNT, bad, good, inputs, peer_failed

WIDE = {"where": ("threads", "mpi", "mpi-nodes"), "sizes": (2, 3, 4)}
MPI_ONLY = {"where": ("mpi",)}
CASES: list[Case] = []


def add(name: str, *steps, **meta) -> None:
    CASES.append(Case(name, steps, **meta))


def memmapped(x: np.ndarray) -> np.ndarray:
    """``x`` in a ``np.memmap`` of an anonymous temporary file."""
    import tempfile

    with tempfile.TemporaryFile() as f:
        m = np.memmap(f, dtype=x.dtype, mode="w+", shape=x.shape)
        m[:] = x
        return m


def read_only(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x.flags.writeable = False
    return x


def matrix(shape: tuple[int, int]) -> np.ndarray:
    """An empty ``np.matrix`` (NumPy warns that the subclass is not recommended: not here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        return np.matrix(np.empty(shape))


X = np.arange(COUNT, dtype=np.float64)
MASKED = np.ma.masked_array(X, mask=X > 5)
HUGE = np.broadcast_to(np.float32(1), (1 << 40,))  # 4 TiB, and no memory behind it

# --- bad input on every rank: a clear error at once, and the communicator still works -------------

BAD = {  # name: (method, args, kwargs, error, message)
    "x-none": ("all_reduce", (None,), {}, "TypeError", "x is None"),
    "x-none-all-gather": ("all_gather", (None,), {}, "TypeError", "x is None"),
    "x-none-reduce-scatter": ("reduce_scatter", (None,), {}, "TypeError", "x is None"),
    "x-object-dtype": ("all_reduce", (np.array([{}, {}], dtype=object),), {}, "TypeError",
                       "cannot be reduced"),
    "x-string-dtype": ("all_reduce", (np.array(["a", "b"]),), {}, "TypeError", "cannot be reduced"),
    "x-datetime-dtype": ("all_reduce", (np.zeros(2, "datetime64[s]"),), {}, "TypeError",
                         "cannot be reduced"),
    "x-ragged-list": ("all_reduce", ([[1, 2], [3]],), {}, "TypeError", "cannot be read"),
    "op-unknown": ("all_reduce", (X, "median"), {}, "ValueError", "not a reduction"),
    "op-none": ("all_reduce", (X, None), {}, "ValueError", "not a reduction"),
    "op-max-complex": ("all_reduce", (X.astype(np.complex64), "max"), {}, "TypeError",
                       "not defined"),
    "op-sum-bool": ("all_reduce", (X > 2, "sum"), {}, "TypeError", "accepts max, min"),
    "algorithm-unknown": ("all_reduce", (X, "sum", "butterfly"), {}, "ValueError",
                          "unknown algorithm"),
    "algorithm-none": ("all_reduce", (X, "sum", None), {}, "TypeError", "algorithm must be"),
    "algorithm-malformed": ("all_reduce", (X, "sum", "ring/tree/ring"), {}, "ValueError",
                            "malformed"),
    "algorithm-lacks-collective": ("broadcast", (X,), {"algorithm": "rechd"}, "ValueError",
                                   "has no broadcast"),
    "root-out-of-range": ("reduce", (X,), {"root": 99}, "ValueError", "root=99 is out of range"),
    "root-negative": ("reduce", (X,), {"root": -1}, "ValueError", "root=-1 is out of range"),
    "root-float": ("reduce", (X,), {"root": 1.0}, "TypeError", "root must be an integer"),
    "root-bool": ("broadcast", (X,), {"root": True}, "TypeError", "root must be an integer"),
    "shards-negative": ("all_reduce", (X,), {"shards": -1}, "ValueError", "shards=-1"),
    "shards-float": ("all_reduce", (X,), {"shards": 1.5}, "ValueError", "shards=1.5"),
    "groups-overlapping": ("all_reduce", (X, "sum", "ring/ring"), {"groups": [[0, 1], [1]]},
                           "ValueError", "exactly one"),
    "groups-zero": ("all_reduce", (X, "sum", "ring/ring"), {"groups": 0}, "ValueError",
                    "groups=0"),
    "out-shape": ("all_reduce", (X,), {"out": np.empty(COUNT + 1)}, "ValueError",
                  r"out has shape \(7,\)"),
    "out-dtype": ("all_reduce", (X,), {"out": np.empty(COUNT, np.float32)}, "TypeError",
                  "out has dtype float32"),
    "out-read-only": ("all_reduce", (X,), {"out": read_only(np.empty(COUNT))}, "ValueError",
                      "read-only"),
    "out-not-contiguous": ("all_reduce", (X,), {"out": np.empty(2 * COUNT)[::2]}, "ValueError",
                           "not C-contiguous"),
    "out-a-list": ("all_reduce", (X,), {"out": [0.0] * COUNT}, "TypeError",
                   "out must be an array"),
    # (a matrix stays 2-D when flattened: the call's flat view of it took one element, and
    # the ranks disagreed, breaking the communicator; all_gather's raised NumPy's words)
    "out-matrix": ("all_reduce", (X.reshape(2, -1),), {"out": matrix((2, COUNT // 2))},
                   "TypeError", r"out is a numpy\.matrix.*out\.A"),
    "out-matrix-all-gather": ("all_gather", (X,), {"out": matrix((1, 3 * COUNT))},
                              "TypeError", r"out is a numpy\.matrix"),
    # (a NumPy scalar was adopted as a copy, filled, and handed back unchanged)
    "out-numpy-scalar": ("all_reduce", (np.float64(1.0),), {"out": np.float64(0.0)}, "TypeError",
                         "scalar, which cannot be filled in place"),
    "out-numpy-scalar-broadcast": ("broadcast", (np.float64(1.0),), {"out": np.float64(0.0)},
                                   "TypeError", "scalar, which cannot be filled in place"),
    "axis-out-of-range": ("all_gather", (X,), {"axis": 5}, "ValueError", "axis=5"),
    # (a float axis raised Python's own TypeError from inside, naming no argument)
    "axis-not-an-int": ("all_gather", (X,), {"axis": 0.0}, "TypeError", "axis=0.0 must be an int"),
    "reduce-scatter-scalar": ("reduce_scatter", (np.float64(1),), {}, "ValueError", "scalar"),
    "batch-spec-malformed": ("batch_all_reduce", ([X],), {"algorithm": "pscpu:2k"}, "ValueError",
                             "algorithm 'pscpu:2k' is not well formed"),
    "batch-xs-none": ("batch_all_reduce", (None,), {}, "TypeError", "xs"),
    # (each pack is a call: 2**62 of them never returned, whatever the timeout)
    "batch-num-packs-huge": ("batch_all_reduce", ([X],), {"num_packs": 2 ** 62}, "ValueError",
                             "num_packs="),
    # (a 0-d x raised an IndexError from inside; a split past int64 an OverflowError on that
    # rank alone, its peers left in the splits' exchange until their timeout)
    "all-to-all-scalar-with-splits": ("all_to_all", (np.float64(1.0), [0, 0, 0]), {},
                                      "ValueError", "x is a scalar"),
    "all-to-all-splits-overflow": ("all_to_all", (X, [2 ** 64, 0, 0]), {}, "TypeError",
                                   "splits="),
    # (two splits whose int64 sum wraps round to the 0 rows: an error from deep inside, on
    # the peers, naming neither the rank nor splits)
    "all-to-all-splits-wrapping": ("all_to_all", (np.zeros(0), [2 ** 63 - 1, 2 ** 63 - 1, 2]),
                                   {}, "ValueError", "splits="),
    "batch-item-none": ("batch_all_reduce", ([X, None],), {}, "TypeError", r"xs\[1\] is None"),
    "timeout-negative": ("all_reduce", (X,), {"timeout": -1}, "ValueError", "timeout"),
    "timeout-string": ("all_reduce", (X,), {"timeout": "soon"}, ("ValueError", "TypeError"),
                       "timeout"),
    # (no float holds it: it failed at the wait, after the call went out, naming nothing)
    "timeout-past-floats": ("all_reduce", (X,), {"timeout": 10 ** 400}, "ValueError",
                            "timeout"),
    # a masked array's mask would be dropped without a word: refused, naming the fix
    "x-masked": ("all_reduce", (MASKED,), {}, "TypeError", r"MaskedArray.*x\.filled"),
    "x-masked-all-gather": ("all_gather", (MASKED,), {}, "TypeError", "MaskedArray"),
    "x-masked-batch": ("batch_all_reduce", ([X, MASKED],), {}, "TypeError",
                       r"xs\[1\] is a numpy\.ma\.MaskedArray"),
}

for name, (method, args, kwargs, error, match) in BAD.items():
    add(f"bad-{name}", bad(method, *args, error=error, match=match, **kwargs), good(seed=7),
        timeout=2.0)

# Sizes that cannot be allocated: MemoryError on every rank (before data moves), still usable.
add("huge-all-reduce", lambda ctx: Call("all_reduce", (HUGE,), {},
                                        raises("MemoryError", within=1.0), caught=True),
    good(seed=7), timeout=2.0)
# Only the root holds the huge array: it raises its MemoryError, the others hear of it.
add("huge-broadcast", lambda ctx: Call("broadcast", (HUGE if ctx.rank == 0 else None,), {},
                                       raises("MemoryError", within=1.0) if ctx.rank == 0
                                       else peer_failed(0, "MemoryError"), caught=True),
    good(seed=7), timeout=2.0)

# --- unusual but valid input: the right result ---------------------------------------------------


def valid(make, method: str = "all_reduce", op: str = "sum", **kwargs):
    """Every rank passes ``make(x)`` of its exact input; the result is the reference of those."""
    def step(ctx: Ctx) -> Call:
        xs = [make(x) for x in inputs(ctx, count=12)]
        want = reference([np.asarray(x) for x in xs], op)
        return Call(method, (xs[ctx.rank], op), kwargs, ok(want))
    return step


def gathered(make):
    """Every rank all-gathers ``make(x)``: the plain arrays' concatenation."""
    def step(ctx: Ctx) -> Call:
        xs = [make(x) for x in inputs(ctx, count=12)]
        return Call("all_gather", (xs[ctx.rank],), {},
                    ok(np.concatenate([np.asarray(x) for x in xs])))
    return step


def scattered(make):
    """Every rank reduce-scatters ``make(x)``: its rows of the plain arrays' sum."""
    def step(ctx: Ctx) -> Call:
        xs = [make(x) for x in inputs(ctx, count=12)]
        want = expected_outputs("reduce_scatter", [np.asarray(x) for x in xs], "sum")
        return Call("reduce_scatter", (xs[ctx.rank], "sum"), {}, ok(want[ctx.rank]), same=False)
    return step


add("valid-list", valid(lambda x: x.astype(int).tolist()))
add("valid-0d", valid(lambda x: x[3]))
add("valid-0d-array", valid(lambda x: np.asarray(x[3])))
add("valid-empty", valid(lambda x: x[:0]))
add("valid-strided", valid(lambda x: x[::3]))
add("valid-fortran", valid(lambda x: np.asfortranarray(x.reshape(3, 4))))
add("valid-transposed", valid(lambda x: x.reshape(3, 4).T))
add("valid-read-only", valid(read_only))
# NumPy subclasses: taken as the plain arrays they hold (np.matrix stays 2-D)
add("valid-matrix", valid(lambda x: np.matrix(x.reshape(3, 4))))
add("valid-matrix-all-gather", gathered(lambda x: np.matrix(x.reshape(3, 4))))
add("valid-matrix-reduce-scatter", scattered(lambda x: np.matrix(x.reshape(12, 1))))
add("valid-memmap", valid(memmapped))
add("valid-record-array", gathered(lambda x: np.rec.fromarrays([x], names="a")))
add("valid-big-endian", valid(lambda x: x.astype(">f8")))
add("valid-int-mean", good(op="mean", dtype=np.int32))
add("valid-broadcast-nonroot-array", lambda ctx: Call(
    "broadcast", (inputs(ctx)[ctx.rank],), {}, ok(inputs(ctx)[0])))
add("valid-all-gather-0d", lambda ctx: Call(
    "all_gather", (np.float32(ctx.rank),), {}, ok(np.arange(ctx.size, dtype=np.float32))))
add("valid-reduce-scatter-fewer-rows", good("reduce_scatter", count=2))
add("valid-batch-empty", lambda ctx: Call("batch_all_reduce", ([],), {}, ok([])))
add("valid-out", lambda ctx: Call("all_reduce", (inputs(ctx)[ctx.rank],),
                                  {"out": np.empty(COUNT)}, ok(reference(inputs(ctx), "sum"))))

# --- aliasing -------------------------------------------------------------------------------------


def in_place(ctx: Ctx) -> Call:
    x = inputs(ctx)[ctx.rank].copy()
    return Call("all_reduce", (x,), {"out": x}, ok(reference(inputs(ctx), "sum")))


add("alias-out-is-x", in_place)
for algorithm in ("auto", "native", "ring", "tree"):
    add(f"alias-out-overlaps-x-{algorithm}", bodies.overlapping(algorithm),
        **(MPI_ONLY if algorithm == "native" else WIDE if algorithm == "auto" else {}))
add("alias-broadcast-out-is-x", lambda ctx: (lambda x: Call(
    "broadcast", (x,), {"out": x}, ok(inputs(ctx)[0])))(inputs(ctx)[ctx.rank].copy()))

# --- NaN and inf: NaN propagates through every op, on every rank and path --------------------------

for algorithm in ("auto", "native", "ring", "tree", "rechd"):
    for op in ("max", "min"):
        add(f"nan-{op}-{algorithm}", bodies.special("nan", op, algorithm=algorithm),
            **(MPI_ONLY if algorithm == "native" else WIDE if algorithm == "auto" else {}))
add("nan-max-float32-auto", bodies.special("nan", "max", dtype=np.float32))
add("nan-max-two-level", lambda ctx: bodies.special(
    "nan", "max", algorithm="ring/ring",
    **({} if ctx.transport == "mpi-nodes" else {"groups": 2}))(ctx), **WIDE)
add("nan-sum", bodies.special("nan", "sum"))
add("nan-mean-float32", bodies.special("nan", "mean", dtype=np.float32))
add("nan-reduce-max", bodies.special("nan", "max", method="reduce"))
add("nan-reduce-scatter-min", bodies.special("nan", "min", method="reduce_scatter"),)
for algorithm in ("auto", "ring"):
    add(f"inf-sum-{algorithm}", bodies.special("inf", "sum", algorithm=algorithm))
add("inf-max", bodies.special("inf", "max"))
add("inf-prod", bodies.special("inf", "prod"))

# --- integer overflow: wraps as NumPy does, the same on every rank (MEAN sums in float64: exact) ---

add("overflow-int8-sum", bodies.overflowing(np.int8), **WIDE)
add("overflow-int8-sum-ring", bodies.overflowing(np.int8, algorithm="ring"))
add("overflow-uint8-sum", bodies.overflowing(np.uint8))
add("overflow-int64-sum", bodies.overflowing(np.int64))
add("overflow-uint64-sum", bodies.overflowing(np.uint64))
add("overflow-int64-prod", bodies.overflowing(np.int64, "prod"))
add("overflow-int8-mean", bodies.overflowing(np.int8, "mean"))
add("overflow-int32-mean-ring", bodies.overflowing(np.int32, "mean", algorithm="ring"))
add("overflow-uint64-mean", bodies.overflowing(np.uint64, "mean"))


def _integer_means(kind: str):
    """An integer MEAN whose sum passes its dtype, beside a float one, by every call kind: the
    mean of the values (summed in float64), not of their wrapped sum."""
    def step(ctx: Ctx) -> Call:
        top = [2 ** 31 - 2 - r for r in range(ctx.size)]
        xs = [np.full(5, 200, np.uint8), np.full(3, top[ctx.rank], np.int32),
              np.full(2, 1.5 + ctx.rank, np.float32)]
        want = [np.full(5, 200.0), np.full(3, sum(top) / ctx.size),
                np.full(2, 1.5 + (ctx.size - 1) / 2, np.float32)]
        return Call(lambda comm: KINDS[kind](comm, xs, "mean"), expect=ok(want))
    return step


for kind in KINDS:
    CASES.append(Case(f"integer-mean-does-not-wrap-{kind}", (_integer_means(kind),),
                      where=("threads", "mpi"), sizes=(2, 3)))
add("overflow-float16-sum", lambda ctx: Call(
    "all_reduce", (np.full(COUNT, 40000.0, np.float16),), {},
    ok(np.full(COUNT, np.inf, np.float16))))
add("extremes-int32-max", good(op="max", dtype=np.int32, seed=3))

# --- check=False: a length mismatch is an error on every rank, never a silent answer ---------------


def unchecked(method: str, algorithm: str = "auto"):
    """Rank r passes ``4 + r`` elements with the argument check off. Only a broadcast's root
    may return (its own data, which is right); every other rank must raise."""
    def step(ctx: Ctx) -> Call:
        x = np.ones(4 + ctx.rank)
        args = (x,) if method != "all_reduce" else (x, "sum", algorithm)
        error = raises("CollectiveError", "ValueError", within=1.5)
        if method == "broadcast" and ctx.rank == 0:
            error = ok(x) | error
        return Call(method, args, {}, error)
    return step


for algorithm in ("auto", "native", "ring", "tree"):
    add(f"unchecked-length-all-reduce-{algorithm}", unchecked("all_reduce", algorithm),
        check=False, timeout=0.5,
        **(MPI_ONLY if algorithm == "native" else {}))
add("unchecked-length-broadcast", unchecked("broadcast"), check=False, timeout=0.5)
add("unchecked-length-all-gather", unchecked("all_gather"), check=False, timeout=0.5)

# --- two threads on one communicator --------------------------------------------------------------

add("threads-second-call-refused", bodies.second_call_while_first_waits, limit=15)
for algorithm in ("auto", "ring"):
    add(f"threads-hammering-one-communicator-{algorithm}",
        lambda ctx, a=algorithm: bodies.two_threads_hammering(ctx, a), limit=20)
add("threads-one-communicator-each", bodies.one_comm_per_thread, **MPI_ONLY)

# --- shards: clamped, so a huge count is fast and right (last: today it runs for minutes) ---------

add("shards-huge", lambda ctx: Call(
    "all_reduce", (inputs(ctx, count=3)[ctx.rank], "sum", "ring"), {"shards": 10**6},
    ok(reference(inputs(ctx, count=3), "sum"), within=1.0)), limit=3.0)


def strided_x_off_the_root(ctx: Ctx) -> Call:
    """A prepared reduce whose x is a strided view on a non-root rank: refused there, naming
    x, and its peers hear of it (the view was copied once, at the call's making, and every
    run sent that copy: the root's sums were silently stale)."""
    def body(comm):
        x = np.zeros(8)[::2] if comm.rank == 1 else np.zeros(4)
        call = comm.reduce_init(x, root=0, out=np.empty(4) if comm.rank == 0 else None)
        return call.start().wait()  # (peers hear of the refusal in their first run's agreement)
    expect = (raises("ValueError", match="x must be C-contiguous", within=1.0) if ctx.rank == 1
              else peer_failed(1, "C-contiguous"))
    return Call(body, expect=expect, caught=True, same=False)


add("prepared-reduce-strided-x-off-the-root", strided_x_off_the_root, good(seed=7), timeout=2.0)
