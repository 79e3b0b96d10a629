"""Where a small MPI all-reduce spends its microseconds beyond MPI's own: the hot path profiled.

Run it as a plain script; it launches itself under ``mpiexec -n 1`` (beside this Python):

    python benchmarks/mpi_hot_path.py [-s 4K 64K] [-n 100000] [-r 21]

On one rank nothing waits for a peer, so the CPU time a call takes (``time.thread_time``) is
its work alone, free of the scheduler's noise on a loaded machine: the CPU time per call of
mpi4py's ``Allreduce``, of a persistent ``Allreduce_init`` started and tested (MPI's own floor
for a repeated call), and of this library's ``all_reduce(x, out=out)``, ``all_reduce(x)``,
MEAN, a prepared call's ``start().wait()`` and an asynchronous call's issue and ``wait()``
(beside mpi4py's ``Iallreduce`` and ``Wait``) (each naming ``"native"``, what ``auto`` runs
at these sizes on two ranks); each the best of ``-r`` interleaved repeats.
Then ``cProfile`` over ``-n`` calls of each of the library's two ways: the Python functions
one call runs, and where their time goes. (What the ranks' MPI adds on top, the transfer and
the waiting, is ``mpi_compare.py``'s business.)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_size(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def cpu_per_call(fn, iters: int) -> float:
    start = time.thread_time()
    for _ in range(iters):
        fn()
    return (time.thread_time() - start) / iters


def worker(sizes: list[int], calls: int, repeats: int) -> None:
    sys.path.insert(0, ROOT)
    from collectives.backends import mpi
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    comm = mpi.init(timeout=60)
    for nbytes in sizes:
        one_size(world, comm, nbytes, calls, repeats)
    comm.free()


def one_size(world, comm, nbytes: int, calls: int, repeats: int) -> None:
    x = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x)
    raw_in, raw_out = np.ones_like(x), np.empty_like(x)
    request = world.Allreduce_init(raw_in, raw_out)
    # "native" by name: what auto runs at these sizes on two ranks or more (on one rank auto
    # makes a copy, which is no measure of the hot path)
    prepared = comm.all_reduce_init(x, "sum", "native", out=out)

    def persistent():
        request.Start()
        request.Wait()

    ways = {"mpi4py Allreduce": lambda: world.Allreduce(x, out),
            "mpi4py Iallreduce + Wait": lambda: world.Iallreduce(x, out).Wait(),
            "MPI persistent Start+Wait": persistent,
            "all_reduce(x, out=out)": lambda: comm.all_reduce(x, "sum", "native", out=out),
            "all_reduce(x)": lambda: comm.all_reduce(x, "sum", "native"),
            "all_reduce(x, 'mean', out=out)": lambda: comm.all_reduce(x, "mean", "native",
                                                                      out=out),
            "prepared start().wait()": lambda: prepared.start().wait(),
            "all_reduce(x, out=out, async_op=True).wait()": lambda: comm.all_reduce(
                x, "sum", "native", out=out, async_op=True).wait()}
    for fn in ways.values():  # agreed, bound and warm
        for _ in range(3):
            fn()
    best = {name: float("inf") for name in ways}
    iters = max(calls // 50, 100)
    for _ in range(repeats):
        for name, fn in ways.items():
            best[name] = min(best[name], cpu_per_call(fn, iters))
    base = best["mpi4py Allreduce"]
    print(f"\n{nbytes // 1024} KiB, one rank: CPU µs per call (best of {repeats} interleaved "
          f"repeats of {iters} calls)")
    for name, t in best.items():
        print(f"  {name:<46} {t * 1e6:8.3f}  (+{(t - base) * 1e6:6.3f} over mpi4py)")
    for name in ("all_reduce(x, out=out)", "prepared start().wait()",
                 "all_reduce(x, out=out, async_op=True).wait()"):
        profile = cProfile.Profile()
        fn = ways[name]
        profile.enable()
        for _ in range(calls):
            fn()
        profile.disable()
        stats = pstats.Stats(profile, stream=io.StringIO())
        total_calls = sum(v[1] for v in stats.stats.values())
        print(f"\n  cProfile, {calls} x {name}: {total_calls / calls:.0f} Python-level "
              "function calls per call; by own time:")
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(8)
        lines = text.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.strip().startswith("ncalls"))
        for line in lines[start:start + 9]:
            print("   ", line.replace(ROOT + "/", ""))
    request.Free()
    prepared.free()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-s", "--sizes", nargs="+", default=["4K", "64K"])
    parser.add_argument("-n", "--calls", type=int, default=100_000)
    parser.add_argument("-r", "--repeats", type=int, default=21)
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    if args.worker:
        worker(sizes, args.calls, args.repeats)
        return
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    cmd = [mpiexec, "-n", "1", sys.executable, os.path.abspath(__file__), "--worker",
           "-s", *args.sizes, "-n", str(args.calls), "-r", str(args.repeats)]
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
