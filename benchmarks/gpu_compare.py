"""GPU measurements: the library's algorithms beside the card's copy ceiling, NCCL through the
library beside a bare NCCL call, and the two-level path beside plain host staging.

Three parts, each writing JSON (and a table on stdout) into ``--out``:

* ``devices``: busbw of every algorithm, 1 KiB to 1 GiB, 4 logical devices on one GPU
  (``collectives bench --backend cupy``'s sweep), beside the time the card takes to copy the
  4 inputs into 4 outputs (the copy ceiling);
* ``one-rank``: a one-device all-reduce through the library with ``algorithm="nccl"`` (one
  NCCL group call), and through the NCCL backend's one-rank communicator, beside a bare
  ``cupy.cuda.nccl`` ``allReduce`` on the same buffers: the library's overhead per call;
* ``two-level`` (run under ``mpiexec -n 2`` with ``COLLECTIVES_RANKS_PER_NODE=1``): the
  two-level path (NCCL inside each simulated node, MPI between them through pinned chunks)
  beside host staging (copy to the host, ``MPI_Allreduce``, copy back).

Usage::

    python benchmarks/gpu_compare.py devices --out gpu-results
    python benchmarks/gpu_compare.py one-rank --out gpu-results
    COLLECTIVES_RANKS_PER_NODE=1 mpiexec -n 2 python benchmarks/gpu_compare.py two-level --out gpu-results
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


def _timed(call, sync, repeats: int = 5, target: float = 0.02) -> float:
    """Median seconds per call of back-to-back calls (the clock stops after ``sync``)."""
    m = bench.measure(call, warmup=2, repeats=repeats, fence=sync, target=target)
    return m.seconds


def _sizes(lo: int, hi: int, factor: int = 4) -> list[int]:
    out, size = [], lo
    while size <= hi:
        out.append(size)
        size *= factor
    return out


def devices_part(out: Path, maxbytes: int) -> dict:
    config = bench.BenchConfig(algorithms=ALGORITHMS, participants=4, minbytes=1 << 10,
                               maxbytes=maxbytes, stepfactor=4, warmup=1, repeats=3,
                               backend="cupy")
    config.validate()
    print(bench.HEADER)
    rows = bench.run_bench(config, lambda row: print(bench.format_row(row), flush=True))
    print(f"#{'size(B)':>11} {'ceiling algbw(GB/s)':>20}")
    for size in dict.fromkeys(r["size"] for r in rows):
        ceiling = next(r["ceiling"] for r in rows if r["size"] == size)
        print(f"#{size:>11} {ceiling['algbw']:>20.3f}")
    return {"part": "devices", "rows": rows}


def one_rank_part(out: Path, maxbytes: int) -> dict:
    import cupy
    from collectives.backends import cupy as gpu
    from collectives.backends.cupy.probe import nccl_module
    from mpi4py import MPI

    import collectives

    nccl = nccl_module()
    comm = collectives.load_backend("nccl").init(MPI.COMM_SELF)
    bare = nccl.NcclCommunicator.initAll([0])[0]
    stream = cupy.cuda.get_current_stream()
    sync = stream.synchronize
    rows = []
    print(f"{'size(B)':>12} {'bare nccl(us)':>14} {'library nccl(us)':>17} "
          f"{'nccl backend(us)':>17}")
    for size in _sizes(1 << 10, maxbytes):
        x = cupy.ones(size // 4, cupy.float32)
        y = cupy.empty_like(x)
        t_bare = _timed(lambda: bare.allReduce(x.data.ptr, y.data.ptr, x.size,  # noqa: B023
                                               nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr),
                        sync)
        t_lib = _timed(lambda: gpu.all_reduce([x], "sum", "nccl", out=[y]), sync)  # noqa: B023
        t_comm = _timed(lambda: comm.all_reduce(x, "sum", out=y), sync)  # noqa: B023
        rows.append({"size": size, "bare_us": t_bare * 1e6, "library_nccl_us": t_lib * 1e6,
                     "backend_us": t_comm * 1e6, "backend_ran": comm.last_algorithm})
        print(f"{size:>12} {t_bare * 1e6:>14.2f} {t_lib * 1e6:>17.2f} {t_comm * 1e6:>17.2f}",
              flush=True)
    return {"part": "one-rank", "rows": rows,
            "note": "the one-rank communicator runs 'one_device' (a copy): the core gives a "
                    "single rank no native collective"}


def two_level_part(out: Path, maxbytes: int) -> dict | None:
    import cupy
    from mpi4py import MPI

    import collectives

    world = MPI.COMM_WORLD
    comm = collectives.load_backend("nccl").init(timeout=120)
    stream = cupy.cuda.get_current_stream()

    def sync():
        stream.synchronize()
        world.Barrier()

    rows = []
    if comm.rank == 0:
        print(f"{'size(B)':>12} {'two_level(us)':>14} {'host staging(us)':>17} "
              f"{'two_level algbw':>16} {'staging algbw':>14}")
    for size in _sizes(1 << 10, maxbytes):
        x = cupy.full(size // 4, comm.rank + 1, cupy.float32)
        y = cupy.empty_like(x)
        host = np.empty(x.size, np.float32)

        def staged():
            host[...] = cupy.asnumpy(x)  # noqa: B023
            world.Allreduce(MPI.IN_PLACE, host, MPI.SUM)  # noqa: B023
            y.set(host)  # noqa: B023

        t_two = _timed(lambda: comm.all_reduce(x, "sum", "two_level", out=y), sync)  # noqa: B023
        assert float(y[0]) == 3.0
        t_host = _timed(staged, sync)
        rows.append({"size": size, "two_level_us": t_two * 1e6, "staging_us": t_host * 1e6})
        if comm.rank == 0:
            print(f"{size:>12} {t_two * 1e6:>14.2f} {t_host * 1e6:>17.2f} "
                  f"{size / t_two / 1e9:>16.3f} {size / t_host / 1e9:>14.3f}", flush=True)
    return {"part": "two-level", "rows": rows} if comm.rank == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("devices", "one-rank", "two-level"))
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--maxbytes", default="1G", help="largest size (default 1G; "
                        "one-rank and two-level stop at 256M)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    maxbytes = bench.parse_size(args.maxbytes)
    start = time.time()
    from collectives.backends.cupy.probe import GpuUnavailableError, require_gpu

    try:
        require_gpu()
    except (ImportError, GpuUnavailableError) as exc:
        print(f"SKIPPED gpu_compare {args.part}: {exc}")
        return
    if args.part == "devices":
        result = devices_part(out, maxbytes)
    elif args.part == "one-rank":
        result = one_rank_part(out, min(maxbytes, 256 << 20))
    else:
        result = two_level_part(out, min(maxbytes, 256 << 20))
    if result is not None:
        result.update(bench.metadata(f"benchmarks/gpu_compare.py {args.part}"))
        result["seconds"] = time.time() - start
        path = out / f"gpu_compare_{args.part.replace('-', '_')}.json"
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"# wrote {path}")


if __name__ == "__main__":
    main()
