"""What this machine's memory allows: NumPy copy and add bandwidth, and an all-reduce bound.

Measures ``np.copyto(dst, src)`` and ``np.add(a, b, out=c)`` on float32 arrays of 4 KiB to
64 MiB, on 1 thread and on 2 threads (a thread pool; the arrays split in halves, the caller
doing one half as the library's local backend does). Bandwidth counts every byte read and
written: a copy of S bytes moves 2S, an add moves 3S. Each number is the median over
repeats of the time per call.

The all-reduce bound. A multi-device all-reduce of p devices x S bytes in one address
space must at least read each of the p inputs once (p*S bytes) and write each of the p
outputs once (p*S bytes); every algorithm of the library reaches exactly that traffic
(the multi-device executor runs the whole schedule tile by tile in cache). The reduction's
arithmetic is a few adds per byte, far below memory speed, so it can hide behind the
traffic. The cheapest way to move those 2*p*S bytes through memory is a streaming copy, so

    t_bound(p, S) = (p*S read + p*S written) / (copy bandwidth, bytes read+written per s)

The copy bandwidth is measured on the all-reduce's own footprint: p separate S-byte arrays
copied into p others (same allocation sizes, so the same cache level and page backing),
each array split in halves over 2 threads: ``bound_2t_us``. Below about 1 MiB the hand-off
to the second thread (tens of microseconds on a VM) dominates that copy, and the library
itself stays on one thread there, so the same copy on 1 thread is also measured
(``bound_1t_us``) and the bound reported is the smaller of the two (``bound_us``). It bounds
data movement only: the library's per-call Python overhead is not in it, so small sizes are
expected to sit well above it.

The SPMD bound (``SpmdShare``, ``spmd_rows``). Across p processes of one host, each rank's
least share of an all-reduce of S bytes is: reduce its S/p slice (read the p ranks' slices,
S bytes, write S/p), then copy the p - 1 other reduced slices into its output (read and write
(p-1)/p*S). Every rank runs that at once, on private arrays, as the ranks of an all-reduce
do (they share the memory bus and, oversubscribed, the cores); a repeat lasts as long as
the slowest rank. It takes the peers' slices as readable in place, which processes with
private inputs cannot do without a copy: ``copy-in`` adds one copy of the (p-1)/p*S bytes
the others reduce (what a shared-memory all-reduce moves to expose them), as a second
reference. ``push`` is the least of all, where every rank can write into every other's
output (arrays in memory they all map): reduce the slice a cache-sized block at a time and
write each block into every rank's output while it is in cache (read S, write S: no reduced
slice is read back). The mpi_compare benchmark times these kernels under MPI, beside every
method.

    python benchmarks/ceiling.py [-p 4] [-b 4K] [-e 64M] [-r 5] [--spmd 2 3 4] [--json ceiling.json]
"""

from __future__ import annotations

import argparse
import multiprocessing
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from collectives.tools import bench

DTYPE = np.dtype(np.float32)


class Kernels:
    """Copy and add on 1 or 2 threads over preallocated float32 arrays."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="ceiling")

    def _split(self, fn: Callable[[slice], object], length: int, threads: int) -> Callable[[], object]:
        if threads == 1:
            whole = slice(0, length)
            return lambda: fn(whole)
        halves = (slice(0, length // 2), slice(length // 2, length))

        def run() -> None:
            future = self.pool.submit(fn, halves[1])
            fn(halves[0])
            future.result()

        return run

    def copy(self, nbytes: int, threads: int) -> tuple[Callable[[], object], int]:
        """A call copying ``nbytes`` and the bytes it reads plus writes."""
        n = max(1, nbytes // DTYPE.itemsize)
        src, dst = np.ones(n, DTYPE), np.zeros(n, DTYPE)
        return self._split(lambda s: np.copyto(dst[s], src[s]), n, threads), 2 * n * DTYPE.itemsize

    def add(self, nbytes: int, threads: int) -> tuple[Callable[[], object], int]:
        """A call adding two ``nbytes`` arrays into a third, and the bytes it moves."""
        n = max(1, nbytes // DTYPE.itemsize)
        a, b, c = np.ones(n, DTYPE), np.ones(n, DTYPE), np.zeros(n, DTYPE)
        return (self._split(lambda s: np.add(a[s], b[s], out=c[s]), n, threads),
                3 * n * DTYPE.itemsize)

    def copy_many(self, p: int, nbytes: int, threads: int) -> tuple[Callable[[], object], int]:
        """A call copying p arrays of ``nbytes`` into p others (an all-reduce's footprint)."""
        n = max(1, nbytes // DTYPE.itemsize)
        srcs = [np.ones(n, DTYPE) for _ in range(p)]
        dsts = [np.zeros(n, DTYPE) for _ in range(p)]

        def part(s: slice) -> None:
            for src, dst in zip(srcs, dsts):
                np.copyto(dst[s], src[s])

        return self._split(part, n, threads), 2 * p * n * DTYPE.itemsize

    def close(self) -> None:
        self.pool.shutdown()


def sizes(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def bandwidth_table(kernels: Kernels, lo: int, hi: int, repeats: int) -> list[dict]:
    """Copy and add GB/s (bytes read+written per second) on 1 and 2 threads per size."""
    rows = []
    for s in sizes(lo, hi):
        row: dict = {"size": s}
        for kind in ("copy", "add"):
            for threads in (1, 2):
                call, moved = getattr(kernels, kind)(s, threads)
                m = bench.measure(call, warmup=2, repeats=repeats)
                row[f"{kind}_{threads}t_us"] = m.seconds * 1e6
                row[f"{kind}_{threads}t_gbps"] = moved / m.seconds / 1e9
        rows.append(row)
    return rows


def bound_row(kernels: Kernels, p: int, s: int, repeats: int, target: float = bench.TARGET_SECONDS,
              warmup: int = 2) -> dict:
    """The all-reduce lower bound for p devices x S bytes (see the module docstring)."""
    row: dict = {"size": s, "participants": p}
    for threads in (1, 2):
        call, moved = kernels.copy_many(p, s, threads)
        m = bench.measure(call, warmup=warmup, repeats=repeats, target=target)
        row[f"bound_{threads}t_us"] = m.seconds * 1e6
        row[f"copy_{threads}t_gbps"] = moved / m.seconds / 1e9
    row["bytes_moved"] = moved
    return finish_bound(row)


def finish_bound(row: dict) -> dict:
    """Add ``bound_us`` (the faster copy) and its algbw/busbw to a row with both copy times."""
    row["bound_us"] = min(row["bound_1t_us"], row["bound_2t_us"])
    algbw = row["size"] / (row["bound_us"] * 1e-6) / 1e9
    row["bound_algbw"] = algbw
    row["bound_busbw"] = algbw * bench.bus_factor("all_reduce", row["participants"])
    return row


def bound_rows(kernels: Kernels, p: int, lo: int, hi: int, repeats: int) -> list[dict]:
    """``bound_row`` for every size of the sweep."""
    return [bound_row(kernels, p, s, repeats) for s in sizes(lo, hi)]


class SpmdShare:
    """One rank's least work in a p-rank all-reduce of ``nbytes`` float32 (module docstring):
    a call does it once; ``moved`` is the bytes it reads plus writes."""

    def __init__(self, p: int, nbytes: int, copy_in: bool = False, block_bytes: int = 256 << 10,
                 push: bool = False):
        n = max(p, nbytes // DTYPE.itemsize)
        self.p, self.copy_in, self.push = p, copy_in, push
        self.cuts = [(q * n // p, (q + 1) * n // p) for q in range(p)]
        lo, hi = self.cuts[0]  # (this rank's slice: any one of the same length will do)
        self.x, self.out = np.ones(n, DTYPE), np.zeros(n, DTYPE)
        self.peers = [np.ones(hi - lo, DTYPE) for _ in range(p - 1)]  # its slice, at the others
        self.results = [np.ones(b - a, DTYPE) for a, b in self.cuts[1:]]  # their reduced slices
        self.exposed = np.zeros(n - (hi - lo), DTYPE)  # copy_in: what the others reduce
        self.step = max(1, block_bytes // DTYPE.itemsize)
        mine, others = (hi - lo) * DTYPE.itemsize, (n - hi + lo) * DTYPE.itemsize
        self.moved = p * mine + mine + 2 * others + (2 * others if copy_in else 0)
        self.pushed = [np.zeros(hi - lo, DTYPE) for _ in range(p - 1)] if push else []
        if push:  # the slices read, the reduced slice written into every output
            self.moved = 2 * p * mine

    def __call__(self) -> None:
        lo, hi = self.cuts[0]
        x, out = self.x, self.out
        if self.push:
            for a in range(lo, hi, self.step):
                b = min(a + self.step, hi)
                np.add(x[a:b], self.peers[0][a - lo:b - lo], out=out[a:b])
                for peer in self.peers[1:]:
                    np.add(out[a:b], peer[a - lo:b - lo], out=out[a:b])
                for output in self.pushed:
                    np.copyto(output[a - lo:b - lo], out[a:b])
            return
        if self.copy_in:
            np.copyto(self.exposed, x[hi:])
        if self.p == 2:  # one pass, whole
            np.add(x[lo:hi], self.peers[0], out=out[lo:hi])
        else:  # a cache-sized block at a time, so that the partial sums stay in cache
            for a in range(lo, hi, self.step):
                b = min(a + self.step, hi)
                np.add(x[a:b], self.peers[0][a - lo:b - lo], out=out[a:b])
                for peer in self.peers[1:]:
                    np.add(out[a:b], peer[a - lo:b - lo], out=out[a:b])
        for (a, b), result in zip(self.cuts[1:], self.results):
            np.copyto(out[a:b], result)


def _spmd_rank(p: int, nbytes: int, copy_in: bool, repeats: int, barrier, times) -> None:
    """One rank of ``spmd_row``: per repeat, a barrier, then calls for about 20 ms."""
    share = SpmdShare(p, nbytes, copy_in)
    share()
    barrier.wait()
    start = time.perf_counter()
    share()
    iters = max(1, min(1000, int(bench.TARGET_SECONDS / max(time.perf_counter() - start, 1e-7))))
    for rep in range(repeats):
        barrier.wait()
        start = time.perf_counter()
        for _ in range(iters):
            share()
        times.append((rep, (time.perf_counter() - start) / iters))


def spmd_row(p: int, nbytes: int, repeats: int) -> dict:
    """The SPMD bound of p processes x ``nbytes``, without and with the copy-in: per repeat
    the slowest rank's time per call (the ranks start together), the median over repeats."""
    # (forkserver, not fork: the caller may run threads, a progress thread or JAX's, and a
    # child forked while one holds a lock can deadlock)
    ctx = multiprocessing.get_context("forkserver")
    row: dict = {"size": nbytes, "participants": p}
    for copy_in in (False, True):
        barrier, times = ctx.Barrier(p), ctx.Manager().list()
        ranks = [ctx.Process(target=_spmd_rank, args=(p, nbytes, copy_in, repeats, barrier, times))
                 for _ in range(p)]
        for rank in ranks:
            rank.start()
        for rank in ranks:
            rank.join()
        slowest = [max(t for r, t in times if r == rep) for rep in range(repeats)]
        key = "spmd_copy_in_us" if copy_in else "spmd_us"
        row[key] = statistics.median(slowest) * 1e6
        row[key.replace("_us", "_moved")] = SpmdShare(p, nbytes, copy_in).moved
    return row


def main(argv: list[str] | None = None) -> int:
    """Print the bandwidth and bound tables; ``--json`` also writes them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--participants", type=int, default=4)
    parser.add_argument("-b", "--minbytes", type=bench.parse_size, default="4K")
    parser.add_argument("-e", "--maxbytes", type=bench.parse_size, default="64M")
    parser.add_argument("-r", "--repeats", type=int, default=5)
    parser.add_argument("--spmd", type=int, nargs="*", default=[], metavar="P",
                        help="also the SPMD bound of P processes (each size)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "benchmarks/ceiling.py", *(sys.argv[1:] if argv is None else argv)])
    machine = bench.machine_info()
    print(f"# {command}\n# {machine['node']} ({machine['cpu_count']} CPUs), numpy {np.__version__}")
    kernels = Kernels()
    try:
        table = bandwidth_table(kernels, args.minbytes, args.maxbytes, args.repeats)
        print("# NumPy bandwidth, GB/s of bytes read + written (median of repeats)")
        print(f"#{'size(B)':>11} {'copy 1T':>9} {'copy 2T':>9} {'add 1T':>9} {'add 2T':>9}")
        for r in table:
            print(f"{r['size']:>12} {r['copy_1t_gbps']:>9.2f} {r['copy_2t_gbps']:>9.2f} "
                  f"{r['add_1t_gbps']:>9.2f} {r['add_2t_gbps']:>9.2f}")
        bound = bound_rows(kernels, args.participants, args.minbytes, args.maxbytes, args.repeats)
    finally:
        kernels.close()
    p = args.participants
    print(f"# all-reduce lower bound, {p} devices x S bytes: a copy of {p} arrays of S bytes "
          "(2 threads, and 1 thread where that is faster)")
    print(f"#{'S(B)':>11} {'moved(B)':>12} {'2T(us)':>10} {'1T(us)':>10} {'bound(us)':>10} "
          f"{'algbw':>8} {'busbw':>8}")
    for r in bound:
        print(f"{r['size']:>12} {r['bytes_moved']:>12} {r['bound_2t_us']:>10.2f} {r['bound_1t_us']:>10.2f} "
              f"{r['bound_us']:>10.2f} {r['bound_algbw']:>8.3f} {r['bound_busbw']:>8.3f}")
    spmd = [spmd_row(q, s, args.repeats) for q in args.spmd for s in sizes(args.minbytes, args.maxbytes)]
    if spmd:
        print("# SPMD all-reduce bound, p processes x S bytes at once: each rank reduces its slice "
              "and copies the others' (copy-in: plus a copy of what the others reduce)")
        print(f"#{'p':>2} {'S(B)':>11} {'moved(B)':>12} {'bound(us)':>10} {'GB/s':>7} "
              f"{'copy-in(us)':>12}")
    for r in spmd:
        print(f"{r['participants']:>3} {r['size']:>11} {r['spmd_moved']:>12} {r['spmd_us']:>10.2f} "
              f"{r['spmd_moved'] / r['spmd_us'] / 1e3:>7.2f} {r['spmd_copy_in_us']:>12.2f}")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({**bench.metadata(command), "bandwidth": table, "allreduce_bound": bound,
                       "spmd_bound": spmd}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
