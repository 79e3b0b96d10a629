"""The TensorFlow adapter with and without the compiled combine kernels, beside TensorFlow, in one process.

``tf_compare.py`` times each method in its own turn of a round-robin; on a busy machine the
load moves between turns. Here the comparison that matters is made in one process and one
rotation: TensorFlow's ``ReductionToOneDevice`` and the adapter's ``CrossDeviceOps("auto")``,
the latter with the compiled one-pass kernels (``collectives.kernels``, the default) and with
NumPy's binary ufuncs (the kernels switched off: what the library falls back to without a C
compiler), eagerly and inside ``tf.function``, each call once per repeat in an order rotated
from repeat to repeat. Cells: median ms per call and ratios.

    TF_CPP_MIN_LOG_LEVEL=2 python benchmarks/tf_kernels.py [-p 4] [-r 15] [--workload 64MiB]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tf_anchor import setup_devices  # noqa: E402
from tf_compare import WORKLOADS, make_values  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--participants", type=int, default=4)
    parser.add_argument("-r", "--repeats", type=int, default=15)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="64MiB")
    args = parser.parse_args(argv)
    import tensorflow as tf
    from collectives.adapters import tensorflow as ctf

    from collectives import kernels

    devices = setup_devices(args.participants)
    values, _ = make_values(devices, WORKLOADS[args.workload]())
    pairs = [(v, v) for v in values]
    SUM = tf.distribute.ReduceOp.SUM
    theirs = tf.distribute.MirroredStrategy(devices,
                                            cross_device_ops=tf.distribute.ReductionToOneDevice())
    ours = tf.distribute.MirroredStrategy(devices, cross_device_ops=ctf.CrossDeviceOps("auto"))
    compiled = kernels._compiled

    def graph(strategy):
        @tf.function
        def step(values):
            results = strategy.extended.batch_reduce_to(SUM, [(v, v) for v in values])
            return [list(r.values) for r in results]
        return step

    def with_kernels(on: bool, call):
        def run():
            kernels._compiled = compiled if on else None
            try:
                return call()
            finally:
                kernels._compiled = compiled
        return run

    steps = {id(theirs): graph(theirs), id(ours): graph(ours)}

    def eager(strategy):
        return lambda: strategy.extended.batch_reduce_to(SUM, pairs)

    def function(strategy):
        step = steps[id(strategy)]
        return lambda: step(values)

    calls = {}
    for mode, make in (("eager", eager), ("function", function)):
        calls[f"TF {mode}"] = make(theirs)
        calls[f"kernels {mode}"] = with_kernels(True, make(ours))
        calls[f"NumPy ufuncs {mode}"] = with_kernels(False, make(ours))
    for call in calls.values():
        call()
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for rep in range(args.repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    if compiled is None:
        print("# the compiled kernels are not built here: both rows are NumPy's")
    print(f"# {args.workload}, {args.participants} logical CPU devices, median of {args.repeats}, "
          f"load average {os.getloadavg()[0]:.1f} after\n")
    print("| mode | TF `ReductionToOneDevice` ms | `auto`, kernels ms | `auto`, NumPy ufuncs ms | "
          "kernels / TF | NumPy / TF | kernels / NumPy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode in ("eager", "function"):
        t, k, n = med[f"TF {mode}"], med[f"kernels {mode}"], med[f"NumPy ufuncs {mode}"]
        print(f"| {mode} | {t:.1f} | {k:.1f} | {n:.1f} | {k / t:.2f} | {n / t:.2f} | {k / n:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
