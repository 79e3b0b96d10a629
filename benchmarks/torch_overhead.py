"""What PyTorch CPU tensors cost per call beside NumPy arrays: ``comm.all_reduce`` of a
float32 tensor against the same call on a NumPy array of the same size, on thread ranks
(``collectives.run``) and on MPI ranks (one ``mpiexec`` launch).

A tensor crosses at the edge (``collectives.foreign``): viewed as NumPy through DLPack, reduced
as NumPy is, and its result handed back as a tensor on the same memory. What that adds is a
fixed cost per call (the edge, two DLPack exchanges), so the ratio is largest at the smallest
size. Each repeat times ``ITERS[size]`` back-to-back calls of each way (the slowest rank's
wall time per call, after a barrier), the ways in an order rotated from repeat to repeat (a
slow moment of a shared machine falls on both alike); a cell is the median over repeats, and
the ratio's 90% interval a paired bootstrap over the repeats (``gpu_stats.ratio``). Beside
the wall time, the CPU time of the calling thread per call (``time.thread_time``, again the
slowest rank's): what a call costs the caller, which other processes' turns on a shared
machine's cores disturb less than the wall time.

    python benchmarks/torch_overhead.py [-p 2] [-s 4K 64K 1M 16M 64M] [-r 15] [--mpi]
                                        [--edge] [--core] [--batch] [--json out.json]

``--edge`` adds two ways per size: NumPy's call on a NumPy view of the tensor's own memory
(PyTorch's allocator places it, not NumPy's: at the largest sizes that alone can move the
time), and NumPy's call with the edge's own work around it (the tensor adopted, the result
handed back, without the Communicator's routing of a tensor); and it prints what each step
of the edge costs alone (one thread, no collective, 4 KiB, in CPU time): together they say
where a missed target's time goes. ``--core`` times the same ways on one rank of a
*mirror* transport (``mirror.py``: every peer already there, nothing waits), in one thread's
CPU time: the core's own work per call, which waiting and other processes disturb least, and
the Python function calls each way makes per call (a count, which noise cannot move).
``--batch`` times ``comm.batch_all_reduce`` of a gradient list instead: ResNet-50's 161
gradient shapes at half width (``train_step.shapes``), each first dimension scaled so that the
list holds about the size given (27 MiB: the whole list), as NumPy arrays and as tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_stats  # noqa: E402  (interleaved repeats' ratio and interval)

ITERS = {4 << 10: 400, 64 << 10: 200, 1 << 20: 30, 16 << 20: 4, 64 << 20: 2}
SIZES = ["4K", "64K", "1M", "16M", "64M"]


def parse_size(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def ways(comm, nbytes: int, edge: bool, batch: bool = False) -> dict:
    """The calls timed at ``nbytes``, by name (each returns nothing; results are dropped)."""
    import torch

    from collectives.foreign import Edge

    if batch:
        import train_step

        whole = sum(np.prod(s) for s in train_step.shapes("half", 1.0)) * 4
        shapes = train_step.shapes("half", min(1.0, nbytes / whole))
        xs = [np.ones(s, np.float32) for s in shapes]
        ts = [torch.ones(s, dtype=torch.float32) for s in shapes]
        return {"numpy": lambda: comm.batch_all_reduce(xs),
                "torch": lambda: comm.batch_all_reduce(ts)}
    x = np.ones(nbytes // 4, np.float32)
    t = torch.ones(nbytes // 4, dtype=torch.float32)
    found = {"numpy": lambda: comm.all_reduce(x), "torch": lambda: comm.all_reduce(t)}
    if edge:
        on_tensor = t.numpy()  # NumPy's call on the tensor's own memory: where it lives, apart
        found["numpy, tensor's memory"] = lambda: comm.all_reduce(on_tensor)
        def numpy_and_edge():
            crossing = Edge(t)
            crossing.back(comm.all_reduce(crossing.adopt(t, "x")))
        found["numpy+edge"] = numpy_and_edge
    return found


def measure(comm, sizes: list[int], repeats: int, edge: bool, slowest, meet=None,
            batch: bool = False) -> list[dict]:
    """Every rank runs this; rank 0's list holds the rows. ``slowest(seconds)``: the largest
    of every rank's value; ``meet()``: what lines the ranks up before each timing (default
    ``comm.barrier``)."""
    meet = comm.barrier if meet is None else meet
    rows = []
    for nbytes in sizes:
        calls = max(2, (16 << 20) // nbytes) if batch else ITERS.get(nbytes, 2)
        timed = ways(comm, nbytes, edge and not batch, batch)
        names = list(timed)
        for name in names:  # warm up: plans cached, signatures agreed, hot paths bound
            for _ in range(3):
                timed[name]()
        times: dict[str, list[float]] = {name: [] for name in names}
        times.update({f"{name} cpu": [] for name in names})
        for r in range(repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                meet()
                start, cpu = time.perf_counter(), time.thread_time()
                for _ in range(calls):
                    timed[name]()
                cpu, wall = time.thread_time() - cpu, time.perf_counter() - start
                times[name].append(slowest(wall / calls))
                times[f"{name} cpu"].append(slowest(cpu / calls))
        pairs = [(name, "numpy") for name in names if name != "numpy"]
        if "numpy, tensor's memory" in names:  # the library's own cost, memory aside
            pairs.append(("torch", "numpy, tensor's memory"))
        row = gpu_stats.row({"bytes": nbytes, "calls": calls}, times,
                            [(f"{a}{cpu}", f"{b}{cpu}") for cpu in ("", " cpu") for a, b in pairs])
        rows.append(row)
        if comm.rank == 0:
            print(gpu_stats.brief(row), flush=True)
    return rows


def edge_parts(repeats: int, calls: int = 20000) -> dict[str, float]:
    """Median CPU µs per call of each step of a 4 KiB float32 tensor's crossing, alone."""
    import statistics

    import torch

    from collectives.foreign import Edge, is_foreign

    t, x = torch.ones(1024), np.ones(1024, np.float32)
    edge = Edge(t)
    steps = {"is_foreign(t)": lambda: is_foreign(t), "Edge(t)": lambda: Edge(t),
             "edge.adopt(t)": lambda: edge.adopt(t, "x"), "t.numpy()": t.numpy,
             "np.from_dlpack(t)": lambda: np.from_dlpack(t), "edge.back(result)": lambda: edge.back(x),
             "torch.from_numpy": lambda: torch.from_numpy(x),
             "torch.from_dlpack": lambda: torch.from_dlpack(x)}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.thread_time()
            for _ in range(calls):
                step()
            times[name].append((time.thread_time() - start) / calls * 1e6)
    return {name: statistics.median(v) for name, v in times.items()}


def core_alone(p: int, sizes: list[int], repeats: int, batch: bool = False) -> list[dict]:
    """Each way's CPU time per call on rank 0 of a mirror transport, and its function calls."""
    import cProfile
    import pstats

    from mirror import MirrorTransport

    from collectives.api.communicator import Communicator

    comm = Communicator(MirrorTransport(0, p))
    rows = measure(comm, sizes, repeats, not batch, lambda seconds: seconds, meet=lambda: None,
                   batch=batch)
    def count(way) -> int:
        profile = cProfile.Profile()
        profile.runcall(lambda: [way() for _ in range(100)])  # noqa: B023 (run at once)
        return pstats.Stats(profile).total_calls  # type: ignore[attr-defined]  # (untyped)

    nothing = count(lambda: None)  # (the loop's own calls)
    for row, nbytes in zip(rows, sizes):
        for name, way in ways(comm, nbytes, not batch, batch).items():
            row[f"{name} calls"] = (count(way) - nothing) / 100
    return rows


def on_threads(p: int, sizes: list[int], repeats: int, edge: bool, batch: bool) -> list[dict]:
    import collectives

    def body(comm):  # (rank 0's clock)
        return measure(comm, sizes, repeats, edge, lambda seconds: seconds, batch=batch)

    return collectives.run(body, p)[0]


def mpi_worker(sizes: list[int], repeats: int, edge: bool, batch: bool, out: str) -> None:
    """One MPI rank of the ``--mpi`` launch; rank 0 writes the rows to ``out``."""
    from collectives.backends import mpi
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    comm = mpi.init()
    rows = measure(comm, sizes, repeats, edge, lambda s: world.allreduce(s, op=MPI.MAX),
                   batch=batch)
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    comm.free()


def on_mpi(p: int, sizes: list[int], repeats: int, edge: bool, batch: bool) -> list[dict]:
    import tempfile

    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        cmd = [mpiexec, "-n", str(p), sys.executable, os.path.abspath(__file__), "--worker",
               out, "-r", str(repeats), "-s", *[str(s) for s in sizes]]
        cmd += ["--edge"] if edge else []
        cmd += ["--batch"] if batch else []
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        with open(out) as f:
            return json.load(f)


def table(title: str, rows: list[dict]) -> str:
    """A Markdown table: per size, each way's median per call and its ratio to NumPy's (with
    the interval), in wall time, then in the calling thread's CPU time."""
    others = [k[:-len("/numpy")] for k in rows[0] if k.endswith("/numpy")]
    extra = "torch/numpy, tensor's memory"
    head = ["size", "calls/repeat"]
    for cpu in ("", " cpu"):
        head += [f"numpy{cpu} µs", *[f"{o}{cpu} µs" for o in others],
                 *[f"{o}{cpu} / numpy{cpu} [90%]" for o in others]]
        if extra in rows[0]:
            head.append(f"torch{cpu} / numpy{cpu} on the tensor's memory [90%]")
    lines = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        size = row["bytes"]
        cells = [f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB", str(row["calls"])]
        for cpu in ("", " cpu"):
            cells += [f"{row[f'{w}{cpu}_us']:.1f}" for w in ("numpy", *others)]
            ratios = [f"{o}{cpu}/numpy{cpu}" for o in others]
            if extra in row:
                ratios.append(f"torch{cpu}/numpy, tensor's memory{cpu}")
            for key in ratios:
                got = row[key]
                cells.append(f"{got['ratio']:.2f} [{got['interval'][0]:.2f}, {got['interval'][1]:.2f}]")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("-s", nargs="+", default=SIZES, help="sizes in bytes (4K, 1M, ...)")
    parser.add_argument("-r", type=int, default=15, help="interleaved repeats (default 15)")
    parser.add_argument("--mpi", action="store_true", help="also on MPI ranks (mpiexec)")
    parser.add_argument("--edge", action="store_true", help="also time NumPy plus the edge alone")
    parser.add_argument("--core", action="store_true",
                        help="also on one rank of a mirror transport (the core alone)")
    parser.add_argument("--batch", action="store_true",
                        help="time batch_all_reduce of ResNet-50's gradient list of that size")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # (an MPI rank of --mpi)
    args = parser.parse_args()
    sizes = [parse_size(str(s)) for s in args.s]
    if args.worker:
        mpi_worker(sizes, args.r, args.edge, args.batch, args.worker)
        return
    import torch

    print(f"torch {torch.__version__}, numpy {np.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores", flush=True)
    results: dict = {}
    if args.edge:
        results["edge steps (cpu us)"] = steps = edge_parts(max(3, args.r // 3))
        print("\nthe edge's steps alone, CPU µs per call (4 KiB float32):")
        for name, us in steps.items():
            print(f"  {name:20s} {us:6.2f}")
    if args.core:
        results["core alone"] = core_alone(args.p, sizes, args.r, args.batch)
        for row in results["core alone"]:
            print(f"{row['bytes']} bytes: Python function calls per call: " + ", ".join(
                f"{k[:-6]} {v:g}" for k, v in row.items() if k.endswith(" calls")))
    results["threads"] = on_threads(args.p, sizes, args.r, args.edge, args.batch)
    if args.mpi:
        results["mpi"] = on_mpi(args.p, sizes, args.r, args.edge, args.batch)
    for where, rows in results.items():
        if not isinstance(rows, list):
            continue
        print()
        what = ("batch_all_reduce of ResNet-50's list" if args.batch else "all_reduce")
        print(table(f"{where}, p={args.p}, float32 {what} (sum, auto), {args.r} repeats", rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"p": args.p, "repeats": args.r, "batch": args.batch, **results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
