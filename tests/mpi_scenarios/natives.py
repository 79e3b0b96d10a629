"""MPI's own collectives where they used to go wrong: every case must give the right answer
on every rank, or raise on every rank.

* ``out`` overlapping ``x`` (not the same array): copied through scratch, the right answer;
* NaN and signed zeros through MAX and MIN: NaN on every rank where any rank had one, the
  same bits everywhere (MPICH's MAX keeps or drops a NaN, and keeps +0 or -0, depending on
  the order of operands, which differs between ranks); NaN through complex PROD;
* ranks calling different collectives on signatures agreed earlier (so no agreement runs):
  the check value riding with the data makes every rank raise ``CollectiveMismatchError``;
* ``check=False`` and different lengths: an error on every rank, never a quiet answer;
* the paths of one signature mixed across ranks (the hot path on one rank, the plain path on
  another, a prepared call on a third): MPI matches them all alike, also between a prepared
  call's start() and wait(), on time or with a late rank;
* large payloads in pieces (limits lowered), small ones on persistent requests;
* the shared-memory all-reduce in many blocks (limit lowered), in place and not.
"""

from __future__ import annotations

import time

import numpy as np
from _common import WORLD, Report, meet
from collectives.backends import mpi
from collectives.backends.mpi import tuning

from collectives.errors import CollectiveError, CollectiveMismatchError

report = Report("natives")
n, rank = WORLD.size, WORLD.rank


def expect_error(name: str, fn, kinds=(CollectiveError,), within: float = 2.0) -> None:
    start = time.monotonic()
    try:
        got = fn()
    except kinds:
        took = time.monotonic() - start
        report.check(took < within, f"{name}: raised after {took:.2f} s")
        return
    except Exception as exc:  # noqa: BLE001 - the wrong error is a failure to report
        report.check(False, f"{name}: raised {type(exc).__name__}: {exc}")
        return
    report.check(False, f"{name}: returned {got!r} instead of raising")


def overlapping() -> None:
    comm = mpi.init(timeout=20)
    for algorithm in ("native", "auto"):
        for count in (3, 1 << 15, 1 << 18):  # persistent, and non-blocking
            buf = np.arange(count + 1, dtype=np.float64) + rank
            x, out = buf[0:count], buf[1:count + 1]
            want = sum(np.arange(count, dtype=np.float64) + r for r in range(n))
            got = comm.all_reduce(x, "sum", algorithm, out=out)
            report.check(got is out and np.array_equal(out, want),
                         f"overlap {algorithm} {count}: wrong result")
            y = np.arange(count, dtype=np.float64) + rank
            got = comm.all_reduce(y, "sum", algorithm, out=y)  # in place
            report.check(got is y and np.array_equal(y, want), f"in place {algorithm} {count}")
    comm.free()


def broadcasts() -> None:
    """Every rank, the root included, gets the root's data, whatever buffer holds it."""
    comm = mpi.init(timeout=20)
    for count in (5, 1 << 15):  # persistent, and non-blocking
        for k in range(4):
            data = np.random.default_rng(k).standard_normal(count)
            mine = data.copy() if rank == n - 1 else None
            if k == 0:
                got = comm.broadcast(mine, n - 1, "native")
            elif k == 1:  # into out=, the root's x itself included
                got = comm.broadcast(mine, n - 1, "native", out=mine if mine is not None
                                     else np.empty(count))
            else:
                got = comm.broadcast(mine, n - 1, "native", out=np.full(count, -1.0))
            report.check(np.array_equal(got, data), f"broadcast {count}, way {k}: wrong")
    comm.free()


def nans() -> None:
    comm = mpi.init(timeout=20)
    for count in (11, 1 << 14):  # persistent, and non-blocking
        for dtype in (np.float32, np.float64):
            for op in ("max", "min"):
                x = (np.arange(count) % 7).astype(dtype) + rank
                x[1 + rank] = np.nan  # a NaN of this rank only
                x[count - 1] = np.nan  # one on every rank
                # zeros of both signs, in turn by rank (MPICH's MAX kept the first it met,
                # in an order that differs between ranks: each had its peer's sign)
                x[0], x[count - 2] = (-0.0, 0.0) if rank % 2 else (0.0, -0.0)
                want = (np.maximum if op == "max" else np.minimum).reduce(
                    [np.where(np.arange(count) == 1 + r, np.nan, (np.arange(count) % 7) + r)
                     for r in range(n)]).astype(dtype)
                want[count - 1] = np.nan
                want[0] = want[count - 2] = 0.0
                for method in ("all_reduce", "reduce", "reduce_scatter"):
                    name = f"nan {method} {op} {np.dtype(dtype)} {count}"
                    if method == "all_reduce":
                        got, mine = comm.all_reduce(x, op, "native"), want
                    elif method == "reduce":
                        got, mine = comm.reduce(x, op, n - 1, "native"), want
                        if rank != n - 1:
                            report.check(got is None, f"{name}: non-root got a result")
                            got = mine
                    else:
                        got = comm.reduce_scatter(x, op, "native")
                        mine = want[rank * count // n:(rank + 1) * count // n]
                    report.check(np.array_equal(got, mine, equal_nan=True), f"{name}: wrong")
                    bits = WORLD.allgather(got.tobytes() if method == "all_reduce" else b"")
                    report.check(len(set(bits)) == 1, f"{name}: ranks differ")
    complex_products(comm)
    methods_named(comm)
    comm.free()


def methods_named(comm) -> None:
    """The transport names the method its latest native call ran (a benchmark's label): the
    hot path's MPI call after a shared-window one is "mpi" (it kept "shm")."""
    small, big = np.ones(16, np.float32), np.ones(1 << 17, np.float32)
    for _ in range(3):  # (the hot path from the second on)
        comm.all_reduce(small, algorithm="native")
    comm.all_reduce(big, algorithm="shm")
    after_shm = comm.transport.native.last
    comm.all_reduce(small, algorithm="native")
    report.check((after_shm, comm.transport.native.last) == ("shm", "mpi"),
                 f"native methods named {after_shm}, {comm.transport.native.last}")


def complex_products(comm) -> None:
    """A NaN times an infinity is NaN in complex PROD, as NumPy has it (MPICH's own complex
    multiply, C99's, made ``inf``: native and ``auto`` disagreed with every schedule)."""
    for dtype in (np.complex64, np.complex128):
        values = [complex(np.nan, np.inf), complex(np.inf, np.nan), complex(np.nan, 0),
                  complex(np.inf, np.inf), complex(1, 1), complex(1, 0)]
        table = np.array([np.roll(values, 3 * (r % 2))[:3] for r in range(n)], dtype)
        want = np.prod(table.astype(np.complex128), axis=0)
        for algorithm in ("native", "auto", "ring"):
            got = comm.all_reduce(table[rank], "prod", algorithm)
            name = f"complex prod {np.dtype(dtype)} {algorithm}"
            report.check(bool(np.isnan(got).all()) and bool(np.isnan(want).all()),
                         f"{name}: {got}, want NaN everywhere")


def different_collectives() -> None:
    """Both calls were agreed before, so no agreement runs: only the riding check can tell."""
    x = np.ones(8, np.float32)
    big = np.ones(1 << 17, np.float32)  # non-blocking path
    odd = rank == n - 1
    for name, data in (("small", x), ("large", big)):
        comm = mpi.init(timeout=10)
        comm.all_reduce(data, algorithm="native")
        comm.reduce(data, algorithm="native")
        expect_error(f"all_reduce vs reduce ({name})",
                     lambda c=comm, d=data: c.reduce(d, algorithm="native") if odd
                     else c.all_reduce(d, algorithm="native"), (CollectiveMismatchError,))
        comm.free()
    comm = mpi.init(timeout=10)
    for op in ("sum", "max"):
        comm.all_reduce(x, op, "native")
    expect_error("sum vs max", lambda: comm.all_reduce(x, "max" if rank == 0 else "sum", "native"),
                 (CollectiveMismatchError,))
    comm.free()


def unchecked_lengths() -> None:
    for algorithm in ("native", "ring", "auto"):
        for count in (4, 1 << 15):
            comm = mpi.init(timeout=1.0, check=False)
            expect_error(f"check=False lengths {algorithm} {count}",
                         lambda c=comm, a=algorithm, k=count: c.all_reduce(
                             np.ones(k + rank, np.float32), "sum", a), within=2.5)
            comm.free()


def mixed_paths() -> None:
    """One signature, several paths: the hot path (repeated calls with out=), the plain path
    (an asynchronous call, a buffer that is not an array), a prepared call, in one sequence."""
    comm = mpi.init(timeout=20)
    count = 64
    x = np.arange(count, dtype=np.float32) + rank
    want = sum(np.arange(count, dtype=np.float32) + r for r in range(n))
    out = np.empty_like(x)
    prepared = comm.all_reduce_init(x, out=np.empty_like(x))
    for i in range(60):
        path = (i + rank) % 4 if i else 3  # a prepared call agrees at its first start: together
        if path == 0:
            got = comm.all_reduce(x, out=out)
        elif path == 1:
            got = comm.all_reduce(x, async_op=True).wait()
        elif path == 2:
            got = comm.all_reduce(memoryview(x))  # not an ndarray: no hot path
        else:
            got = prepared.start().wait()
        report.check(np.array_equal(got, want), f"mixed paths, call {i}, path {path}: wrong")
    prepared.free()
    comm.free()


def prepared_between() -> None:
    """A prepared all-reduce (sum and mean) with calls of its own signature between start()
    and wait(), with every rank on time (it completes inside start()) and with a late rank
    (the start's spin runs out and the call stays in flight while the others run)."""
    comm = mpi.init(timeout=20)
    count = 64
    x = np.arange(count, dtype=np.float32) + rank
    want = sum(np.arange(count, dtype=np.float32) + r for r in range(n))
    out, mean_out, other = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    summed = comm.all_reduce_init(x, out=out)
    averaged = comm.all_reduce_init(x, "mean", out=mean_out)
    summed.start().wait()  # (agreed at their first start, together)
    averaged.start().wait()
    for late in (False, True):
        for k in range(4):
            if late and rank == n - 1:
                time.sleep(0.03)
            out.fill(-1)
            summed.start()
            averaged.start()
            between = comm.all_reduce(x, out=other)  # the same signature: the same entry
            report.check(averaged.wait() is mean_out and summed.wait() is out,
                         f"prepared between, late={late} {k}: not the bound out")
            report.check(np.array_equal(out, want) and np.array_equal(between, want)
                         and np.array_equal(mean_out, want / n),
                         f"prepared between, late={late} {k}: wrong")
            report.check(summed.is_completed(), f"prepared between, late={late} {k}: not done")
    summed.free()
    averaged.free()
    comm.free()


def pieces() -> None:
    saved = tuning.NATIVE_PIECE_BYTES, tuning.MAX_COUNT
    tuning.NATIVE_PIECE_BYTES, tuning.MAX_COUNT = 4096, 1000
    try:
        comm = mpi.init(timeout=20)
        x = np.arange(100_003, dtype=np.float64) + rank  # 196 pieces of 512 elements
        want = sum(np.arange(100_003, dtype=np.float64) + r for r in range(n))
        comm.all_reduce(x, algorithm="native")  # agreed once, before calls pile up
        works = [comm.all_reduce(x, algorithm="native", async_op=True) for _ in range(3)]
        small = comm.all_reduce(np.ones(3), algorithm="native")  # queued behind the pieces
        for k, work in enumerate(reversed(works)):
            report.check(np.array_equal(work.wait(), want), f"pieces, async call {k}: wrong")
        report.check(np.array_equal(small, np.full(3, n)), "a small call after the pieces")
        comm.free()
    finally:
        tuning.NATIVE_PIECE_BYTES, tuning.MAX_COUNT = saved


def shm_blocks() -> None:
    """The shared-memory all-reduce in many small blocks (limit lowered): out=, in place and a
    new result, with counts that do not split evenly, give the exact sums everywhere."""
    saved = tuning.SHM_BLOCK_BYTES
    tuning.SHM_BLOCK_BYTES = 40  # 10 float32 per block
    try:
        comm = mpi.init(timeout=20)
        for count in (1, 7, 333, 4099):
            want = sum(np.arange(count, dtype=np.float32) * (r + 1) for r in range(n))
            for how in ("out", "in place", "new"):
                x = np.arange(count, dtype=np.float32) * (rank + 1)
                kept = x.copy()
                if how == "out":
                    got = comm.all_reduce(x, algorithm="shm", out=np.empty_like(x))
                elif how == "in place":
                    got = comm.all_reduce(x, algorithm="shm", out=x)
                else:
                    got = comm.all_reduce(x, algorithm="shm")
                report.check(np.array_equal(got, want), f"shm blocks {count} {how}: wrong")
                if how != "in place":
                    report.check(np.array_equal(x, kept), f"shm blocks {count} {how}: x changed")
        comm.free()
    finally:
        tuning.SHM_BLOCK_BYTES = saved


def main() -> None:
    overlapping()
    meet()
    broadcasts()
    meet()
    if n > 1:
        nans()
        meet()
        different_collectives()
        meet()
        unchecked_lengths()
        meet()
    mixed_paths()
    meet()
    prepared_between()
    meet()
    pieces()
    meet()
    shm_blocks()
    report.finish()


if __name__ == "__main__":
    main()
