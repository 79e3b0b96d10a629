"""TensorFlow's own cross-device all-reduce on logical CPU devices: the anchor to compare with.

Times ``tf.distribute.ReductionToOneDevice().reduce(SUM, per_replica, destinations=per_replica)``
("tf_r2od": add_n on the first device, then a copy to every device) and the same through
``batch_reduce`` with one (value, destinations) pair ("tf_r2od_batch"), eagerly, on p logical
CPU devices of one physical CPU, for float32 sizes 4 KiB..64 MiB per device. Rows, medians
and JSON are those of ``collectives bench`` (busbw factor 2(n-1)/n, #wrong against the same
exact reference), so the numbers line up with ``collectives bench -c all_reduce``.

A third row, "tf_add_n", times the reduction step alone (``tf.add_n`` of the p tensors on the
first device, checked on that device only): the difference to "tf_r2od" is what TF's
broadcast to the other devices costs. Between logical CPU devices of one process that
broadcast may hand over the same buffer instead of copying it, so TF's all-reduce can move
less memory than one that writes p separate outputs.

    TF_CPP_MIN_LOG_LEVEL=2 python benchmarks/tf_anchor.py [-p 4] [-b 4K] [-e 64M] [--json tf.json]

Needs tensorflow (``pip install tensorflow-cpu``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from collectives.tools import bench  # noqa: E402

METHODS = ("tf_r2od", "tf_r2od_batch", "tf_add_n")


def setup_devices(p: int) -> list[str]:
    """Split the CPU into ``p`` logical devices (must run before TensorFlow initializes)."""
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * p)
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def per_replica(arrays: list[np.ndarray], devices: list[str]):
    """A PerReplica holding ``arrays[i]`` as a tensor on ``devices[i]``."""
    import tensorflow as tf
    from tensorflow.python.distribute.values import PerReplica

    tensors = []
    for a, d in zip(arrays, devices):
        with tf.device(d):
            tensors.append(tf.identity(tf.constant(a)))
    return PerReplica(tuple(tensors))


def calls(value) -> dict:
    """The timed calls, each returning its results (one tensor per device it fills)."""
    import tensorflow as tf

    ops = tf.distribute.ReductionToOneDevice()
    SUM = tf.distribute.ReduceOp.SUM

    def reduce():
        return list(ops.reduce(SUM, value, destinations=value).values)

    def batch():
        return list(ops.batch_reduce(SUM, [(value, value)])[0].values)

    first = value.values[0].device

    def add_n():
        with tf.device(first):
            return [tf.add_n(list(value.values))]

    return {"tf_r2od": reduce, "tf_r2od_batch": batch, "tf_add_n": add_n}


def run(p: int, lo: int, hi: int, repeats: int, warmup: int = 2, on_row=None) -> list[dict]:
    """Every (size, method) row, measured as ``collectives bench`` does."""
    devices = setup_devices(p)
    config = bench.BenchConfig(collective="all_reduce", algorithms=METHODS, participants=p,
                               minbytes=lo, maxbytes=hi, warmup=warmup, repeats=repeats)
    rows = []
    for case in bench.sweep(config):
        value = per_replica(case.inputs(), devices)
        expected = bench.expected_outputs(case)
        for name, call in calls(value).items():
            last: list = []

            def timed(call=call, last=last):
                last[:] = call()

            m = bench.measure(timed, warmup=warmup, repeats=repeats)
            wrong = bench.count_wrong([t.numpy() for t in last], expected[:len(last)])
            row = bench.make_row(config, case, name, name, m, wrong)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the table; ``--json`` writes rows plus metadata. Exit 1 if TF was ever wrong."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--participants", type=int, default=4)
    parser.add_argument("-b", "--minbytes", type=bench.parse_size, default="4K")
    parser.add_argument("-e", "--maxbytes", type=bench.parse_size, default="64M")
    parser.add_argument("-w", "--warmup", type=int, default=2)
    parser.add_argument("-r", "--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "benchmarks/tf_anchor.py", *(sys.argv[1:] if argv is None else argv)])
    import tensorflow as tf

    machine = bench.machine_info()
    print(f"# {command}\n# TensorFlow {tf.__version__} on {machine['node']} "
          f"({machine['cpu_count']} CPUs), {args.participants} logical CPU devices, eager")
    print(bench.TITLE)
    print(bench.HEADER, flush=True)
    rows = run(args.participants, args.minbytes, args.maxbytes, args.repeats, args.warmup,
               on_row=lambda r: print(bench.format_row(r), flush=True))
    if args.json:
        meta = bench.metadata(command)
        meta["tensorflow"] = tf.__version__
        bench.write_json(args.json, rows, meta)
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
