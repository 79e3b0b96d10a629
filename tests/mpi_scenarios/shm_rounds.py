"""The shared-memory all-reduce in many rounds and blocks (limits lowered), through the window
and reading peers' memory directly: every rank holds the same bits, those of the rank-order
reduction, or every rank raises.

* float32 inputs whose sums round (random values): the result equals, bit for bit on every
  rank, ``((x_0 + x_1) + x_2) + ...`` in float32, each rank's input rebuilt from its seed;
* out=, in place and a new result, counts that split unevenly over rounds and ranks, float64,
  int32 and MAX with a NaN;
* several calls in flight at once (``async_op=True``), waited in reverse order, each spanning
  rounds whose buffers alternate, then a small call behind them;
* ranks that disagree about the length: ``CollectiveMismatchError`` on every rank, also where
  that puts one rank on the direct path and the others on the window's;
* shared arrays (``Communicator.shared_empty``): in place and one into another, the same bits
  as the rank-order sum, a rank that overwrites its array the moment its call returns (its
  peers still get theirs right), calls in flight, and ranks where some pass shared arrays and
  some not, or arrays of different ``shared_empty`` calls: ``CollectiveMismatchError``;
* ``auto`` on shared arrays runs the shared-memory all-reduce from its threshold up (and not
  below it, nor out of place into a new result), also where one rank's ``out`` is another
  view of its ``x`` or overlaps it in part; a rank whose arrays are not shared makes
  every rank raise ``CollectiveMismatchError`` naming the algorithm each ran, also where both
  signatures were agreed before (each rank moves data at once, on paths that never meet);
* a bad ``shared_empty`` shape on one rank: its ValueError there, PeerFailedError elsewhere.
"""

from __future__ import annotations

import numpy as np
from _common import WORLD, Report, meet
from collectives.backends import mpi
from collectives.backends.mpi import tuning

from collectives.errors import CollectiveMismatchError, PeerFailedError

report = Report("shm_rounds")
n, rank = WORLD.size, WORLD.rank


def inputs(count: int, dtype, seed: int) -> list[np.ndarray]:
    """Every rank's input (rebuilt on each rank from the seeds)."""
    return [np.random.default_rng([seed, r]).standard_normal(count).astype(dtype) for r in range(n)]


def rank_order(xs: list[np.ndarray], op=np.add) -> np.ndarray:
    total = xs[0].copy()
    for x in xs[1:]:
        op(total, x, out=total)
    return total


def same_bits_everywhere(got: np.ndarray, what: str) -> None:
    first = WORLD.bcast(got.tobytes() if rank == 0 else None, root=0)
    report.check(first == got.tobytes(), f"{what}: ranks hold different bits")


def rounding(comm) -> None:
    for count in (1, 5, 97, 1000, 4099):
        xs = inputs(count, np.float32, count)
        want = rank_order(xs)
        for how in ("out", "in place", "new"):
            x = xs[rank].copy()
            if how == "out":
                got = comm.all_reduce(x, algorithm="shm", out=np.empty_like(x))
            elif how == "in place":
                got = comm.all_reduce(x, algorithm="shm", out=x)
            else:
                got = comm.all_reduce(x, algorithm="shm")
            report.check(got.tobytes() == want.tobytes(), f"float32 {count} {how}: not rank order")
            if how != "in place":
                report.check(np.array_equal(x, xs[rank]), f"float32 {count} {how}: x changed")
            same_bits_everywhere(got, f"float32 {count} {how}")


def dtypes(comm) -> None:
    count = 2001
    x64 = np.arange(count, dtype=np.float64) * (rank + 1)
    report.check(np.array_equal(comm.all_reduce(x64, algorithm="shm"),
                                np.arange(count, dtype=np.float64) * (n * (n + 1) // 2)), "float64")
    xi = np.arange(count, dtype=np.int32) - rank
    report.check(np.array_equal(comm.all_reduce(xi, algorithm="shm"),
                                n * np.arange(count, dtype=np.int32) - n * (n - 1) // 2), "int32")
    xm = np.arange(count, dtype=np.float32) + rank
    if rank == n - 1:
        xm[777] = np.nan
    got = comm.all_reduce(xm, "max", "shm")
    want = np.arange(count, dtype=np.float32) + (n - 1)
    want[777] = np.nan
    report.check(np.array_equal(got, want, equal_nan=True), "max with a NaN")


def in_flight(comm) -> None:
    counts = (3001, 17, 2500, 999)
    xs = [inputs(c, np.float32, 100 + c) for c in counts]
    works = [comm.all_reduce(x[rank], algorithm="shm", async_op=True) for x in xs]
    small = comm.all_reduce(np.ones(2, np.float32), algorithm="shm")
    for k in reversed(range(len(works))):
        got = works[k].wait()
        report.check(got.tobytes() == rank_order(xs[k]).tobytes(), f"async call {k}: wrong bits")
        same_bits_everywhere(got, f"async call {k}")
    report.check(np.array_equal(small, np.full(2, n, np.float32)), "a small call behind them")


def raises_mismatch(call, says: str, what: str) -> None:
    """``call()`` raises CollectiveMismatchError whose text holds ``says``."""
    try:
        call()
    except CollectiveMismatchError as exc:
        report.check(says in str(exc), f"{what}: the error does not say why: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - the wrong error is a failure to report
        report.check(False, f"{what}: raised {type(exc).__name__}: {exc}")
        return
    report.check(False, f"{what}: the ranks got an answer")


def mismatch(comm) -> None:
    count = 1000 + (rank == n - 1)
    raises_mismatch(lambda: comm.all_reduce(np.ones(count, np.float32), algorithm="shm"), "",
                    "different lengths")


def shared(comm) -> None:
    counts = (0, 1, 5, 97, 4099)
    for count in counts:
        xs = inputs(count, np.float32, 7 + count)
        want = rank_order(xs)
        a = comm.shared_empty((2, count), np.float32)
        report.check(a.shape == (2, count) and not a.any(), f"shared {count}: not zeroed")
        a[0] = xs[rank]
        got = comm.all_reduce(a[0], algorithm="shm", out=a[1])
        report.check(got.tobytes() == want.tobytes(), f"shared {count} into another: not rank order")
        report.check(np.array_equal(a[0], xs[rank]), f"shared {count}: input changed")
        got = comm.all_reduce(a[0], algorithm="shm", out=a[0])
        report.check(count == 0 or np.shares_memory(got, a[0]),
                     f"shared {count} in place: result elsewhere")
        report.check(got.tobytes() == want.tobytes(), f"shared {count} in place: not rank order")
        same_bits_everywhere(got, f"shared {count}")
    # other ops and dtypes (MEAN divides each rank's own result after the call)
    m = comm.shared_empty(2001, np.float64)
    m[:] = np.arange(2001) * (rank + 1)
    got = comm.all_reduce(m, "mean", "shm", out=m)
    report.check(np.array_equal(got, np.arange(2001) * (n * (n + 1) // 2) / n), "shared mean")
    i = comm.shared_empty(2001, np.int32)
    i[:] = np.arange(2001, dtype=np.int32) - rank
    got = comm.all_reduce(i, "max", "shm", out=i)
    report.check(np.array_equal(got, np.arange(2001, dtype=np.int32)), "shared int32 max")
    # a rank overwrites its array as soon as its call returns: peers still read the sum
    x = comm.shared_empty(4099, np.float32)
    for k in range(60):
        x[:] = rank + k
        got = comm.all_reduce(x, algorithm="shm", out=x).copy()
        x[:] = -1e9
        report.check(np.array_equal(got, np.full(4099, n * k + n * (n - 1) / 2, np.float32)),
                     f"overwritten at return, call {k}: a peer read it too early")
    # in flight, waited in reverse, then a call on ordinary arrays behind them
    bufs = [comm.shared_empty(c, np.float32) for c in (3001, 17, 2500)]
    for k, b in enumerate(bufs):
        b[:] = inputs(len(b), np.float32, 300 + k)[rank]
    works = [comm.all_reduce(b, algorithm="shm", out=b, async_op=True) for b in bufs]
    small = comm.all_reduce(np.ones(2, np.float32), algorithm="shm")
    for k in reversed(range(len(works))):
        got = works[k].wait()
        report.check(got.tobytes() == rank_order(inputs(len(got), np.float32, 300 + k)).tobytes(),
                     f"shared async call {k}: wrong bits")
    report.check(np.array_equal(small, np.full(2, n, np.float32)), "a plain call behind them")


def auto_shared(comm) -> None:
    native = comm.transport.native
    big = comm.shared_empty(1500, np.float32)  # (6000 bytes: SHM_SHARED_FROM_BYTES is 4000 here)
    small = comm.shared_empty(900, np.float32)
    for x, runs in ((big, "shm"), (small, "mpi")):
        x[:] = rank + 1
        native.last = None
        got = comm.all_reduce(x, out=x)
        report.check(np.array_equal(got, np.full(len(x), n * (n + 1) / 2, np.float32)),
                     f"auto, shared {len(x)}: wrong sum")
        report.check(native.last == runs, f"auto, shared {len(x)}: ran {native.last}, not {runs}")
    big[:] = rank + 1  # the same, prepared (agreed once, started twice)
    prepared = comm.all_reduce_init(big, out=big)
    for k in range(2):
        native.last = None
        prepared.start().wait()
        report.check(native.last == "shm", f"auto, shared, prepared start {k}: ran {native.last}")
    report.check(np.array_equal(big, np.full(1500, (n * (n + 1) / 2) * n, np.float32)),
                 "auto, shared, prepared: wrong sums")
    # the last rank's out is another view of x's memory, or overlaps x in part (the others
    # in place): every rank runs the shared all-reduce (they mismatched: that rank's result
    # went to a buffer of its own), the right sum (rank + 1) * 10 ** k from index 0 up
    wide = comm.shared_empty(1501, np.float32)
    for views in ((slice(0, 1500), slice(0, 1500)), (slice(0, 1500), slice(1, 1501))):
        for k in range(2):
            x = wide[:1500]
            x[:] = (rank + 1) * 10 ** k
            out = wide[views[1]] if rank == n - 1 else x
            native.last = None
            got = comm.all_reduce(x, out=out)
            report.check(got is out and np.array_equal(out, np.full(1500, n * (n + 1) / 2
                                                                    * 10 ** k, np.float32)),
                         f"auto, shared, out {views[1]} of x {views[0]}: wrong sum")
            report.check(native.last == "shm", f"auto, shared, out {views[1]}: ran {native.last}")
    native.last = None
    comm.all_reduce(big)  # a new result: not shared
    report.check(native.last != "shm", "auto, shared input into a new result: ran shm")
    x = big if rank != n - 1 else np.zeros(1500, np.float32)
    raises_mismatch(lambda: comm.all_reduce(x, out=x), "auto (shared arrays)",
                    "auto, shared and private arrays")


def agreed_shared_and_private() -> None:
    """Shared arrays on some ranks, private ones on another, where each rank agreed both
    signatures before (at the default limits: 1 MiB runs on paths that never exchange a
    message): each moves data at once, and their published checks tell (in a slow wait)."""
    comm = mpi.init(timeout=20)
    big, private = comm.shared_empty(1 << 18, np.float32), np.zeros(1 << 18, np.float32)
    comm.all_reduce(big, out=big)
    comm.all_reduce(private, out=private)
    x = big if rank != n - 1 else private
    raises_mismatch(lambda: comm.all_reduce(x, out=x), "",  # (a rank whose data came from
                    "auto, shared and private arrays, both agreed before")  # a peer: its check)


def shared_mismatch(make) -> None:
    comm = mpi.init(timeout=20)
    x = make(comm)
    raises_mismatch(lambda: comm.all_reduce(x, algorithm="shm", out=x), "shared",
                    f"shared arrays, {make.__name__}")


def one_private(comm):
    x = comm.shared_empty(1000, np.float32)
    return np.zeros(1000, np.float32) if rank == n - 1 else x


def other_blocks(comm):
    a, b = comm.shared_empty(1000, np.float32), comm.shared_empty(1000, np.float32)
    return b if rank == 0 else a


def bad_shared_on_one_rank(comm) -> None:
    """A bad shape on one rank: that rank's ValueError naming it, PeerFailedError naming that
    rank on the others, in the agreement, and the communicator still works (the window was
    sized from the bad shape before the agreement: a TypeError on that rank alone, and its
    peers' calls then paired with its next one)."""
    last = n - 1
    try:
        comm.shared_empty(-3 if rank == last else 3, np.float32)
        report.check(n == 1, "a bad shape on one rank: no error")
    except ValueError as exc:
        report.check(rank == last and "shape=-3" in str(exc), f"bad shape: {exc}")
    except PeerFailedError as exc:
        report.check(rank != last and f"rank {last}" in str(exc), f"bad shape: {exc}")
    got = comm.all_reduce(np.ones(2, np.float32))
    report.check(np.array_equal(got, np.full(2, n, np.float32)), "after a bad shape: unusable")


def main() -> None:
    saved = tuning.SHM_ROUND_BYTES, tuning.SHM_BLOCK_BYTES, tuning.SHM_DIRECT_BYTES
    shared_from = tuning.SHM_SHARED_FROM_BYTES
    tuning.SHM_SHARED_FROM_BYTES = 4000
    tuning.SHM_ROUND_BYTES, tuning.SHM_BLOCK_BYTES = 4000, 40  # 1000 float32 a round, 10 a block
    direct_ran = False
    try:
        for direct in (None, 0):  # through the window; reading peers directly, every size
            tuning.SHM_DIRECT_BYTES = direct
            comm = mpi.init(timeout=20)
            rounding(comm)
            meet()
            dtypes(comm)
            meet()
            in_flight(comm)
            meet()
            direct_ran = direct_ran or (direct == 0 and comm.transport.native.shm.direct)
            comm.free()
            comm = mpi.init(timeout=20)
            mismatch(comm)
            meet()
        tuning.SHM_DIRECT_BYTES = 4004  # the longer call reads directly, the others do not
        comm = mpi.init(timeout=20)
        mismatch(comm)
        meet()
        tuning.SHM_DIRECT_BYTES = None
        comm = mpi.init(timeout=20)
        shared(comm)
        meet()
        bad_shared_on_one_rank(comm)
        meet()
        comm.free()
        for make in (one_private, other_blocks):
            shared_mismatch(make)
            meet()
        auto_shared(mpi.init(timeout=20))
        meet()
    finally:
        tuning.SHM_ROUND_BYTES, tuning.SHM_BLOCK_BYTES, tuning.SHM_DIRECT_BYTES = saved
        tuning.SHM_SHARED_FROM_BYTES = shared_from
    agreed_shared_and_private()
    meet()
    report.finish(f"direct={'read' if direct_ran else 'unavailable here'}")


if __name__ == "__main__":
    main()
