"""Where the host time of the library's GPU calls goes (``gpu_run.sh``'s ``profile`` part).

Prints, for this machine:

* the unit costs of the CuPy (and PyTorch) operations the library's calls are made of, in µs
  of host time per operation (median of 5 runs of a loop);
* for each call the peer benchmark compares (``gpu_peers.py``: one 4 KiB all-reduce in
  place, blocking and asynchronous, the NCCL gradient list, the multi-device gradient list,
  one multi-device all-reduce of 4 KiB), its host time per call
  and a profile of it (``cProfile``, by own time and by cumulative time).

Host time is what these calls are short of: on one GPU at these sizes the device is idle most
of the step. Numbers under the NumPy stand-in (``--quick`` runs) mean nothing.

    python benchmarks/gpu_profile.py [--quick]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import statistics
import time
from collections.abc import Callable

from gpu_peers import library, resnet50_shapes, torch_dist


def per_op_us(function: Callable[[], object], loops: int) -> float:
    """Median host µs per call of ``function`` over 5 loops of ``loops`` calls."""
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(loops):
            function()
        runs.append((time.perf_counter() - start) / loops * 1e6)
    return statistics.median(runs)


def unit_costs(loops: int) -> None:
    import cupy

    x = cupy.zeros(1024, cupy.float32)
    ys = [cupy.zeros(1024, cupy.float32) for _ in range(8)]
    base = x.data
    two_in = cupy.ElementwiseKernel("T a, T b", "T d", "d = a + b", "profile_add2")
    four_four = cupy.ElementwiseKernel("T a, T b, T c, T e", "T w, T v, T y, T z",
                                       "T s = a + b + c + e; w = s; v = s; y = s; z = s",
                                       "profile_fused4")
    runtime = cupy.cuda.runtime
    stream = cupy.cuda.get_current_stream()

    def enter_device():
        with cupy.cuda.Device(0):
            pass

    costs = {
        "cupy.empty(1024)": lambda: cupy.empty(1024, cupy.float32),
        "ndarray((32, 32), memptr=base + offset)":
            lambda: cupy.ndarray((32, 32), cupy.float32, memptr=base + 64),
        "x.reshape(32, 32)": lambda: x.reshape(32, 32),
        "x[64:128]": lambda: x[64:128],
        "x.data.ptr": lambda: x.data.ptr,
        "with cupy.cuda.Device(0)": enter_device,
        "get_current_stream()": cupy.cuda.get_current_stream,
        "kernel 2 in, 1 out": lambda: two_in(ys[0], ys[1], ys[2]),
        "kernel 4 in, 4 out": lambda: four_four(*ys),
        "x + y (ufunc, new array)": lambda: ys[0] + ys[1],
        "memcpyAsync 4 KiB": lambda: runtime.memcpyAsync(ys[0].data.ptr, ys[1].data.ptr, 4096,
                                                         runtime.memcpyDeviceToDevice,
                                                         stream.ptr),
        "x.copy()": lambda: x.copy(),
    }
    if hasattr(cupy, "RawKernel"):
        import numpy as np
        table = np.zeros(323, np.uint64)
        costs["cupy.asarray(host table of 323 words)"] = lambda: cupy.asarray(table)
    peers, _ = torch_dist()
    if peers is not None:
        torch = peers[0]
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
        grads = [torch.zeros(s, device="cuda:0") for s in resnet50_shapes()]
        flat = _flatten_dense_tensors(grads)
        costs["torch _flatten_dense_tensors(161)"] = lambda: _flatten_dense_tensors(grads)
        costs["torch _unflatten_dense_tensors(161)"] = lambda: _unflatten_dense_tensors(flat,
                                                                                        grads)
        costs["torch dist.all_reduce(flat)"] = lambda: peers[1].all_reduce(flat)
    for name, function in costs.items():
        try:
            function()
        except Exception as exc:  # noqa: BLE001 - a stand-in lacks some: say so, go on
            print(f"  {'n/a':>9}     {name} ({type(exc).__name__}: {exc})", flush=True)
            continue
        cupy.cuda.Device().synchronize()
        print(f"  {per_op_us(function, loops):9.2f} µs  {name}", flush=True)
        cupy.cuda.Device().synchronize()


def profile(name: str, function: Callable[[], object], loops: int) -> None:
    import cupy

    for _ in range(3):
        function()
    cupy.cuda.Device().synchronize()
    host = per_op_us(function, loops)
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(loops):
        function()
    cupy.cuda.Device().synchronize()
    synced = (time.perf_counter() - start) / loops * 1e6
    print(f"\n=== {name}: {host:.1f} µs of host time per call ({synced:.1f} µs with the "
          "device's work)", flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(loops):
        function()
    profiler.disable()
    cupy.cuda.Device().synchronize()
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats(order).print_stats(28)
        lines = [line for line in text.getvalue().splitlines() if line.strip()]
        start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
        print(f"--- by {order} (µs per call of {name}: divide by {loops})")
        print("\n".join(line.replace("/collectives/", "/c/") for line in lines[start:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few loops (a dry run)")
    args = parser.parse_args()
    loops = 20 if args.quick else 200
    import cupy

    import collectives

    print("unit costs (host µs per operation):", flush=True)
    unit_costs(loops * 5)
    shapes = resnet50_shapes()
    if args.quick:
        shapes = [tuple(min(d, 4) for d in s) for s in shapes]
    comm = library()
    # one small call in place, blocking and asynchronous: the per-call rows' overhead
    y = cupy.ones(1024, cupy.float32)
    profile("NCCL all_reduce, 4 KiB CuPy, in place", lambda: comm.all_reduce(y, out=y), loops)
    profile("NCCL all_reduce, 4 KiB CuPy, in place, async + wait()",
            lambda: comm.all_reduce(y, out=y, async_op=True).wait(), loops)
    peers, _ = torch_dist()
    if peers is not None:
        t = peers[0].ones(1024, device="cuda:0")
        profile("NCCL all_reduce, 4 KiB torch, in place, async + wait()",
                lambda: comm.all_reduce(t, out=t, async_op=True).wait(), loops)
    grads = [cupy.full(s, 0.5, cupy.float32) for s in shapes]
    profile("NCCL batch_all_reduce, 161 CuPy gradients",
            lambda: comm.batch_all_reduce(grads), loops // 4)
    if peers is not None:
        torch = peers[0]
        tgrads = [torch.full(s, 0.5, device="cuda:0") for s in shapes]
        profile("NCCL batch_all_reduce, 161 torch gradients",
                lambda: comm.batch_all_reduce(tgrads), loops // 4)
    counts = [math.prod(s) for s in shapes]
    flats = [cupy.full(sum(counts), 0.25 * (d + 1), cupy.float32) for d in range(4)]
    offsets = [sum(counts[:i]) for i in range(len(counts))]
    value_lists = [[b[o:o + c].reshape(s) for b in flats]
                   for o, c, s in zip(offsets, counts, shapes)]
    profile("multi-device batch_all_reduce, 4 x 161 arrays on one GPU",
            lambda: collectives.batch_all_reduce(value_lists), loops // 4)
    xs = [cupy.full(1024, 0.25 * (d + 1), cupy.float32) for d in range(4)]
    profile("multi-device all_reduce, 4 x 4 KiB on one GPU, auto",
            lambda: collectives.all_reduce(xs, "sum", "auto"), loops)

    def naive():
        total = xs[0] + xs[1] + xs[2] + xs[3]
        return [total.copy() for _ in range(4)]

    profile("naive CuPy sum of 4 x 4 KiB and 4 copies", naive, loops)


if __name__ == "__main__":
    main()
