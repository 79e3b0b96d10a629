"""A training step's gradient list across MPI processes: this library beside mpi4py.

ResNet-50's 161 gradient tensors (their real shapes, 25.6 M float32; ``--scale`` shrinks every
tensor for a quick look), all-reduced (sum) every step by each of, in one launch:

* ``batch_all_reduce`` with its defaults (fused into 64 MiB buckets);
* ``batch_all_reduce(bucket_bytes=0)``: every tensor alone (the old default);
* ``buckets()``: the same buckets started as their tensors are marked ready (last layer first);
* mpi4py per tensor: ``Allreduce(IN_PLACE, t)`` for each tensor;
* mpi4py flattened: ``np.concatenate``, one ``Allreduce``, each slice copied back.

Run it as a plain script; it launches ``mpiexec`` beside this Python itself:

    python benchmarks/mpi_gradients.py [-p 2] [-r 7] [--scale 1.0] [--json out.json]

Protocol: each repeat starts with a barrier and times one step of every method, in an order
rotated from repeat to repeat; a step's time is the maximum over ranks; cells are medians over
repeats, with each method's ratio to the faster of mpi4py's two ways. Results are checked once
before timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def shapes(scale: float) -> list[tuple[int, ...]]:
    from gpu_peers import resnet50_shapes

    if scale >= 1:
        return resnet50_shapes()
    return [(max(1, int(s[0] * scale)), *s[1:]) for s in resnet50_shapes()]


def rank_main(args: argparse.Namespace) -> None:
    from collectives.backends import mpi
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    comm = mpi.init(timeout=300)
    grads = [np.full(s, 0.5, np.float32) for s in shapes(args.scale)]
    n = comm.size
    buckets = comm.buckets(grads[::-1])

    def per_tensor() -> None:
        for t in grads:
            world.Allreduce(MPI.IN_PLACE, t)

    def flattened() -> None:
        flat = np.concatenate([t.reshape(-1) for t in grads])
        world.Allreduce(MPI.IN_PLACE, flat)
        offset = 0
        for t in grads:
            t.reshape(-1)[...] = flat[offset:offset + t.size]
            offset += t.size

    def bucketed() -> list:
        for k, g in enumerate(reversed(grads)):
            buckets.ready(k, g)
        return buckets.wait()

    methods = {
        "library batch_all_reduce (fused, defaults)": lambda: comm.batch_all_reduce(grads),
        "library batch_all_reduce (bucket_bytes=0)":
            lambda: comm.batch_all_reduce(grads, bucket_bytes=0),
        "library buckets (ready one by one)": bucketed,
        "mpi4py per tensor": per_tensor,
        "mpi4py flattened": flattened,
    }
    for got in (comm.batch_all_reduce(grads), comm.batch_all_reduce(grads, bucket_bytes=0),
                bucketed()):
        assert all(float(r.reshape(-1)[-1]) == 0.5 * n for r in got)
    times: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]
        for name in order:
            for t in grads:  # (the mpi4py ways work in place)
                t[...] = 0.5
            world.Barrier()
            start = time.perf_counter()
            methods[name]()
            took = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
            times[name].append(took)
    if comm.rank == 0:
        medians = {name: statistics.median(ts) for name, ts in times.items()}
        best = min(medians["mpi4py per tensor"], medians["mpi4py flattened"])
        rows = [{"method": name, "ms": m * 1e3, "ratio_to_best_mpi4py": m / best}
                for name, m in medians.items()]
        total = sum(int(np.prod(s)) for s in shapes(args.scale))
        print(f"# {len(grads)} tensors, {total:,} float32 ({total * 4 / 2**20:.1f} MiB), "
              f"{n} ranks, {args.repeats} repeats: median ms per step")
        for row in rows:
            print(f"{row['method']:<44} {row['ms']:>9.2f} ms  {row['ratio_to_best_mpi4py']:>5.2f}x")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": n, "tensors": len(grads), "floats": total,
                           "repeats": args.repeats, "scale": args.scale, "rows": rows}, f,
                          indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", "--ranks", type=int, default=2)
    parser.add_argument("-r", "--repeats", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="shrink every tensor's first dimension by this factor")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args)
        return
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    command = [mpiexec, "-n", str(args.ranks), sys.executable, os.path.abspath(__file__),
               "--rank", "-r", str(args.repeats), "--scale", str(args.scale)]
    if args.json:
        command += ["--json", os.path.abspath(args.json)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    sys.exit(subprocess.run(command, env=env).returncode)


if __name__ == "__main__":
    main()
