"""The error of wire compression: ``compression="fp16"|"bf16"`` against the uncompressed result.

For p participants each holding N random normal values (float32 or float64, N(0, 1), a new
seed per participant), the all-reduce with ``compression=`` is compared with the same
algorithm's uncompressed all-reduce (``collectives.all_reduce`` over p logical devices: the
same plans the SPMD ranks run), for SUM and MEAN. Two numbers per cell:

* max relative error: ``max_i |c_i - u_i| / max_i |u_i|`` (the largest error, relative to the
  largest value: what a gradient step sees);
* median elementwise relative error: ``median_i |c_i - u_i| / |u_i|``.

For reference, the unit roundoff is 2^-11 = 4.9e-4 for float16 and 2^-8 = 3.9e-3 for
bfloat16: each input is rounded once and each of the p - 1 additions once more.

    python benchmarks/compression_error.py [-n 1M] [-p 2 4 8 16 64] [--algorithm ring]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

import collectives
from collectives.tools import bench


def errors(compressed: np.ndarray, plain: np.ndarray) -> tuple[float, float]:
    """(max relative error, median elementwise relative error) of ``compressed``."""
    c, u = compressed.astype(np.float64), plain.astype(np.float64)
    diff = np.abs(c - u)
    nonzero = u != 0
    return (float(diff.max() / np.abs(u).max()),
            float(statistics.median((diff[nonzero] / np.abs(u[nonzero])).tolist())))


def measure(n: int, participants: list[int], algorithm: str) -> list[dict]:
    rows = []
    for dtype in (np.float32, np.float64):
        for p in participants:
            values = [np.random.default_rng(seed).standard_normal(n).astype(dtype)
                      for seed in range(p)]
            for op in ("sum", "mean"):
                plain = collectives.all_reduce(values, op, algorithm, shared_result=True)[0]
                row = {"dtype": np.dtype(dtype).name, "p": p, "op": op}
                for compression in ("fp16", "bf16"):
                    got = collectives.all_reduce(values, op, algorithm, shared_result=True,
                                                 compression=compression)[0]
                    row[compression] = errors(got, plain)
                rows.append(row)
                print(f"# {row['dtype']} p={p} {op}: fp16 {row['fp16'][0]:.2e}, "
                      f"bf16 {row['bf16'][0]:.2e}", file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict], n: int, algorithm: str) -> str:
    lines = [f"N = {n} random normal values per participant, algorithm {algorithm!r}; max "
             "relative error (median elementwise relative error):", "",
             "| input | participants | op | fp16 | bf16 |", "|---|---:|---|---:|---:|"]
    for r in rows:
        cells = [f"{r[c][0]:.2e} ({r[c][1]:.1e})" for c in ("fp16", "bf16")]
        lines.append(f"| {r['dtype']} | {r['p']} | {r['op']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--count", type=bench.parse_size, default="1M",
                        help="values per participant (K, M suffixes)")
    parser.add_argument("-p", "--participants", type=int, nargs="+", default=[2, 4, 8, 16, 64])
    parser.add_argument("--algorithm", default="ring")
    args = parser.parse_args(argv)
    print(markdown(measure(args.count, args.participants, args.algorithm), args.count,
                   args.algorithm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
