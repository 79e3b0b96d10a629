"""Multi-device calls over 4 logical devices on one GPU, beside bare CuPy doing the same work
(``gpu_peers.py`` runs it as the ``multi-device`` part).

* per call, at every size from 4 KiB to 256 MiB: ``auto`` beside every algorithm
  (``one_device``, ``ring``, ``rechd``, ``tree``, ``shuffle``), beside the naive CuPy sum
  (``x0+x1+x2+x3``, then a copy to each device) and beside the fastest of those
  (``best_choice``, the lowest median, repeat by repeat: the target is ``auto`` within 10 %
  of it); ``auto`` into ``out=`` beside
  one fused kernel that reads the 4 inputs and writes the 4 given outputs (the bound: 8 units
  of traffic, no allocation on either side);
* the gradient list (ResNet-50's shapes, 4 arrays per tensor, each device's tensors views of
  one buffer): ``collectives.batch_all_reduce`` beside the naive loop, a loop of the fused
  kernel per tensor, and one fused kernel over each device's whole buffer
  (``library_batch_kept`` holds each step's results for two steps more, so no bucket is
  reused: see ``gpu_peers_grads.py``).
"""

from __future__ import annotations

import math
from pathlib import Path

from gpu_compare import Record, _device_fence
from gpu_peers import measure, resnet50_shapes
from gpu_stats import with_best

ALGORITHMS = ("one_device", "ring", "rechd", "tree", "shuffle")
CHOICES = [f"library_{a}" for a in ALGORITHMS] + ["naive"]  # what auto is judged against
DEVICES = 4


def fused_kernel():
    """One kernel that reads 4 inputs and writes 4 outputs (under the NumPy stand-in for
    CuPy, which compiles no kernels: the same result by adds and copies, so that a dry run
    reaches every way and ratio)."""
    import cupy

    if str(cupy.__version__).endswith("-fake"):
        def added(a, b, c, d, *outs):
            total = a + b + c + d
            for out in outs:
                cupy.copyto(out, total)

        return added
    return cupy.ElementwiseKernel("T a, T b, T c, T d", "T w, T x, T y, T z",
                                  "T s = a + b + c + d; w = s; x = s; y = s; z = s",
                                  "gpu_peers_fused4")


def _naive(xs):
    total = xs[0] + xs[1] + xs[2] + xs[3]
    return [total.copy() for _ in range(DEVICES)]


def _per_call(record: Record, fence, args) -> None:
    import cupy

    import collectives

    fused = fused_kernel()
    for size in args.multi_sizes:
        xs = [cupy.full(size // 4, 0.25 * (d + 1), cupy.float32) for d in range(DEVICES)]
        outs = [cupy.empty_like(x) for x in xs]
        ways: dict = {f"library_{name}": (lambda name=name, xs=xs: collectives.all_reduce(xs, "sum",
                                                                                    name))
                for name in ("auto", *ALGORITHMS)}
        ways.update(naive=lambda xs=xs: _naive(xs),
                    library_auto_out=lambda xs=xs, outs=outs: collectives.all_reduce(
                        xs, "sum", out=outs),
                    fused_kernel=lambda xs=xs, outs=outs: fused(*xs, *outs))
        ratios = [("library_auto", other) for other in [*CHOICES, "best_choice"]]
        ratios.append(("library_auto_out", "fused_kernel"))
        measure(record, {"kind": "one all-reduce", "size": size}, ways, fence, args, ratios,
                derive=lambda times: with_best(times, "best_choice", CHOICES))


def _gradient_list(record: Record, fence, args) -> None:
    import cupy

    import collectives

    fused = fused_kernel()
    shapes = resnet50_shapes()[:args.tensors]
    counts = [math.prod(s) for s in shapes]
    offsets = [sum(counts[:i]) for i in range(len(counts))]
    flats = [cupy.full(sum(counts), 0.25 * (d + 1), cupy.float32) for d in range(DEVICES)]
    outs = [cupy.empty_like(f) for f in flats]

    def views(buffers):
        return [[b[o:o + c].reshape(s) for b in buffers]
                for o, c, s in zip(offsets, counts, shapes)]

    value_lists, out_lists = views(flats), views(outs)
    got = collectives.batch_all_reduce(value_lists)
    assert float(got[-1][3].ravel()[-1]) == 2.5

    def fused_per_tensor():
        for values, targets in zip(value_lists, out_lists):
            fused(*values, *targets)

    held: list = []

    def batch_kept():  # each step's results held two steps more: no bucket reused
        held[:] = [*held[-1:], collectives.batch_all_reduce(value_lists)]  # (kept: two steps')

    ways = {"library_batch": lambda: collectives.batch_all_reduce(value_lists),
            "library_batch_kept": batch_kept,
            "naive_per_tensor": lambda: [_naive(v) for v in value_lists],
            "fused_per_tensor": fused_per_tensor,
            "fused_whole_list": lambda: fused(*flats, *outs)}
    steps = type(args)(**{**vars(args), "calls": max(args.calls // 4, 1)})
    measure(record, {"kind": "gradient list", "tensors": len(shapes)}, ways, fence, steps,
            [("library_batch", "naive_per_tensor"), ("library_batch", "fused_per_tensor"),
             ("library_batch_kept", "fused_per_tensor"),
             ("library_batch", "fused_whole_list")])


def multi_device_part(out: Path, args) -> None:
    record = Record(out, "multi-device", devices=DEVICES, repeats=args.repeats,
                    tensors=min(args.tensors, len(resnet50_shapes())),
                    note="4 logical devices: 4 arrays per tensor on GPU 0")
    fence = _device_fence()
    _per_call(record, fence, args)
    _gradient_list(record, fence, args)
    fence()
