"""SPMD fault cases about ranks: missing, late and raising ranks, calls after a failure, an
argument error on one rank, and every kind of cross-rank mismatch.

Each entry is a ``Case``: a name, its steps (see ``faults.steps``), where it runs and its
limits; ``faults.table`` gathers them. ``xfail`` names the defect (``faults.defects``) that
still breaks a case on a transport.
"""

from __future__ import annotations

import numpy as np

from faults import bodies
from faults.kit import Call, Case, Ctx, ok, raises
from faults.steps import (
    COUNT,
    absent,
    all_but_last,
    expecting,
    good,
    last,
    peer_failed,
    timed_out,
)

T = 0.5  # the timeout of cases where a rank stays away: every one of them waits this long
WIDE = {"where": ("threads", "mpi", "mpi-nodes"), "sizes": (2, 3, 4)}
MPI_ONLY = {"where": ("mpi",)}

CASES: list[Case] = []


def add(name: str, *steps, **meta) -> None:
    CASES.append(Case(name, steps, **meta))


def then_usable(ctx: Ctx) -> Call:
    """The step after a failure that leaves the communicator usable: a plain all-reduce."""
    return good(seed=7)(ctx)


# --- missing, late and raising ranks --------------------------------------------------------------

def _missing(method: str):
    named = "all_reduce" if method == "batch_all_reduce" else method
    return lambda ctx: timed_out(named, T, naming=str(ctx.size - 1))


for method in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "barrier",
               "batch_all_reduce"):
    add(f"missing-rank-{method}", absent(expecting(good(method), _missing(method)), last),
        timeout=T, **(WIDE if method == "all_reduce" else {}))
add("missing-rank-ring-unchecked",
    absent(expecting(good(algorithm="ring"), timed_out("all_reduce", T)), last),
    timeout=T, check=False)
add("missing-rank-native-unchecked",
    absent(expecting(good(algorithm="native"), timed_out("all_reduce", T)), last),
    timeout=T, check=False, **MPI_ONLY)
add("late-rank-within-timeout", expecting(good(), delay=0.3, only=last))


def _late_after_timeout(ctx: Ctx) -> Call:
    call = expecting(good(), _missing("all_reduce"))(ctx)
    if ctx.rank == ctx.size - 1:  # comes when the others have given up: it cannot finish either
        call.delay = 1.0
        call.expect = raises("CollectiveTimeoutError", "PeerFailedError", within=T + 1.0)
    return call


add("late-rank-after-timeout", _late_after_timeout, timeout=T)
add("extra-call-on-one-rank", good(timeout=5.0),
    absent(expecting(good(seed=1), lambda ctx: timed_out(
        "all_reduce", T, naming=", ".join(map(str, range(ctx.size - 1))))), all_but_last),
    timeout=T)
add("one-call-fewer-on-one-rank", good(timeout=5.0),
    absent(expecting(good(seed=1), _missing("all_reduce")), last), timeout=T)


def _raising_rank(ctx: Ctx) -> Call:
    """Rank 1's own code raises; ``collectives.run`` wakes the others (thread ranks only: over
    MPI such a rank is just one that never arrives)."""
    if ctx.rank == 1:
        return Call(bodies.boom, expect=raises("RuntimeError"))
    return expecting(good(), peer_failed(1, "RuntimeError"))(ctx)


add("raising-rank-wakes-the-others", _raising_rank, where=("threads",))

# --- calls after a failure --------------------------------------------------------------------------

add("after-timeout-broken",
    absent(expecting(good(), _missing("all_reduce"), caught=True), last),
    absent(expecting(good(), raises("CommunicatorBrokenError", within=0.5)), last),
    timeout=T, **WIDE)
add("after-timeout-broken-unchecked",
    absent(expecting(good(algorithm="ring"), timed_out("all_reduce", T), caught=True), last),
    absent(expecting(good(algorithm="ring"), raises("CommunicatorBrokenError", within=0.5)),
           last),
    timeout=T, check=False)

# --- an argument error on one rank only -------------------------------------------------------------

X = np.arange(COUNT, dtype=np.float64)
ONE_RANK_BAD = [  # name, (method, args, kwargs) on rank 1, the same call done right elsewhere, error
    ("op", ("all_reduce", (X, "median"), {}), ("all_reduce", (X, "sum"), {}), "ValueError"),
    ("x-none", ("all_reduce", (None,), {}), ("all_reduce", (X,), {}), "TypeError"),
    ("out-shape", ("all_reduce", (X,), {"out": np.empty(COUNT + 1)}),
     ("all_reduce", (X,), {"out": np.empty(COUNT)}), "ValueError"),
    ("root-type", ("reduce", (X,), {"root": 1.5}), ("reduce", (X,), {"root": 0}), "TypeError"),
    ("algorithm", ("all_reduce", (X, "sum", "butterfly"), {}), ("all_reduce", (X, "sum", "ring"), {}),
     "ValueError"),
    ("op-for-dtype", ("all_reduce", (X.astype(bool), "sum"), {}), ("all_reduce", (X, "sum"), {}),
     "TypeError"),
]


def _one_rank_bad(bad_call, right_call, error, bad_rank=1):
    def step(ctx: Ctx) -> Call:
        if ctx.rank == bad_rank:
            method, args, kwargs = bad_call
            return Call(method, args, dict(kwargs), raises(error, within=0.5))
        method, args, kwargs = right_call
        return Call(method, args, {k: (np.empty(COUNT) if k == "out" else v)
                                   for k, v in kwargs.items()}, peer_failed(bad_rank, error))
    return step


for name, bad_call, right_call, error in ONE_RANK_BAD:
    add(f"one-rank-bad-{name}", _one_rank_bad(bad_call, right_call, error), timeout=1.2,
        **(WIDE if name == "op" else {}))
# The root of a broadcast passes None (the others may: they receive).
add("one-rank-bad-broadcast-root-x-none", _one_rank_bad(
    ("broadcast", (None,), {}), ("broadcast", (None,), {}), "TypeError", bad_rank=0),
    timeout=1.2)


def _rooted_step(k: int, kind: str = "broadcast", *, bad_out: bool = False,
                 async_op: bool = False):
    """Broadcast number ``k`` of root 0's ``[k, k, k, k]`` (or scatter it, one such row per
    rank); ``bad_out``: rank 1 passes no x and an ``out`` of 5 elements. It tells the shape it
    expects in the opening agreement, so every rank raises the mismatch before any data moves
    (the root does not return while rank 1 raises), and the calls after it run."""
    def step(ctx: Ctx) -> Call:
        data = np.full(4, float(k))
        x = None
        if ctx.rank == 0:
            x = data if kind == "broadcast" else np.tile(data, (ctx.size, 1))
        out = np.empty(5 if bad_out and ctx.rank == 1 else 4)

        def call(comm):
            got = getattr(comm, kind)(x, out=out, async_op=async_op)
            return got.wait() if async_op else got
        if bad_out:
            return Call(call, expect=raises("CollectiveMismatchError", match="out=",
                                            within=0.5), caught=True)
        return Call(call, expect=ok(data), caught=True)
    return step


for kind in ("broadcast", "scatter"):
    for async_op in (False, True):
        add(f"one-rank-bad-{kind}-out" + ("-async" if async_op else ""),
            *(_rooted_step(k, kind, bad_out=k == 0, async_op=async_op) for k in range(3)),
            timeout=1.0)

# --- every kind of cross-rank mismatch --------------------------------------------------------------


def odd(ctx: Ctx) -> bool:
    return ctx.rank == ctx.size - 1


MISMATCHES = {  # name: (field in the message, this rank's call)
    "shape": ("shape", lambda c: ("all_reduce", (np.ones(COUNT + odd(c)),), {})),
    "shape-same-size": ("shape", lambda c: ("all_reduce", (np.ones((3, 2) if odd(c) else (2, 3)),),
                                            {})),
    "dtype": ("dtype", lambda c: ("all_reduce", (np.ones(COUNT, np.float32 if odd(c) else
                                                         np.float64),), {})),
    "dtype-same-width": ("dtype", lambda c: ("all_reduce", (np.ones(COUNT, np.int64 if odd(c) else
                                                                    np.float64),), {})),
    "op": ("op", lambda c: ("all_reduce", (X, "max" if odd(c) else "sum"), {})),
    "op-mean": ("op", lambda c: ("all_reduce", (X, "mean" if odd(c) else "sum"), {})),
    "root-reduce": ("root", lambda c: ("reduce", (X,), {"root": 1 if odd(c) else 0})),
    "root-broadcast": ("root", lambda c: ("broadcast", (X,), {"root": 1 if odd(c) else 0})),
    "algorithm": ("algorithm", lambda c: ("all_reduce", (X, "sum", "tree" if odd(c) else "ring"),
                                          {})),
    "shards": ("shards", lambda c: ("all_reduce", (X, "sum", "ring"), {"shards": 3 if odd(c) else 2})),
    "groups": ("groups", lambda c: ("all_reduce", (X, "sum", "ring/ring"),
                                    {"groups": 1 if odd(c) else c.size})),
    "axis": ("axis", lambda c: ("all_gather", (np.ones((2, 2)),), {"axis": 1 if odd(c) else 0})),
    "length-reduce-scatter": ("shape", lambda c: ("reduce_scatter", (np.ones(COUNT + odd(c)),), {})),
    "broadcast-x-shape": ("shape", lambda c: ("broadcast", (np.ones(COUNT + odd(c)),), {})),
    # (every non-root's x against the root's: a non-root's x is agreed, not ignored)
    "broadcast-x-dtype-of-the-root": ("dtype", lambda c: ("broadcast", (np.ones(
        COUNT, np.float64 if c.rank == 0 else np.float32),), {})),
    "scatter-x-shape-of-the-root": ("shape", lambda c: ("scatter", (np.ones(
        (c.size, 3 if c.rank == 0 else 4)),), {})),
    "collective": ("collective", lambda c: ("reduce" if odd(c) else "all_reduce", (X,), {})),
    "collective-broadcast": ("collective", lambda c: ("all_gather" if odd(c) else "broadcast",
                                                      (X,), {})),
    "collective-barrier": ("collective", lambda c: ("barrier", (), {}) if odd(c) else
                           ("all_reduce", (X,), {})),
    "batch-tensor-lists": ("(shape|tensor lists)", lambda c: ("batch_all_reduce", ([np.ones(8)] if odd(c) else
                                                                    [np.ones(4), np.ones(4)],),
                                               {})),
}


def _mismatch(field: str, choose):
    def step(ctx: Ctx) -> Call:
        method, args, kwargs = choose(ctx)
        return Call(method, args, kwargs, raises("CollectiveMismatchError",
                                                 match=f"different {field}", within=1.0),
                    caught=True)
    return step


for name, (field, choose) in MISMATCHES.items():
    add(f"mismatch-{name}", _mismatch(field, choose), then_usable, timeout=1.0,
        **(WIDE if name in ("shape", "op") or name.endswith("-of-the-root") else {}))
add("mismatch-algorithm-native", _mismatch("algorithm", lambda c: (
    "all_reduce", (X, "sum", "native" if odd(c) else "ring"), {})), then_usable, timeout=1.0,
    **MPI_ONLY)
add("mismatch-call-order",
    _mismatch("collective", lambda c: ("all_reduce" if c.rank == 0 else "broadcast", (X,), {})),
    _mismatch("collective", lambda c: ("broadcast" if c.rank == 0 else "all_reduce", (X,), {})),
    timeout=1.0)
