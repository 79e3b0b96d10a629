"""The timeline of a small training loop in which one host is slow: the picture of docs/timeline.md.

Each step every rank "computes" (sleeps ``--compute`` ms; the ranks of the slow host ``--slower``
times as long), then all-reduces a 1 MiB gradient with the ring, a 64 KiB one and a 4 KiB
one (MPI's own, on the fast path after the first step). Recorded with COLLECTIVES_TIMELINE,
merged, drawn and summarised:

    python benchmarks/timeline_demo.py --lab -o docs/images   # 2 lab hosts x 2 ranks (root)
    python benchmarks/timeline_demo.py --ranks 4 -o out       # MPI ranks on this host, rank 2 slow

``--lab`` needs what ``benchmarks/lab.py`` needs (root, network namespaces, MPICH's hydra).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def worker(args: argparse.Namespace) -> None:
    import numpy as np

    import collectives

    comm = collectives.init()
    slow = (socket.gethostname() == args.slow_host if args.slow_host
            else comm.rank == args.slow_rank)
    gradients = [np.ones(n, np.float32) for n in (1 << 18, 1 << 14, 1 << 10)]
    algorithms = ["ring", "auto", "auto"]
    for _ in range(args.steps):
        time.sleep(args.compute / 1e3 * (args.slower if slow else 1.0))
        for g, algorithm in zip(gradients, algorithms):
            comm.all_reduce(g, algorithm=algorithm)
    comm.barrier()


def run(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="timeline-"))
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLLECTIVES_TIMELINE": str(folder)}
    python = sys.executable
    me = [python, __file__, "--worker", "--steps", str(args.steps), "--compute",
          str(args.compute), "--slower", str(args.slower)]
    if args.lab:
        import lab

        with lab.Lab(2, rate=args.rate) as the_lab:
            slow = the_lab.hosts[1].name
            cmd, full = the_lab.mpiexec([*me, "--slow-host", slow], hosts=2, ranks_per_host=2,
                                        env=env)
            subprocess.run(cmd, env=full, check=True, timeout=300)
        where = f"2 lab hosts x 2 ranks, links at {args.rate}; {slow} (ranks 2, 3) computes " \
                f"{args.slower:g}x as long"
    else:
        beside = Path(python).parent / "mpiexec"
        mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec")
        subprocess.run([mpiexec, "-n", str(args.ranks), *me, "--slow-rank", "2"],
                       env={**os.environ, **env}, check=True, timeout=300)
        where = f"{args.ranks} MPI ranks on one host; rank 2 computes {args.slower:g}x as long"
    from collectives.timeline import plot, summary
    from collectives.timeline import trace_files as traces

    trace = traces.merge(folder)
    traces.write(trace, out / "timeline-trace.json")
    events = trace["traceEvents"]
    origin = min(s.start for s in traces.spans(events))
    steps = sorted(s.start for s in traces.spans(events) if s.pid == 0 and s.cat == "call"
                   and s.args.get("bytes") == 1 << 20)  # each step's first all-reduce, rank 0
    first = (steps[max(len(steps) - 3, 0)] - origin) / 1e3 - 2.0  # the last three steps
    plot.plot(events, out / "timeline.png", start_ms=first,
              title=f"all_reduce of 1 MiB (ring), 64 KiB and 4 KiB per step: {where}")
    text = summary.summarize(events)
    (out / "timeline-summary.txt").write_text(f"# {where}\n{text}\n")
    print(f"# {where}\n{text}\n\n{out / 'timeline.png'}")
    shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", action="store_true", help="2 lab hosts x 2 ranks (needs root)")
    parser.add_argument("--ranks", type=int, default=4, help="without --lab: MPI ranks here")
    parser.add_argument("--rate", default="1gbit", help="the lab's links (tc syntax)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--compute", type=float, default=5.0, help="ms of compute per step")
    parser.add_argument("--slower", type=float, default=3.0, help="the slow host's factor")
    parser.add_argument("-o", "--output", default="timeline-demo")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--slow-host")
    parser.add_argument("--slow-rank", type=int, default=2)
    args = parser.parse_args()
    if args.worker:
        worker(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
