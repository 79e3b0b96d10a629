"""GPU measurements: the card's copy rate, every algorithm over logical devices beside it, NCCL
through the library beside a bare NCCL call, the two-level path beside MPI over host copies,
and PyTorch CUDA tensors through the library.

Each part prints a table and writes ``gpu_compare_<part>.json`` into ``--out``, rewritten
after every row (a part stopped by a time limit leaves what it measured):

* ``copy``: device-to-device ``cudaMemcpyAsync`` of 64 MiB to 1 GiB on one stream: the copy
  rate (bytes copied per second) that bounds every algorithm below;
* ``devices``: nccl-tests' algbw/busbw of every algorithm over 4 logical devices on one GPU,
  1 KiB to 1 GiB (``collectives bench --backend cupy``'s sweep; results checked up to
  ``--check-upto``), with the bytes each algorithm moves between buffers and, where the copy
  part ran first, the fraction of the copy-rate bound for those bytes it reaches;
* ``one-rank``: a one-device all-reduce through the library (``algorithm="nccl"``: one NCCL
  group call), and through the NCCL backend's one-rank communicator (NCCL's allReduce, the
  transport's "native"), beside a bare ``cupy.cuda.nccl`` ``allReduce`` on the same buffers:
  overhead in microseconds at 4 KiB, time ratio at 1 MiB and more;
* ``two-level`` (under ``mpiexec -n 2`` with ``COLLECTIVES_RANKS_PER_NODE=1``): the two-level
  path (one-rank NCCL inside each simulated node, MPI between them through pinned chunks)
  beside MPI over host copies (copy to the host, ``MPI_Allreduce``, copy back);
* ``torch``: ``collectives.all_reduce`` of two PyTorch CUDA tensors (DLPack in and out) beside
  the same call on CuPy arrays.

Usage::

    python benchmarks/gpu_compare.py copy --out gpu-results
    python benchmarks/gpu_compare.py devices --out gpu-results
    COLLECTIVES_RANKS_PER_NODE=1 mpiexec -n 2 python benchmarks/gpu_compare.py two-level --out gpu-results

``--quick`` runs tiny sizes and one repeat (a check that every part still runs).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from collectives.tools import bench

ALGORITHMS = ("one_device", "ring", "rechd", "tree", "shuffle")
PARTS = ("copy", "devices", "one-rank", "two-level", "torch")


class Record:
    """A part's JSON, rewritten after every row."""

    def __init__(self, out: Path, part: str, **fields):
        self.path = out / f"gpu_compare_{part.replace('-', '_')}.json"
        self.data = {"part": part, **bench.metadata(f"benchmarks/gpu_compare.py {part}"),
                     **fields, "rows": []}
        self.start = time.time()
        self.save()

    def add(self, row: dict) -> None:
        self.data["rows"].append(row)
        self.save()

    def save(self, **fields) -> None:
        self.data.update(fields, seconds=time.time() - self.start)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        tmp.replace(self.path)


def _sizes(lo: int, hi: int, factor: int = 4) -> list[int]:
    out, size = [], lo
    while size <= hi:
        out.append(size)
        size *= factor
    return out


def _timed(call, fence, args, agree=None) -> float:
    """Median seconds per call of back-to-back calls (the clock stops after ``fence``)."""
    extra = {"agree": agree} if agree is not None else {}
    return bench.measure(call, warmup=2, repeats=args.repeats, fence=fence,
                         target=args.target, **extra).seconds


def _device_fence():
    """Wait for everything on GPU 0 (every stream: the NCCL transport has its own)."""
    import cupy

    return cupy.cuda.Device(0).synchronize


def copy_part(out: Path, args) -> None:
    import cupy
    from collectives.backends.cupy.probe import describe

    record = Record(out, "copy", environment=describe())
    runtime = cupy.cuda.runtime
    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"{'size(B)':>12} {'time(us)':>10} {'copy(GB/s)':>11}")
    best = 0.0
    for size in _sizes(args.copy_min, args.copy_max):
        src, dst = cupy.ones(size, cupy.uint8), cupy.empty(size, cupy.uint8)

        def copy(src=src, dst=dst, size=size):
            runtime.memcpyAsync(dst.data.ptr, src.data.ptr, size, runtime.memcpyDeviceToDevice,
                                stream.ptr)

        seconds = _timed(copy, stream.synchronize, args)
        rate = size / seconds / 1e9
        best = max(best, rate)
        record.add({"size": size, "time_us": seconds * 1e6, "copy_GBps": rate})
        print(f"{size:>12} {seconds * 1e6:>10.1f} {rate:>11.1f}", flush=True)
        src = dst = None  # (freed before the next, larger pair)
    record.save(copy_GBps=best)


def _moved_bytes(row: dict, inplace: bool) -> int:
    """Bytes a call copies or combines from one buffer into another: its schedule's steps,
    plus the first copies of inputs into the outputs out of place."""
    from collectives import algorithms
    from collectives.algorithms.schedule import Collective

    collective, n = Collective(row["collective"]), row["participants"]
    schedule = algorithms.schedule(collective, row["resolved"], n)
    itemsize = np.dtype(row["type"]).itemsize
    buffer = row["count"] * itemsize * (n if collective in (Collective.ALL_GATHER,
                                                            Collective.REDUCE_SCATTER) else 1)
    moved = float(schedule.wire_fraction()) * buffer
    if not inplace:
        one_input = buffer if collective is not Collective.ALL_GATHER else buffer // n
        moved += (1 if collective is Collective.BROADCAST else n) * one_input
    return int(moved)


def devices_part(out: Path, args) -> None:
    copy = out / "gpu_compare_copy.json"
    rate = json.loads(copy.read_text()).get("copy_GBps") if copy.exists() else None
    record = Record(out, "devices", copy_GBps=rate, participants=4,
                    bound="copy_fraction: (moved bytes / copy rate) / measured time")

    def on_row(row: dict) -> None:
        for half, inplace in ((row, False), (row.get("inplace"), True)):
            if half is None or row["resolved"] == "nccl":
                continue
            half["moved_bytes"] = _moved_bytes(row, inplace)
            if rate:
                half["copy_fraction"] = half["moved_bytes"] / (rate * 1e9) / (
                    half["time_us"] * 1e-6)
        record.add(row)
        print(bench.format_row(row), f"{row.get('copy_fraction', 0):.2f}", flush=True)

    print(bench.TITLE)
    print(bench.HEADER, "copy-bound fraction")
    for lo, hi, check in ((args.min, min(args.max, args.check_upto), True),
                          (args.check_upto * 4, args.max, False)):
        if lo > hi:
            continue
        config = bench.BenchConfig(algorithms=ALGORITHMS, participants=4, minbytes=lo,
                                   maxbytes=hi, stepfactor=4, warmup=1, repeats=args.repeats,
                                   backend="cupy", check=check)
        bench.run_bench(config, on_row)


def one_rank_part(out: Path, args) -> None:
    import cupy
    from collectives.backends import cupy as gpu
    from collectives.backends.cupy.probe import describe, nccl_module
    from mpi4py import MPI

    import collectives

    nccl = nccl_module()
    comm = collectives.load_backend("nccl").init(MPI.COMM_SELF)
    bare = nccl.NcclCommunicator.initAll([0])[0]
    stream = cupy.cuda.get_current_stream()
    fence = _device_fence()
    record = Record(out, "one-rank", environment=describe(),
                    note="library_nccl: collectives.backends.cupy.all_reduce([x], 'sum', 'nccl') "
                         "(one NCCL group call); backend: a one-rank NCCL communicator's "
                         "all_reduce (NCCL's allReduce on its own stream, 'native')")
    print(f"{'size(B)':>12} {'bare nccl(us)':>14} {'library nccl(us)':>17} "
          f"{'nccl backend(us)':>17}")
    for size in [4 << 10] + _sizes(args.one_min, args.one_max):
        x = cupy.ones(size // 4, cupy.float32)
        y = cupy.empty_like(x)
        t_bare = _timed(lambda: bare.allReduce(x.data.ptr, y.data.ptr, x.size,  # noqa: B023
                                               nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr),
                        fence, args)
        t_lib = _timed(lambda: gpu.all_reduce([x], "sum", "nccl", out=[y]), fence,  # noqa: B023
                       args)
        # NCCL by name: on one rank the model would pick a plain copy
        t_comm = _timed(lambda: comm.all_reduce(x, "sum", "nccl", out=y), fence,  # noqa: B023
                        args)
        assert float(y[0]) == 1.0
        record.add({"size": size, "bare_us": t_bare * 1e6, "library_nccl_us": t_lib * 1e6,
                    "backend_us": t_comm * 1e6, "backend_ran": comm.last_algorithm,
                    "library_overhead_us": (t_lib - t_bare) * 1e6,
                    "backend_overhead_us": (t_comm - t_bare) * 1e6,
                    "library_ratio": t_lib / t_bare, "backend_ratio": t_comm / t_bare})
        print(f"{size:>12} {t_bare * 1e6:>14.2f} {t_lib * 1e6:>17.2f} {t_comm * 1e6:>17.2f}",
              flush=True)
    x = cupy.ones(1024, cupy.float32)
    y = cupy.empty_like(x)
    record.save(profile={  # where the host time of a 4 KiB call goes (the per-call overhead)
        "library_nccl": _profile(lambda: gpu.all_reduce([x], "sum", "nccl", out=[y])),
        "backend": _profile(lambda: comm.all_reduce(x, "sum", "nccl", out=y))})
    fence()


def _profile(call, calls: int = 2000, lines: int = 25, order: str = "tottime") -> list[str]:
    """The functions that take the most time (their own, or with what they call: ``order``
    "cumulative") over ``calls`` calls, as text."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(lambda: [call() for _ in range(calls)])
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(lines)
    return [line for line in text.getvalue().splitlines() if line.strip()]


def two_level_part(out: Path, args) -> None:
    import cupy
    from mpi4py import MPI

    import collectives

    world = MPI.COMM_WORLD
    comm = collectives.load_backend("nccl").init(timeout=120)
    fence = _device_fence()
    # every rank must make the same number of calls: the slowest rank's timing decides
    agree = lambda times: [world.allreduce(t, op=MPI.MAX) for t in times]  # noqa: E731
    record = Record(out, "two-level", ranks=comm.size) if comm.rank == 0 else None

    def sync():
        fence()
        world.Barrier()

    if comm.rank == 0:
        print(f"{'size(B)':>12} {'two_level(us)':>14} {'host staging(us)':>17} "
              f"{'two_level algbw':>16} {'staging algbw':>14}")
    for size in _sizes(args.min, min(args.max, args.two_max)):
        x = cupy.full(size // 4, comm.rank + 1, cupy.float32)
        y = cupy.empty_like(x)
        host = np.empty(x.size, np.float32)

        def staged():
            host[...] = cupy.asnumpy(x)  # noqa: B023
            world.Allreduce(MPI.IN_PLACE, host, MPI.SUM)  # noqa: B023
            y.set(host)  # noqa: B023

        t_two = bench.measure(lambda: comm.all_reduce(x, "sum", "two_level", out=y),  # noqa: B023
                              warmup=2, repeats=args.repeats, sync=sync, agree=agree,
                              target=args.target, fence=fence).seconds
        assert float(y[0]) == comm.size * (comm.size + 1) / 2
        t_host = bench.measure(staged, warmup=2, repeats=args.repeats, sync=sync, agree=agree,
                               target=args.target, fence=fence).seconds
        if record is not None:
            record.add({"size": size, "two_level_us": t_two * 1e6, "staging_us": t_host * 1e6,
                        "two_level_algbw": size / t_two / 1e9,
                        "staging_algbw": size / t_host / 1e9})
            print(f"{size:>12} {t_two * 1e6:>14.2f} {t_host * 1e6:>17.2f} "
                  f"{size / t_two / 1e9:>16.3f} {size / t_host / 1e9:>14.3f}", flush=True)
    comm.barrier()


def torch_part(out: Path, args) -> None:
    import collectives

    try:
        import torch
    except ImportError:
        Record(out, "torch", skipped="PyTorch is not installed")
        print("SKIPPED gpu_compare torch: PyTorch is not installed")
        return
    if not torch.cuda.is_available():
        Record(out, "torch", skipped=f"PyTorch {torch.__version__} sees no CUDA GPU")
        print("SKIPPED gpu_compare torch: PyTorch sees no CUDA GPU")
        return
    import cupy

    record = Record(out, "torch", torch=torch.__version__)
    fence = torch.cuda.synchronize
    print(f"{'size(B)':>12} {'torch tensors(us)':>18} {'cupy arrays(us)':>16}")
    for size in [4 << 10] + _sizes(args.one_min, args.one_max, 16):
        tensors = [torch.full((size // 4,), float(p + 1), device="cuda:0") for p in range(2)]
        arrays = [cupy.from_dlpack(t) for t in tensors]
        got = collectives.all_reduce(tensors, "sum", "ring")
        assert isinstance(got[1], torch.Tensor) and got[1].device == tensors[1].device
        assert float(got[1][-1]) == 3.0
        t_torch = _timed(lambda: collectives.all_reduce(tensors, "sum", "ring"),  # noqa: B023
                         fence, args)
        t_cupy = _timed(lambda: collectives.all_reduce(arrays, "sum", "ring"),  # noqa: B023
                        fence, args)
        record.add({"size": size, "torch_us": t_torch * 1e6, "cupy_us": t_cupy * 1e6,
                    "dlpack_overhead_us": (t_torch - t_cupy) * 1e6})
        print(f"{size:>12} {t_torch * 1e6:>18.2f} {t_cupy * 1e6:>16.2f}", flush=True)
    tensors = [torch.full((1024,), float(p + 1), device="cuda:0") for p in range(2)]
    record.save(profile={  # where the host time of the tensors' way goes (4 KiB)
        "torch_tensors": _profile(lambda: collectives.all_reduce(tensors, "sum", "ring"), 500),
        "torch_tensors_cumulative": _profile(
            lambda: collectives.all_reduce(tensors, "sum", "ring"), 500, 40, "cumulative")})
    fence()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=PARTS)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, one repeat: check that the part runs")
    args = parser.parse_args()
    size = bench.parse_size
    quick = args.quick
    args.min, args.max = 1 << 10, size("64K" if quick else "1G")
    args.check_upto = size("16K" if quick else "64M")
    args.copy_min, args.copy_max = size("16K" if quick else "64M"), size("64K" if quick else "1G")
    args.one_min, args.one_max = size("64K" if quick else "1M"), size("256K" if quick else "64M")
    args.two_max = size("64K" if quick else "64M")
    args.repeats, args.target = (1, 1e-3) if quick else (5, 0.02)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from collectives.backends.cupy.probe import GpuUnavailableError, require_gpu

    try:
        require_gpu()
    except (ImportError, GpuUnavailableError) as exc:
        print(f"SKIPPED gpu_compare {args.part}: {exc}")
        return
    {"copy": copy_part, "devices": devices_part, "one-rank": one_rank_part,
     "two-level": two_level_part, "torch": torch_part}[args.part](out, args)


if __name__ == "__main__":
    main()
