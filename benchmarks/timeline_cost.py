"""What the timeline costs on the 4 KiB hot path: off (against a checkout without its hooks),
and on.

Three builds of the same call, each measured in a fresh process, interleaved in rotated order
over ``-r`` repeats so that the machine's drift hits every build alike:

* ``without``: the library of ``--baseline DIR``, a checkout from before the timeline existed
  (``git archive <commit> collectives benchmarks | tar -x -C DIR``);
* ``off``: this checkout, not recording (every hook is one attribute test);
* ``on``: this checkout, recording into a temporary folder.

Two hot paths, both 4 KiB float32 all-reduces after warm-up calls (plans cached, the call
agreed):

* ``core``: one rank's call over the mirror transport (every peer already there, see
  ``mirror.py``), in thread CPU time: the core's own work per call, for ``rechd`` at 2 ranks
  (1 round) and 64 ranks (6 rounds), where every hook of a blocking call runs;
* ``mpi``: two MPI ranks on the fast path (``auto``: MPI's persistent all-reduce), wall time
  per call, the slower rank's (needs mpi4py).

Each cell is the median over repeats of the median of a repeat's blocks; ``off - without``
is the cost of the hooks, ``on - off`` the cost of recording.

    python benchmarks/timeline_cost.py --baseline DIR [-r 9] [--json cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COUNT = 1024  # float32: 4 KiB
BLOCKS, CALLS = 15, 400  # per repeat: blocks of calls, each block timed


def core_worker(ranks: int, record: str | None) -> list[float]:
    import numpy as np
    from mirror import MirrorTransport

    import collectives  # noqa: F401 - the checkout on sys.path, first
    from collectives.api.communicator import Communicator

    if record:
        from collectives import timeline

        timeline.start(record)
    comm = Communicator(MirrorTransport(0, ranks))
    x = np.ones(COUNT, np.float32)
    for _ in range(50):
        comm.all_reduce(x, "sum", "rechd")
    out = []
    for _ in range(BLOCKS):
        start = time.thread_time()
        for _ in range(CALLS):
            comm.all_reduce(x, "sum", "rechd")
        out.append((time.thread_time() - start) / CALLS * 1e6)
    return out


def mpi_worker(record: str | None) -> list[float]:
    import numpy as np
    from mpi4py import MPI

    import collectives

    if record:
        collectives.timeline.start(record)
    comm = collectives.backends.mpi.init(timeout=60)
    world = MPI.COMM_WORLD
    x = np.ones(COUNT, np.float32)
    out = np.empty_like(x)
    for _ in range(200):
        comm.all_reduce(x, out=out)
    times = []
    for _ in range(BLOCKS):
        world.Barrier()
        start = time.perf_counter()
        for _ in range(CALLS):
            comm.all_reduce(x, out=out)
        times.append(world.allreduce((time.perf_counter() - start) / CALLS * 1e6, op=MPI.MAX))
    assert (out == world.size).all()
    comm.free()
    return times


def measure(path: str, tree: Path, record: bool, ranks: int, mpiexec: str | None) -> float:
    """One repeat of one cell, in a fresh process: the median over its blocks (us per call)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(HERE)]),
           "OMP_NUM_THREADS": "1"}
    env.pop("COLLECTIVES_TIMELINE", None)
    with tempfile.TemporaryDirectory() as folder:
        args = [__file__, "--worker", path, "--ranks", str(ranks)]
        if record:
            args += ["--record", folder]
        cmd = ([mpiexec, "-n", "2", sys.executable, *args] if path == "mpi"
               else [sys.executable, *args])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
        lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
        return statistics.median(json.loads(lines[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout without the timeline")
    parser.add_argument("-r", "--repeats", type=int, default=9)
    parser.add_argument("--paths", nargs="+", default=["core", "mpi"], choices=["core", "mpi"])
    parser.add_argument("--json")
    parser.add_argument("--worker", choices=["core", "mpi"])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--record")
    args = parser.parse_args()
    if args.worker:
        times = (core_worker(args.ranks, args.record) if args.worker == "core"
                 else mpi_worker(args.record))
        if args.worker == "core" or int(os.environ.get("PMI_RANK", "0")) == 0:
            print(json.dumps(times), flush=True)
        return
    beside = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(beside) if beside.exists() else None
    builds = {"off": (ROOT, False), "on": (ROOT, True)}
    if args.baseline is not None:
        builds = {"without": (args.baseline.resolve(), False), **builds}
    cells = [(p, r) for p in args.paths for r in ((2, 64) if p == "core" else (2,))
             if p == "core" or mpiexec is not None]
    results: dict = {f"{p} {r}": {b: [] for b in builds} for p, r in cells}
    names = list(builds)
    for rep in range(args.repeats):
        for path, ranks in cells:
            k = rep % len(names)
            for build in names[k:] + names[:k]:
                tree, record = builds[build]
                results[f"{path} {ranks}"][build].append(
                    measure(path, tree, record, ranks, mpiexec))
        print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    print(f"\n4 KiB float32 all-reduce, us per call, median over {args.repeats} interleaved "
          "repeats (spread: the repeats' lowest..highest)\n")
    head = "| hot path | " + " | ".join(names) + " |"
    head += " off - without |" if "without" in builds else ""
    print(head + " on - off |")
    print("|" + "---|" * (head.count("|")))
    for cell, by_build in results.items():
        med = {b: statistics.median(v) for b, v in by_build.items()}
        row = [f"{med[b]:.2f} ({min(by_build[b]):.2f}..{max(by_build[b]):.2f})" for b in names]
        label = (f"core alone, rechd, rank 0 of {cell.split()[1]}" if cell.startswith("core")
                 else "MPI fast path, 2 ranks")
        extra = [f"{med['off'] - med['without']:+.2f}"] if "without" in builds else []
        print(f"| {label} | " + " | ".join(row + extra + [f"{med['on'] - med['off']:+.2f}"]) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
