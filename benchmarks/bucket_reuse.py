"""A training step's gradient list with its buckets kept from step to step, and without.

ResNet-50's 161 gradients (PyTorch CPU tensors, 25.6 M float32; ``--library numpy``: NumPy
arrays; ``--scale``: each first dimension scaled, for a list whose host time is most of a
step) all-reduced on thread ranks,
each step in two ways of calling (``batch_all_reduce``, and ``comm.buckets`` fed in backward
order), each way twice: with each step's results dropped before the next step (the library
packs into the buckets it kept and hands back the same views: ``algorithms/reuse.py``), and
with each step's results held for two steps more (the keeper keeps two generations, the last
step's and the one before: every bucket and view new). The
ways alternate in interleaved repeats (``gpu_stats.interleaved``); each ratio has a paired
bootstrap interval. Rank 0's times are printed, and written to ``--out``.

    python benchmarks/bucket_reuse.py [-p 2] [-r 7] [--calls 3] [--bucket-mib 25]
                                      [--library torch|numpy] [--scale 1] [--out F]
"""

from __future__ import annotations

import argparse
import json
import platform

import numpy as np
from gpu_peers import resnet50_shapes
from gpu_stats import brief, interleaved, row

import collectives


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", type=int, default=2, help="thread ranks")
    parser.add_argument("-r", "--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3, help="steps per timed repeat")
    parser.add_argument("--bucket-mib", type=int, default=25)
    parser.add_argument("--tensors", type=int, default=161, help="the first N of ResNet-50's")
    parser.add_argument("--library", choices=["torch", "numpy"], default="torch")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="scale every first dimension by this (at least 1 element)")
    parser.add_argument("--out", help="JSON file for the rows")
    args = parser.parse_args()
    if args.library == "torch":
        import torch

        def full(shape, value):
            return torch.full(shape, value)
    else:
        def full(shape, value):
            return np.full(shape, value, np.float32)

    shapes = [(max(1, int(s[0] * args.scale)), *s[1:])
              for s in resnet50_shapes()[:args.tensors]]
    bucket_bytes = args.bucket_mib << 20

    def body(comm):
        grads = [full(s, float(comm.rank + 1)) for s in shapes]
        # the held ways on a communicator of their own: a communicator keeps one set of
        # buckets per list, which results held by one way would pin for the other
        other = comm.dup()
        held: dict = {}

        def batch(c):
            return lambda: c.batch_all_reduce(grads, bucket_bytes=bucket_bytes)

        def by_buckets(c):
            buckets = c.buckets(grads, bucket_bytes=bucket_bytes)

            def step():
                for k in range(len(grads) - 1, -1, -1):  # (the order backward produces them)
                    buckets.ready(k, grads[k])
                return buckets.wait()
            return step

        def dropping(step):
            return lambda: step() and None

        def holding(name, step):
            def way():
                # (the last two steps' results held: the keeper's two generations taken)
                held[name] = [*held.get(name, [])[-1:], step()]
            return way

        ways = {"batch": dropping(batch(comm)), "batch_held": holding("batch", batch(other)),
                "buckets": dropping(by_buckets(comm)),
                "buckets_held": holding("buckets", by_buckets(other))}
        times = interleaved(ways, lambda: None, args.repeats, args.calls)
        return row({"kind": "step", "ranks": args.p, "tensors": len(shapes),
                    "library": args.library, "scale": args.scale,
                    "bucket_bytes": bucket_bytes}, times,
                   [("batch", "batch_held"), ("buckets", "buckets_held")])

    result = collectives.run(body, args.p)[0]
    print(brief(result), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "benchmarks/bucket_reuse.py", "args": vars(args),
                       "numpy": np.__version__,
                       "torch": torch.__version__ if args.library == "torch" else None,
                       "machine": platform.platform(),
                       "rows": [result]}, f, indent=1)


if __name__ == "__main__":
    main()
