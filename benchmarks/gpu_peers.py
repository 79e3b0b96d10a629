"""The library beside torch.distributed and bare CuPy on one GPU, each doing the same work.

Every row times its ways in interleaved repeats (at least 7; ``gpu_stats.py``), the clock
stopped after the device has finished, and gives each ratio a paired-bootstrap interval; the
JSON keeps every repeat. torch.distributed: ``init_process_group("nccl")``, world size 1; the
library: a one-rank NCCL communicator (``collectives.backends.nccl.init(MPI.COMM_SELF)``).
On one rank NCCL moves no data in place, so

* ``per-call``: the overhead per call in µs at 4 KiB, in place (a blocking call; an
  asynchronous issue + ``wait()``; CuPy arrays and PyTorch tensors beside
  ``dist.all_reduce``), and 64 calls in flight; then out-of-place rows where data moves
  (1 MiB to 64 MiB: the library into ``out=`` beside torch's copy + ``dist.all_reduce``);
* ``resnet50`` (``gpu_peers_grads.py``): ResNet-50's 161 gradients;
* ``multi-device`` (``gpu_peers_multi.py``): 4 logical devices on the GPU;
* ``overlap`` (``gpu_overlap.py``): a ~1 ms kernel beside an asynchronous 256 MiB all-reduce.

Writes ``gpu_compare_<part>.json`` into ``--out``, rewritten after every row. ``--quick``:
tiny sizes, few calls per repeat (a check that every part runs, e.g. under a NumPy stand-in
for CuPy); ``--repeats`` (or ``PEERS_REPEATS``) sets the repeats per row (7 at least).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gpu_compare import Record, _device_fence
from gpu_stats import brief, interleaved, row

PARTS = ("per-call", "resnet50", "multi-device", "overlap")


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


def torch_dist():
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


def library():
    from mpi4py import MPI

    import collectives

    return collectives.load_backend("nccl").init(MPI.COMM_SELF)


def fence_for(peers):
    """Wait for the GPU (every stream), and for PyTorch's work where it runs."""
    device = _device_fence()
    if peers is None:
        return device
    torch = peers[0]

    def both():
        torch.cuda.synchronize()
        device()

    return both


def measure(record: Record, label: dict, ways: dict, fence, args, ratios, derive=None) -> dict:
    """Time ``ways`` in interleaved repeats and record the row; ``derive(times)`` may add
    ways computed per repeat from the timed ones (the fastest of several: ``with_best``)."""
    times = interleaved(ways, fence, args.repeats, args.calls)
    r = row(label, derive(times) if derive is not None else times, ratios)
    record.add(r)
    print(brief(r), flush=True)
    return r


def per_call_part(out: Path, args) -> None:
    import cupy

    comm = library()
    peers, why = torch_dist()
    fence = fence_for(peers)
    record = Record(out, "per-call", torch=why or peers[0].__version__, repeats=args.repeats)
    # overhead: in place at one small size (nothing moves on one rank)
    size = args.overhead_size
    y = cupy.ones(size // 4, cupy.float32)
    ways: dict = {
        "library_cupy": lambda: comm.all_reduce(y, out=y),
        "library_cupy_async": lambda: comm.all_reduce(y, out=y, async_op=True).wait()}
    ratios = [("library_cupy", "torch_dist"), ("library_torch", "torch_dist"),
              ("library_cupy_async", "torch_dist_async"),
              ("library_torch_async", "torch_dist_async")]
    if peers is not None:
        torch, dist = peers
        t = torch.ones(size // 4, device="cuda:0")
        ways.update(torch_dist=lambda: dist.all_reduce(t),
                    torch_dist_async=lambda: dist.all_reduce(t, async_op=True).wait(),
                    library_torch=lambda: comm.all_reduce(t, out=t),
                    library_torch_async=lambda: comm.all_reduce(t, out=t, async_op=True).wait())
    measure(record, {"kind": "overhead, in place", "size": size}, ways, fence, args, ratios)
    # 64 calls in flight, then every wait (in place, as torch.distributed's are)
    xs = [cupy.ones(args.inflight_size // 4, cupy.float32) for _ in range(64)]
    ways = {"library_cupy": lambda: [h.wait() for h in [
        comm.all_reduce(x, out=x, async_op=True) for x in xs]]}
    if peers is not None:
        torch, dist = peers
        ts = [torch.ones(args.inflight_size // 4, device="cuda:0") for _ in range(64)]
        ways.update(torch_dist=lambda: [h.wait() for h in [
            dist.all_reduce(t, async_op=True) for t in ts]],
            library_torch=lambda: [h.wait() for h in [
                comm.all_reduce(t, out=t, async_op=True) for t in ts]])
    inflight = measure(record, {"kind": "64 in flight, in place (time per 64)", "calls": 64,
                                "size": args.inflight_size}, ways, fence, args,
                       [("library_cupy", "torch_dist"), ("library_torch", "torch_dist")])
    record.save(in_flight=inflight)
    # out of place where data moves: into out= beside torch's copy then all-reduce in place
    for size in args.sizes:
        x, y = cupy.ones(size // 4, cupy.float32), cupy.empty(size // 4, cupy.float32)
        ways = {"library_cupy": lambda x=x, y=y: comm.all_reduce(x, out=y),
                "cupy_copy": lambda x=x, y=y: cupy.copyto(y, x)}
        if peers is not None:
            torch, dist = peers
            t, u = torch.ones(size // 4, device="cuda:0"), torch.empty(size // 4, device="cuda:0")

            def torch_out_of_place(t=t, u=u, dist=dist):
                u.copy_(t)
                dist.all_reduce(u)

            ways.update(torch_dist=torch_out_of_place,
                        library_torch=lambda t=t, u=u: comm.all_reduce(t, out=u))
        measure(record, {"kind": "out of place", "size": size}, ways, fence, args,
                [("library_cupy", "torch_dist"), ("library_torch", "torch_dist"),
                 ("library_cupy", "cupy_copy")])
    fence()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=PARTS)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, one call per repeat: check that the part runs")
    parser.add_argument("--repeats", type=int, default=int(os.environ.get("PEERS_REPEATS", 7)),
                        help="interleaved repeats per row (7 at least)")
    args = parser.parse_args()
    quick = args.quick
    args.repeats = max(args.repeats, 7)
    args.overhead_size = 4 << 10
    args.sizes = [64 << 10] if quick else [1 << 20, 16 << 20, 64 << 20]
    args.inflight_size = (16 << 10) if quick else (4 << 20)
    args.tensors = 12 if quick else 161
    args.multi_sizes = [4 << 10, 64 << 10] if quick else [4 << 10, 1 << 20, 16 << 20, 64 << 20,
                                                           256 << 20]
    args.calls = 1 if quick else 20  # calls per repeat (the per-step parts: fewer)
    args.overlap_bytes = (64 << 10) if quick else (256 << 20)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from collectives.backends.cupy.probe import GpuUnavailableError, require_gpu

    try:
        require_gpu()
    except (ImportError, GpuUnavailableError) as exc:
        print(f"SKIPPED gpu_peers {args.part}: {exc}")
        return
    if args.part == "per-call":
        per_call_part(out, args)
    elif args.part == "resnet50":
        from gpu_peers_grads import resnet50_part

        resnet50_part(out, args)
    elif args.part == "multi-device":
        from gpu_peers_multi import multi_device_part

        multi_device_part(out, args)
    else:
        from gpu_overlap import overlap_part

        overlap_part(out, args)


if __name__ == "__main__":
    main()
