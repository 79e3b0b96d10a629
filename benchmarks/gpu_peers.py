"""The library beside torch.distributed on one GPU: what a training step's gradients cost.

Every number is a median over back-to-back calls in one run, the clock stopped after the
device has finished (torch.distributed: ``init_process_group("nccl")``, world size 1; the
library: a one-rank NCCL communicator, ``collectives.backends.nccl.init(MPI.COMM_SELF)``):

* ``per-call``: a blocking all-reduce of one tensor (CuPy arrays, and PyTorch CUDA tensors,
  into a new tensor and in place) beside ``dist.all_reduce``, 4 KiB to 64 MiB; an async
  issue + ``wait()``; 64 calls of 4 MiB in flight, then every ``wait()`` (in place, as
  torch.distributed's; and CuPy into new arrays);
* ``resnet50``: ResNet-50's 161 gradient tensors (their real shapes, 25.6 M float32) through
  ``comm.batch_all_reduce`` with its defaults (CuPy arrays and PyTorch tensors), beside
  torch.distributed per tensor and torch's fused way (``torch.cat``, one ``all_reduce``, each
  slice copied back into its tensor); then the host-time profile of the library's call;
* ``multi-device``: one all-reduce over 4 logical devices on the GPU per call, 4 KiB to
  256 MiB (``auto``, ``one_device``, ``ring``) beside the naive CuPy sum and one fused kernel
  that reads 4 inputs and writes 4 outputs (the bound); then the gradient list through
  ``collectives.batch_all_reduce`` beside a naive CuPy loop (per tensor: ``x0+x1+x2+x3``,
  then a copy to every device).

Writes ``gpu_compare_<part>.json`` into ``--out``, rewritten after every row. ``--quick``: tiny
sizes and one repeat (a check that every part runs, e.g. under a NumPy stand-in for CuPy).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gpu_compare import Record, _device_fence, _profile, _timed

PARTS = ("per-call", "resnet50", "multi-device")


def resnet50_shapes() -> list[tuple[int, ...]]:
    """The parameters of torchvision's ResNet-50 in order: 161 tensors, 25,557,032 floats."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,),
                       (planes, planes, 3, 3), (planes,), (planes,),
                       (planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if block == 0:
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    shapes += [(1000, 2048), (1000,)]
    return shapes


def _torch_dist():
    """torch and its process group of one (NCCL), or None with the reason."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return None, f"PyTorch {torch.__version__} sees no CUDA GPU"
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1)
    return (torch, dist), ""


def _library():
    from mpi4py import MPI

    import collectives

    return collectives.load_backend("nccl").init(MPI.COMM_SELF)


def _fence(peers):
    device = _device_fence()
    if peers is None:
        return device
    torch = peers[0]

    def both():
        torch.cuda.synchronize()
        device()

    return both


def _try(row: dict, key: str, measure) -> None:
    try:
        row[key] = measure() * 1e6
    except Exception as exc:  # noqa: BLE001 - a row records what failed and goes on
        row[key + "_error"] = f"{type(exc).__name__}: {exc}"[:300]


def per_call_part(out: Path, args) -> None:
    import cupy

    comm = _library()
    peers, why = _torch_dist()
    fence = _fence(peers)
    record = Record(out, "per-call", torch=why or peers[0].__version__)
    print(f"{'size(B)':>10} {'torch.dist':>11} {'cupy':>8} {'torch in':>9} "
          f"{'async torch':>12} {'async cupy':>11}  (us per call)")
    for size in args.per_call_sizes:
        row: dict = {"size": size}
        x = cupy.ones(size // 4, cupy.float32)
        y = cupy.empty_like(x)
        _try(row, "library_cupy_us", lambda: _timed(lambda: comm.all_reduce(x, out=y), fence,  # noqa: B023
                                                    args))
        _try(row, "library_cupy_in_place_us", lambda: _timed(
            lambda: comm.all_reduce(y, out=y), fence, args))  # noqa: B023
        _try(row, "library_cupy_new_result_us",
             lambda: _timed(lambda: comm.all_reduce(x), fence, args))  # noqa: B023
        _try(row, "library_cupy_async_in_place_us", lambda: _timed(
            lambda: comm.all_reduce(y, out=y, async_op=True).wait(), fence, args))  # noqa: B023
        _try(row, "library_cupy_async_us", lambda: _timed(
            lambda: comm.all_reduce(x, out=y, async_op=True).wait(), fence, args))  # noqa: B023
        if peers is not None:
            torch, dist = peers
            t = torch.ones(size // 4, device="cuda:0")
            _try(row, "torch_dist_us", lambda: _timed(lambda: dist.all_reduce(t), fence, args))  # noqa: B023
            _try(row, "torch_dist_async_us", lambda: _timed(
                lambda: dist.all_reduce(t, async_op=True).wait(), fence, args))  # noqa: B023
            _try(row, "library_torch_us", lambda: _timed(lambda: comm.all_reduce(t), fence,  # noqa: B023
                                                         args))
            # in place, as dist.all_reduce(t) is
            _try(row, "library_torch_in_place_us", lambda: _timed(
                lambda: comm.all_reduce(t, out=t), fence, args))  # noqa: B023
            _try(row, "library_torch_async_us", lambda: _timed(
                lambda: comm.all_reduce(t, out=t, async_op=True).wait(), fence, args))  # noqa: B023
        record.add(row)
        print(f"{size:>10} {row.get('torch_dist_us', 0):>11.1f} {row.get('library_cupy_us', 0):>8.1f}"
              f" {row.get('library_torch_us', 0):>9.1f} {row.get('torch_dist_async_us', 0):>12.1f}"
              f" {row.get('library_cupy_async_us', 0):>11.1f}", flush=True)
    # 64 calls in flight, then every wait (in place, as torch.distributed's calls are)
    inflight: dict = {"calls": 64, "size": args.inflight_size}
    xs = [cupy.ones(args.inflight_size // 4, cupy.float32) for _ in range(64)]
    _try(inflight, "library_cupy_us", lambda: _timed(
        lambda: [h.wait() for h in [comm.all_reduce(x, out=x, async_op=True) for x in xs]],
        fence, args) / 64)
    _try(inflight, "library_cupy_new_result_us", lambda: _timed(
        lambda: [h.wait() for h in [comm.all_reduce(x, async_op=True) for x in xs]],
        fence, args) / 64)
    if peers is not None:
        torch, dist = peers
        ts = [torch.ones(args.inflight_size // 4, device="cuda:0") for _ in range(64)]
        _try(inflight, "torch_dist_us", lambda: _timed(
            lambda: [h.wait() for h in [dist.all_reduce(t, async_op=True) for t in ts]],
            fence, args) / 64)
        _try(inflight, "library_torch_us", lambda: _timed(
            lambda: [h.wait() for h in [comm.all_reduce(t, out=t, async_op=True) for t in ts]],
            fence, args) / 64)
    record.save(in_flight=inflight)
    print("64 in flight (us per call):", inflight, flush=True)
    x = cupy.ones(1024, cupy.float32)
    profiles = {"async_cupy_4KiB": _profile(
        lambda: comm.all_reduce(x, out=x, async_op=True).wait(), args.profile_calls)}
    if peers is not None:
        t = peers[0].ones(1024, device="cuda:0")
        profiles["torch_4KiB"] = _profile(lambda: comm.all_reduce(t, out=t),
                                          args.profile_calls)
    record.save(profile=profiles)
    fence()


def resnet50_part(out: Path, args) -> None:
    import cupy

    comm = _library()
    peers, why = _torch_dist()
    fence = _fence(peers)
    shapes = resnet50_shapes()[:args.tensors]
    count = sum(int(__import__("math").prod(s)) for s in shapes)
    record = Record(out, "resnet50", tensors=len(shapes), floats=count,
                    torch=why or peers[0].__version__)
    grads = [cupy.full(s, 0.5, cupy.float32) for s in shapes]
    results = comm.batch_all_reduce(grads)
    assert all(r.shape == g.shape for r, g in zip(results, grads))
    assert float(results[-1].ravel()[-1]) == 0.5
    row: dict = {}
    _try(row, "library_batch_cupy_us", lambda: _timed(lambda: comm.batch_all_reduce(grads),
                                                      fence, args))
    # the host's time alone (no fence: what issuing costs while the GPU keeps up)
    _try(row, "library_batch_cupy_issue_us", lambda: _timed(
        lambda: comm.batch_all_reduce(grads), lambda: None, args))
    _try(row, "library_batch_cupy_async_us", lambda: _timed(
        lambda: comm.batch_all_reduce(grads, async_op=True).wait(), fence, args))
    _try(row, "library_per_tensor_cupy_us", lambda: _timed(
        lambda: [comm.all_reduce(g, out=g) for g in grads], fence, args))
    if peers is not None:
        torch, dist = peers
        tgrads = [torch.full(s, 0.5, device="cuda:0") for s in shapes]
        got = comm.batch_all_reduce(tgrads)
        assert isinstance(got[0], torch.Tensor) and tuple(got[-1].shape) == shapes[-1]
        _try(row, "library_batch_torch_us", lambda: _timed(lambda: comm.batch_all_reduce(tgrads),
                                                           fence, args))
        _try(row, "library_batch_torch_issue_us", lambda: _timed(
            lambda: comm.batch_all_reduce(tgrads), lambda: None, args))
        _try(row, "torch_dist_per_tensor_us", lambda: _timed(
            lambda: [dist.all_reduce(t) for t in tgrads], fence, args))

        def fused():
            flat = torch.cat([t.reshape(-1) for t in tgrads])
            dist.all_reduce(flat)
            offset = 0
            for t in tgrads:
                n = t.numel()
                t.copy_(flat[offset:offset + n].view_as(t))
                offset += n

        _try(row, "torch_cat_allreduce_copy_back_us", lambda: _timed(fused, fence, args))
        best = min(row.get("torch_dist_per_tensor_us", float("inf")),
                   row.get("torch_cat_allreduce_copy_back_us", float("inf")))
        for key in ("library_batch_cupy_us", "library_batch_torch_us"):
            if key in row:
                row[key.replace("_us", "_ratio")] = row[key] / best
    record.add(row)
    print("ResNet-50 gradients (us per step):", row, flush=True)
    profiles = {"batch_cupy": _profile(lambda: comm.batch_all_reduce(grads),
                                       args.profile_calls // 20)}
    if peers is not None:
        profiles["batch_torch"] = _profile(lambda: comm.batch_all_reduce(tgrads),
                                           args.profile_calls // 20)
    record.save(profile=profiles)
    fence()


def multi_device_part(out: Path, args) -> None:
    import cupy

    import collectives

    shapes = resnet50_shapes()[:args.tensors]
    devices = 4
    record = Record(out, "multi-device", tensors=len(shapes), devices=devices,
                    note="4 logical devices: 4 arrays per tensor on GPU 0")
    value_lists = [[cupy.full(s, 0.25 * (d + 1), cupy.float32) for d in range(devices)]
                   for s in shapes]
    fence = _device_fence()

    def naive():
        out = []
        for values in value_lists:
            total = values[0] + values[1] + values[2] + values[3]
            out.append([total.copy() for _ in range(devices)])
        return out

    got = collectives.batch_all_reduce(value_lists)
    assert float(got[-1][3].ravel()[-1]) == 2.5
    _multi_device_per_call(record, fence, args)
    row: dict = {}
    _try(row, "library_batch_us", lambda: _timed(
        lambda: collectives.batch_all_reduce(value_lists), fence, args))
    _try(row, "naive_per_tensor_us", lambda: _timed(naive, fence, args))
    if "library_batch_us" in row and "naive_per_tensor_us" in row:
        row["ratio"] = row["library_batch_us"] / row["naive_per_tensor_us"]
    record.add(row)
    print("multi-device ResNet-50 list, 4 logical devices (us per step):", row, flush=True)
    record.save(profile={"batch": _profile(lambda: collectives.batch_all_reduce(value_lists),
                                           max(args.profile_calls // 100, 1))})
    fence()


def _fused_kernel():
    """The bound: one kernel that reads 4 inputs and writes 4 outputs (8 units of traffic)."""
    import cupy

    return cupy.ElementwiseKernel("T a, T b, T c, T d", "T w, T x, T y, T z",
                                  "T s = a + b + c + d; w = s; x = s; y = s; z = s",
                                  "gpu_peers_fused4")


def _multi_device_per_call(record, fence, args) -> None:
    """One all-reduce over 4 logical devices (one GPU) per call, by size: ``auto`` and the
    library's algorithms beside the naive CuPy sum (``x0+x1+x2+x3``, then a copy to each
    device) and the fused kernel."""
    import cupy

    import collectives

    fused = _fused_kernel()

    def one_size(size: int) -> dict:
        xs = [cupy.full(size // 4, 0.25 * (d + 1), cupy.float32) for d in range(4)]
        outs = [cupy.empty_like(x) for x in xs]

        def naive():
            total = xs[0] + xs[1] + xs[2] + xs[3]
            return [total.copy() for _ in range(4)]

        row: dict = {"size": size}
        for name in ("auto", "one_device", "ring"):
            _try(row, f"library_{name}_us", lambda: _timed(  # noqa: B023
                lambda: collectives.all_reduce(xs, "sum", name), fence, args))  # noqa: B023
        _try(row, "naive_us", lambda: _timed(naive, fence, args))
        _try(row, "fused_kernel_us", lambda: _timed(lambda: fused(*xs, *outs), fence, args))
        best = min((v for k, v in row.items() if k.startswith("library_")
                    and k != "library_auto_us" and isinstance(v, float)), default=None)
        if best and "library_auto_us" in row:
            row["auto_over_best"] = row["library_auto_us"] / best
        for key in ("naive_us", "fused_kernel_us"):
            if key in row and "library_auto_us" in row:
                row[key.replace("_us", "_ratio")] = row["library_auto_us"] / row[key]
        return row

    rows = []
    for size in args.multi_sizes:
        rows.append(one_size(size))
        print("multi-device per call:", {k: round(v, 2) if isinstance(v, float) else v
                                         for k, v in rows[-1].items()}, flush=True)
    record.save(per_call=rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=PARTS)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, one repeat: check that the part runs")
    args = parser.parse_args()
    quick = args.quick
    args.per_call_sizes = [4 << 10, 64 << 10] if quick else [4 << 10, 1 << 20, 16 << 20, 64 << 20]
    args.inflight_size = (16 << 10) if quick else (4 << 20)
    args.tensors = 12 if quick else 161
    args.multi_sizes = ([4 << 10, 64 << 10] if quick
                        else [4 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20])
    args.repeats, args.target = (1, 1e-3) if quick else (5, 0.05)
    args.profile_calls = 20 if quick else 2000
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from collectives.backends.cupy.probe import GpuUnavailableError, require_gpu

    try:
        require_gpu()
    except (ImportError, GpuUnavailableError) as exc:
        print(f"SKIPPED gpu_peers {args.part}: {exc}")
        return
    {"per-call": per_call_part, "resnet50": resnet50_part,
     "multi-device": multi_device_part}[args.part](out, args)


if __name__ == "__main__":
    main()
