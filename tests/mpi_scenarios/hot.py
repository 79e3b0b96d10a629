"""The hot path of a repeated small all-reduce, compiled (``_hot.c``) and in Python, side by side.

Run as ``hot.py PURE``: PURE names the ranks that set ``COLLECTIVES_PURE_PYTHON=1`` (``none``,
``all`` or a comma-separated list), so one run can mix the two paths across ranks. On every
rank, for several dtypes, ops and lengths up to the hot path's limit: repeated calls with
``out``, without it, and from a strided input (the compiled path declines it and Python's
runs), asynchronous ones (with ``out`` and without: the hot path's brief issue, ``issue``),
and prepared calls restarted on new data, out of place and in place; arguments equal
to a hot signature's but refused (``("native", 1.0)``, ``shards=None``) are refused still.
Every result must equal the float64 oracle (exactly, for inputs whose sums are exact; within
float32's rounding for random ones), be bitwise the same on every rank, and leave the input as
it was; each rank must have taken the path it was told to (compiled wherever it is built and
not switched off).
"""

from __future__ import annotations

import functools
import os
import sys

from _common import WORLD, Report, meet

n, rank = WORLD.size, WORLD.rank
PURE = sys.argv[1] if len(sys.argv) > 1 else "none"
pure_here = PURE == "all" or str(rank) in PURE.split(",")
if pure_here:
    os.environ["COLLECTIVES_PURE_PYTHON"] = "1"
else:
    os.environ.pop("COLLECTIVES_PURE_PYTHON", None)

import numpy as np  # noqa: E402
from collectives.backends import mpi  # noqa: E402
from collectives.backends.mpi import compiled  # noqa: E402

report = Report("hot")
REPEATS = 12
EXTRA = 200  # calls at most to see the compiled path complete one (ran)
LENGTHS = (1, 7, 1000, 16384 // 4)  # the last: float32 at the hot path's 64 KiB limit
CASES = [("sum", np.float32), ("sum", np.float64), ("sum", np.int32), ("mean", np.float64),
         ("max", np.float32), ("min", np.int64), ("prod", np.float64)]
# no hot path: a float MAX may need its NaNs repaired, a PROD carries no check in its data
NOT_HOT = {("max", np.float32), ("prod", np.float64)}


def inputs(op: str, dtype, count: int, step: int, exact: bool) -> list[np.ndarray]:
    """Every rank's input of one call (each rank makes all of them: the oracle needs them)."""
    out = []
    for r in range(n):
        rng = np.random.default_rng(1000 * step + 10 * r + count)
        if op == "prod":
            x = rng.choice([0.5, 1.0, 2.0], count)
        elif exact or np.dtype(dtype).kind in "iu":
            x = rng.integers(-1000, 1000, count)
        else:
            x = rng.standard_normal(count)
        out.append(x.astype(dtype))
    return out


def oracle(op: str, xs: list[np.ndarray]) -> np.ndarray:
    wide = np.array(xs, dtype=np.float64)
    got = {"sum": wide.sum(0), "mean": wide.mean(0), "max": wide.max(0), "min": wide.min(0),
           "prod": wide.prod(0)}[op]
    return got


def agree(what: str, got: np.ndarray) -> None:
    """The same bytes on every rank."""
    everyone = WORLD.allgather(np.ascontiguousarray(got).tobytes())
    report.check(all(b == everyone[0] for b in everyone), f"{what}: ranks differ")


def check(what: str, op: str, dtype, xs: list[np.ndarray], mine: np.ndarray, before: np.ndarray,
          got: np.ndarray, exact: bool) -> None:
    want = oracle(op, xs)
    if exact:
        ok = np.array_equal(got.astype(np.float64), want)
    else:
        ok = np.allclose(got.astype(np.float64), want, rtol=1e-5, atol=1e-5)
    report.check(ok and got.dtype == np.dtype(dtype), f"{what}: wrong result")
    report.check(np.array_equal(mine, before), f"{what}: input modified")
    agree(what, got)


def repeated(comm, op: str, dtype, count: int) -> None:
    for exact in (True, False):
        if exact is False and (np.dtype(dtype).kind in "iu" or op == "prod"):
            continue
        for way in ("out", "new", "strided x", "async out", "async new"):
            what = f"{op} {np.dtype(dtype).name} x{count} {way} exact={exact}"
            out = np.empty(count, dtype)
            for step in range(REPEATS):
                xs = inputs(op, dtype, count, step, exact)
                x = xs[rank].copy()
                if way == "strided x":
                    holder = np.zeros(2 * count, dtype)
                    holder[::2] = x
                    x = holder[::2]
                before = x.copy()
                if way == "out":
                    got = comm.all_reduce(x, op, out=out)
                    report.check(got is out, f"{what}: not out")
                elif way.startswith("async"):
                    given = {"out": out} if way == "async out" else {}
                    got = comm.all_reduce(x, op, async_op=True, **given).wait()
                    report.check(got is out or not given, f"{what}: not out")
                else:
                    got = comm.all_reduce(x, op)
                check(f"{what} step {step}", op, dtype, xs, x, before, np.asarray(got), exact)
            hot = comm.calls.last_hot  # the hot path the last call took: compiled where it should be
            if (op, dtype) not in NOT_HOT and way == "out" and report.check(
                    hot is not None and hot.shape == (count,) and hot.dtype == np.dtype(dtype),
                    f"{what}: the last call took no hot path of its own"):
                report.check(hot.bound.req is not None, f"{what}: the hot path never bound")
                expect_compiled = compiled._hot is not None and not pure_here
                report.check((hot.bound.compiled is not None) == expect_compiled,
                             f"{what}: compiled path {hot.bound.compiled!r}, expected "
                             f"{'one' if expect_compiled else 'none'}")
                ran(what, hot.bound.compiled, functools.partial(comm.all_reduce, x, op, out=out))
            if (op, dtype) not in NOT_HOT and way == "async out" and report.check(
                    hot is not None and hot.shape == (count,) and hot.dtype == np.dtype(dtype),
                    f"{what}: the last call took no hot path of its own"):
                # (the same hot path, its brief issue: compiled where the rank has it; a call
                # its brief test did not see finish, at 5 µs, the engine finishes)
                report.check((hot.bound.compiled_issue is not None) == (
                    compiled._hot is not None and not pure_here), f"{what}: wrong path")


def ran(what: str, path, again) -> None:
    """The compiled path, where this rank has one, completed calls itself (it declines what
    it cannot run, and a call still running after its spin completes elsewhere). On a loaded
    machine every call of a case may outlast the spin: up to ``EXTRA`` more calls (``again``,
    every rank alike, each after a barrier) give it the chance."""
    for _ in range(EXTRA):
        if not WORLD.allreduce(int(path is not None and path.ran == 0)):
            break
        WORLD.Barrier()
        again()
    if path is not None:
        report.check(path.ran > 0, f"{what}: the compiled path never completed a run")


def prepared(comm, op: str, dtype, count: int) -> None:
    for in_place in (False, True):
        what = f"prepared {op} {np.dtype(dtype).name} x{count} in_place={in_place}"
        x = np.zeros(count, dtype)
        out = x if in_place else np.empty(count, dtype)
        call = comm.all_reduce_init(x, op, out=out)
        for step in range(REPEATS):
            xs = inputs(op, dtype, count, step, True)
            x[...] = xs[rank]
            before = x.copy()
            got = call.start().wait()
            report.check(got is out, f"{what}: not out")
            check(f"{what} step {step}", op, dtype, xs, before if in_place else x, before,
                  out, True)
        fast = call._fast  # its own hot path, where it has one
        if (op, dtype) not in NOT_HOT and report.check(fast is not None, f"{what}: no hot path"):
            report.check((fast.bound.compiled is not None) == (
                compiled._hot is not None and not pure_here), f"{what}: wrong path")
            ran(what, fast.bound.compiled, lambda c=call: c.start().wait())
        call.free()


def equal_but_refused(comm) -> None:
    """Arguments equal to a hot signature's but refused (``("native", 1.0)`` beside
    ``("native", 1)``, ``shards=None`` or ``False`` beside the default 0) are refused after
    its hot path is bound too (a key by value ran them): on every rank, before data moves."""
    x = np.ones(8)
    for _ in range(3):
        comm.all_reduce(x, "sum", ("native", 1))
        comm.all_reduce(x)
    for args, kwargs in (((("native", 1.0),), {}), ((("native", True),), {}),
                         ((), {"shards": None}), ((), {"shards": 0.0}), ((), {"shards": False})):
        try:
            comm.all_reduce(x, "sum", *args, **kwargs)
            report.check(False, f"hot path bound, then {args} {kwargs}: ran")
        except ValueError as exc:
            report.check("shards" in str(exc), f"hot path bound, then {args} {kwargs}: {exc}")
    report.check(np.array_equal(comm.all_reduce(x), np.full(8, float(n))), "the hot path after")


def main() -> None:
    if not pure_here:
        report.check(compiled._hot is None or compiled.functions() is not None,
                     "the compiled hot path is built but found no MPI_Start/MPI_Test")
    else:
        report.check(compiled.functions() is None, "COLLECTIVES_PURE_PYTHON=1 left it on")
    comm = mpi.init(timeout=60)
    for op, dtype in CASES:
        for count in LENGTHS:
            repeated(comm, op, dtype, count)
            prepared(comm, op, dtype, count)
    equal_but_refused(comm)
    meet()
    comm.free()
    report.finish(f"pure={PURE} compiled_built={compiled._hot is not None}")


main()
