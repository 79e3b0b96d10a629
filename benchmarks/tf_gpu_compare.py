"""The TensorFlow adapter on GPU tensors beside TensorFlow's own cross-device ops, same GPUs.

Each step of a ``tf.function`` makes a ResNet-50 gradient list on every replica (one tensor per
trainable variable of ``keras.applications.ResNet50``: 214 tensors, 25.6 M floats, 102 MB)
and sums it with ``replica_context.all_reduce`` through the strategy's cross-device ops: what
Keras does with gradients. Methods: TensorFlow's ``ReductionToOneDevice``,
``HierarchicalCopyAllReduce`` and ``NcclAllReduce``; the adapter's classes of the same names
(on GPU tensors they reduce with CuPy, through DLPack); and a step that makes the gradients
but reduces nothing (the floor). Every result is checked (each element must equal
k (k + 1) / 2) before timing.

Devices: every GPU where there are two or more (``--devices physical``), else GPU 0 split into
two logical GPUs (``--devices logical``; NCCL cannot run two ranks on one GPU, so
``NcclAllReduce`` reports why it cannot there, TensorFlow's as an error, the adapter's as its
fallback to one device). Each method runs in a process of its own, with a time limit. Prints a
table and writes ``tf_gpu_compare.json`` into ``--out``; without a GPU it says why and exits 0.

    python benchmarks/tf_gpu_compare.py --out gpu-results
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

METHODS = ["floor (no reduction)", "tf ReductionToOneDevice", "tf HierarchicalCopyAllReduce",
           "tf NcclAllReduce", "collectives ReductionToOneDevice",
           "collectives HierarchicalCopyAllReduce", "collectives NcclAllReduce"]
MEMORY_MB = 8192  # per logical GPU; CuPy's pool uses the rest of the card


def configure(mode: str) -> list[str]:
    """TensorFlow's GPUs for ``mode`` (before anything initialises them)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if mode == "logical":
        tf.config.set_visible_devices(gpus[0], "GPU")
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=MEMORY_MB)] * 2)
    else:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
    return [d.name for d in tf.config.list_logical_devices("GPU")]


def probe() -> dict:
    """What this machine offers (run in a child, so the parent never initialises a GPU)."""
    import tensorflow as tf

    info = {"tensorflow": tf.__version__, "gpus": len(tf.config.list_physical_devices("GPU"))}
    try:
        import cupy

        info["cupy"] = cupy.__version__
        info["cupy_gpu"] = bool(cupy.cuda.is_available())
        if info["cupy_gpu"]:
            props = cupy.cuda.runtime.getDeviceProperties(0)
            info["gpu_name"] = props["name"].decode()
        from collectives.backends.cupy import nccl_version

        info["nccl"] = nccl_version()
    except ImportError as exc:
        info["cupy"] = f"not importable: {exc}"
        info["cupy_gpu"] = False
    return info


def make_ops(method: str):
    import tensorflow as tf
    from collectives.adapters import tensorflow as ctf

    if method.startswith("floor"):
        return None
    library, name = method.split(" ", 1)
    return getattr(tf.distribute if library == "tf" else ctf, name)()


def measure(method: str, mode: str, steps: int, repeats: int) -> dict:
    """One method, in this process: check, then time ``repeats`` x ``steps`` steps."""
    devices = configure(mode)
    import keras
    import tensorflow as tf

    with tf.device("/cpu:0"):
        shapes = [tuple(v.shape) for v in keras.applications.ResNet50(weights=None).trainable_variables]
    ops = make_ops(method)
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    k = len(devices)

    @tf.function
    def step(scale):
        def fn():
            ctx = tf.distribute.get_replica_context()
            value = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32) * scale
            grads = [tf.fill(s, value) for s in shapes]
            return grads if ops is None else ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        return strategy.run(fn)

    out = [strategy.experimental_local_results(r) for r in step(tf.constant(1.0))]
    if ops is None:  # replica 0's own gradients: ones
        want, parts = 1.0, [replicas[0] for replicas in out]
    else:  # every replica's result: 1 + ... + k
        want, parts = k * (k + 1) / 2, [p for replicas in out for p in replicas]
    correct = len(out) == len(shapes) and all(
        float(tf.reduce_min(p)) == want == float(tf.reduce_max(p)) for p in parts)
    scale = tf.constant(1.0)
    for _ in range(3):
        step(scale)
    tf.test.experimental.sync_devices()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step(scale)
        tf.test.experimental.sync_devices()
        times.append((time.perf_counter() - start) / steps)
    nbytes = sum(4 * int(_prod(s)) for s in shapes)
    return {"method": method, "devices": devices, "tensors": len(shapes), "bytes": nbytes,
            "correct": correct, "median_ms": 1e3 * statistics.median(times),
            "min_ms": 1e3 * min(times), "max_ms": 1e3 * max(times),
            "traces": step.experimental_get_tracing_count()}


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def child(args: list[str], timeout: float) -> dict:
    """Run this script with ``args`` in a fresh process; its last JSON line, or why none."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    try:
        proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


HEADER = (f"{'method':<40} {'ms/step':>9} {'min':>8} {'max':>8} {'GB/s':>6}  result\n"
          f"{'':<40} {'(median)':>9} {'':>8} {'':>8} {'(*)':>6}")


def row_line(r: dict, floor: float) -> str:
    """One table row; (*) GB/s: the gradients' bytes over the time a step takes beyond the
    floor (the same step without the reduction)."""
    if "median_ms" not in r:
        return f"{r['method']:<40} {'-':>9} {'-':>8} {'-':>8} {'-':>6}  {r['error']}"
    extra = r["median_ms"] - floor
    rate = f"{r['bytes'] / (extra * 1e6):6.1f}" if floor and extra > 0 else f"{'-':>6}"
    return (f"{r['method']:<40} {r['median_ms']:>9.2f} {r['min_ms']:>8.2f} {r['max_ms']:>8.2f} "
            f"{rate}  {'ok' if r['correct'] else 'WRONG RESULT'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-results")
    parser.add_argument("--devices", choices=["auto", "logical", "physical"], default="auto")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe()))
        return
    if args.method:
        print(json.dumps(measure(args.method, args.devices, args.steps, args.repeats)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = child(["--probe"], 120)
    reason = info.get("error") or (None if info.get("gpus") else
                                   f"TensorFlow {info.get('tensorflow')} sees no GPU (a CPU-only "
                                   "build or no driver: pip install 'tensorflow[and-cuda]')")
    reason = reason or (None if info.get("cupy_gpu") else f"CuPy sees no GPU ({info.get('cupy')})")
    if reason:
        print(f"SKIPPED: {reason}")
        (out / "tf_gpu_compare.json").write_text(json.dumps({"skipped": reason, "machine": info},
                                                            indent=1))
        return
    mode = args.devices if args.devices != "auto" else ("physical" if info["gpus"] >= 2 else "logical")
    print(f"# {info.get('gpu_name')} x{info['gpus']}, devices: {mode}; TensorFlow "
          f"{info['tensorflow']}, CuPy {info['cupy']}, NCCL {info.get('nccl')}", flush=True)
    print(HEADER, flush=True)
    rows, floor = [], 0.0
    for method in METHODS:
        row = child(["--method", method, "--devices", mode, "--steps", str(args.steps),
                     "--repeats", str(args.repeats)], args.timeout)
        rows.append({"method": method, **row})
        if method.startswith("floor"):
            floor = row.get("median_ms", 0.0)
        print(row_line(rows[-1], floor), flush=True)
    (out / "tf_gpu_compare.json").write_text(json.dumps(
        {"machine": info, "devices": mode, "steps": args.steps, "repeats": args.repeats,
         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
