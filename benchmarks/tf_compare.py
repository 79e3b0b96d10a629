"""The TensorFlow adapter next to TensorFlow's own cross-device ops, under MirroredStrategy.

Times ``strategy.extended.batch_reduce_to(SUM, [(v, v) for v in values])`` - the call Keras'
gradient all-reduce ends in - on ``p`` logical CPU devices of one process, for two workloads:

* ``resnet50``: the 161 float32 gradients of ResNet-50 v1 (conv kernels without biases, batch
  norm gamma/beta, the classifier): 25.6 M values, 97.5 MiB per device;
* ``64MiB``: one float32 tensor of 16 M values.

Each is timed eagerly and inside ``tf.function``, for TensorFlow's ``ReductionToOneDevice``
and ``HierarchicalCopyAllReduce`` and for this adapter's classes and algorithms. Every result
is checked against a float64 NumPy reference before timing. Rows print as they finish; the
markdown table at the end gives medians and the ratio to TensorFlow's fastest built-in
(``tf/fastest``: below 1 is faster than TensorFlow).

    TF_CPP_MIN_LOG_LEVEL=2 python benchmarks/tf_compare.py [-p 4] [-r 7] [--json out.json]
        [--workloads resnet50,64MiB] [--modes eager,function] [--methods tf_rtod,ring,...]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf_anchor import per_replica, setup_devices  # noqa: E402

from collectives.tools import bench  # noqa: E402


def resnet50_shapes() -> list[tuple[int, ...]]:
    """Trainable variable shapes of ResNet-50 v1 as tf_cnn_benchmarks builds it (161 tensors)."""
    shapes: list[tuple[int, ...]] = []

    def conv_bn(k: int, cin: int, cout: int) -> None:
        shapes.extend([(k, k, cin, cout), (cout,), (cout,)])

    conv_bn(7, 3, 64)
    cin = 64
    for mid, out, blocks in ((64, 256, 3), (128, 512, 4), (256, 1024, 6), (512, 2048, 3)):
        for b in range(blocks):
            if b == 0:
                conv_bn(1, cin, out)  # projection shortcut
            conv_bn(1, cin, mid)
            conv_bn(3, mid, mid)
            conv_bn(1, mid, out)
            cin = out
    shapes.extend([(2048, 1000), (1000,)])
    return shapes


WORKLOADS = {"resnet50": resnet50_shapes, "64MiB": lambda: [(16 << 20,)]}
ALGORITHMS = ("one_device", "tree", "ring", "rechd", "shuffle", "auto")


def methods(tf, ctf) -> dict:
    """Name -> constructor of the cross-device ops to compare."""
    out = {
        "tf_rtod": tf.distribute.ReductionToOneDevice,
        "tf_hcar": tf.distribute.HierarchicalCopyAllReduce,
        "ReductionToOneDevice": ctf.ReductionToOneDevice,
        "NcclAllReduce": ctf.NcclAllReduce,
        "HierarchicalCopyAllReduce": ctf.HierarchicalCopyAllReduce,
        "HierarchicalCopyAllReduce(num_packs=0)": lambda: ctf.HierarchicalCopyAllReduce(num_packs=0),
        "MultiWorkerAllReduce": ctf.MultiWorkerAllReduce,
    }
    for alg in ALGORITHMS:
        out[alg] = (lambda a=alg: ctf.CrossDeviceOps(a))
    out["ring, num_packs=1"] = lambda: ctf.CrossDeviceOps("ring", num_packs=1)
    return out


def make_values(devices, shapes, seed: int = 0):
    """Per-replica float32 values, component r on device r with its own data, and their
    float64 sums. (``experimental_distribute_values_from_function`` with ``tf.constant`` would
    leave every component on the first device in eager mode.)"""
    rng = np.random.default_rng(seed)
    p = len(devices)
    host = [[rng.standard_normal(s).astype(np.float32) for _ in range(p)] for s in shapes]
    values = [per_replica(h, devices) for h in host]
    expected = [np.sum([a.astype(np.float64) for a in h], axis=0) for h in host]
    return values, expected


def check(results, expected, p: int) -> int:
    """Number of wrong outputs (one per tensor and device) against the float64 reference."""
    wrong = 0
    for res, exp in zip(results, expected):
        outs = res.values if hasattr(res, "values") else (res,)
        if len(outs) != p:
            wrong += p
        tol = 1e-5 * (np.abs(exp).max() + 1) * p
        wrong += sum(not np.allclose(o.numpy(), exp, rtol=0, atol=tol) for o in outs)
    return wrong


def run(p: int, repeats: int, warmup: int, workloads, modes, names, on_row=None) -> list[dict]:
    """Every (workload, mode, method) row. Repeats go round-robin over the methods, so the
    load of a shared machine spreads over all of them alike."""
    import tensorflow as tf
    from collectives.adapters import tensorflow as ctf

    devices = setup_devices(p)
    table = methods(tf, ctf)
    SUM = tf.distribute.ReduceOp.SUM
    rows = []
    for workload in workloads:
        shapes = WORKLOADS[workload]()
        nbytes = sum(int(np.prod(s)) for s in shapes) * 4
        # One set of per-replica values serves every strategy (they hold no strategy).
        values, expected = make_values(devices, shapes)
        calls = {}
        for name in names:
            strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=table[name]())

            def eager(strategy=strategy, values=values):
                return strategy.extended.batch_reduce_to(SUM, [(v, v) for v in values])

            @tf.function
            def graph(values, strategy=strategy):
                results = strategy.extended.batch_reduce_to(SUM, [(v, v) for v in values])
                return [list(r.values) for r in results]

            def function(graph=graph, values=values):
                return [_Mirror(r) for r in graph(values)]

            for mode in modes:
                calls[(name, mode)] = eager if mode == "eager" else function
        wrong = {}
        for key, call in calls.items():
            wrong[key] = check(call(), expected, p)
            for _ in range(warmup - 1):
                call()
        times: dict = {key: [] for key in calls}
        for _ in range(repeats):
            for key, call in calls.items():
                start = time.perf_counter()
                call()
                times[key].append(time.perf_counter() - start)
        for (name, mode), samples in times.items():
            row = {"workload": workload, "mode": mode, "method": name, "p": p,
                   "tensors": len(shapes), "bytes": nbytes, "median_s": statistics.median(samples),
                   "min_s": min(samples), "max_s": max(samples), "wrong": wrong[(name, mode)]}
            rows.append(row)
            if on_row:
                on_row(row)
        del values, calls
    return rows


class _Mirror:
    """The per-device outputs of a tf.function, shaped like a Mirrored for ``check``."""

    def __init__(self, outs):
        self.values = outs


def markdown(rows: list[dict]) -> str:
    """One table per workload: median ms per mode and the ratio to TF's fastest built-in."""
    lines = []
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    for workload in dict.fromkeys(r["workload"] for r in rows):
        part = [r for r in rows if r["workload"] == workload]
        first = part[0]
        lines.append(f"\n**{workload}** ({first['tensors']} float32 tensors, "
                     f"{first['bytes'] / 2**20:.1f} MiB per device, p={first['p']})\n")
        head = "| method | " + " | ".join(f"{m} ms | {m} / tf fastest" for m in modes) + " |"
        lines += [head, "|---" * (1 + 2 * len(modes)) + "|"]
        fastest = {m: min((r["median_s"] for r in part if r["mode"] == m and
                           r["method"].startswith("tf_")), default=float("nan")) for m in modes}
        for method in dict.fromkeys(r["method"] for r in part):
            cells = []
            for m in modes:
                row = next((r for r in part if r["method"] == method and r["mode"] == m), None)
                if row is None:
                    cells += ["", ""]
                    continue
                flag = " (WRONG)" if row["wrong"] else ""
                cells += [f"{row['median_s'] * 1e3:.1f}{flag}", f"{row['median_s'] / fastest[m]:.2f}"]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--participants", type=int, default=4)
    parser.add_argument("-r", "--repeats", type=int, default=7)
    parser.add_argument("-w", "--warmup", type=int, default=2)
    parser.add_argument("--workloads", default="resnet50,64MiB")
    parser.add_argument("--modes", default="eager,function")
    parser.add_argument("--methods", default=None, help="comma-separated subset (default: all)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "benchmarks/tf_compare.py", *(sys.argv[1:] if argv is None else argv)])
    import tensorflow as tf
    from collectives.adapters import tensorflow as ctf

    names = args.methods.split(",") if args.methods else list(methods(tf, ctf))
    machine = bench.machine_info()
    print(f"# {command}\n# TensorFlow {tf.__version__} on {machine['node']} "
          f"({machine['cpu_count']} CPUs), {args.participants} logical CPU devices; "
          f"median of {args.repeats}", flush=True)
    started = time.time()
    rows = run(args.participants, args.repeats, args.warmup, args.workloads.split(","),
               args.modes.split(","), names,
               on_row=lambda r: print(f"{r['workload']:>9} {r['mode']:>8} {r['method']:<40} "
                                      f"{r['median_s'] * 1e3:9.2f} ms"
                                      f"{'  WRONG' if r['wrong'] else ''}", flush=True))
    print(markdown(rows))
    print(f"\n# {time.time() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "machine": machine, "tensorflow": tf.__version__,
                       "rows": rows}, f, indent=1)
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
