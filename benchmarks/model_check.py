"""The cost model against the clock: predicted and measured all-reduce times, on the lab.

Run it as root; for each layout (hosts x ranks per host) and link rate it builds a lab
(``benchmarks/lab.py``: network namespaces, links shaped with tc) and launches one job that

1. calibrates on itself (``collectives.api.calibration.measure``: links per class, overheads,
   gamma, MPICH's all-reduce at the sweep's sizes), as ``init(calibrate=True)`` would;
2. times, per size, MPICH's ``Allreduce`` (mpi4py), the library's ``native``, every schedule
   (flat and two-level over the hosts) and ``auto`` (now model-driven), interleaved;
3. predicts each schedule's time with the calibrated model.

    python benchmarks/model_check.py [--layouts 2x2 3x1] [--rates 1gbit 2gbit 5gbit]
        [-s 4K 64K 1M 16M 64M] [-r 3] [--json out.json]
    python benchmarks/model_check.py --local 2 3   # one host, no lab: mpiexec -n 2, -n 3

It prints each cell's times (measured median / predicted), then the targets, against each
method's best repeat (the calibration keeps its best repeat too) and against its median:
the median error of the predictions (schedules only: MPICH's own times come from the
calibration), the share of cells whose predicted winner is measured within 10% of the
measured winner, and, on the cells where the model says a schedule beats MPICH's own,
whether auto was at least as fast as MPICH's ``Allreduce`` (medians). The machine is shared,
so expect noise and compare within one run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import lab  # noqa: E402
from mpi_compare import human, parse_size  # noqa: E402

FLAT = ("ring", "rechd", "tree", "shuffle", "one_device")
TWO_LEVEL = ("ring/ring", "rechd/ring", "ring/rechd", "shuffle/ring", "tree/tree")
ANCHOR = "mpi4py Allreduce"
TARGET = 0.05  # seconds per timed repeat, about


# --- worker (under mpiexec) -------------------------------------------------------------------

def _interleaved(calls: dict, repeats: int, world, MPI) -> dict:
    iters = {}
    for name, fn in calls.items():  # calls per repeat, the same on every rank
        world.Barrier()
        start = time.perf_counter()
        fn()
        once = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
        iters[name] = int(min(max(TARGET / max(once, 1e-6), 1), 200))
    names = list(calls)
    times: dict = {n: [] for n in names}
    for rep in range(repeats):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            world.Barrier()
            start = time.perf_counter()
            for _ in range(iters[name]):
                calls[name]()
            times[name].append(world.allreduce((time.perf_counter() - start) / iters[name],
                                               op=MPI.MAX))
    return times


def worker(sizes: list[int], repeats: int) -> dict:
    sys.path.insert(0, ROOT)
    from collectives.backends import mpi
    from mpi4py import MPI

    from collectives.algorithms.sampling import predict
    from collectives.algorithms.schedule import Collective
    from collectives.api import calibration

    world = MPI.COMM_WORLD
    p, rank = world.size, world.rank
    comm = mpi.init(timeout=600)
    started = time.perf_counter()
    fabric = calibration.measure(comm, sizes=tuple(sizes), repeats=5,
                                 collectives=("all_reduce",))
    comm.fabric = fabric
    calibrated = time.perf_counter() - started
    hosts = comm.placement.hosts
    methods = list(FLAT) + (list(TWO_LEVEL) if hosts is not None and hosts.uniform else [])
    result: dict = {"fabric": json.loads(fabric.to_json()), "calibration_seconds": calibrated,
                    "hosts": [list(g) for g in comm.transport.nodes], "cells": {}}
    for nbytes in sizes:
        x = np.full(nbytes // 4, rank + 1, np.float32)
        want = np.full(nbytes // 4, p * (p + 1) // 2, np.float32)
        out = np.empty_like(x)
        calls = {ANCHOR: lambda x=x, out=out: world.Allreduce(x, out)}
        for name in ["auto", "native", *methods]:
            calls[name] = lambda name=name, x=x, out=out: comm.all_reduce(x, "sum", name, out=out)
        ran = None
        for name, fn in calls.items():
            out.fill(0)
            comm.last_algorithm = None  # the hot path of repeated natives leaves it be
            fn()
            if name == "auto":
                ran = comm.last_algorithm or "native"
            if not world.allreduce(bool(np.array_equal(out, want)), op=MPI.LAND):
                raise AssertionError(f"{name} at {human(nbytes)} gave a wrong result")
        decision = comm.explain("all_reduce", x)
        times = _interleaved(calls, repeats, world, MPI)
        predicted = {}
        for name in methods:
            layout = hosts if "/" in name else None
            predicted[name] = predict(Collective.ALL_REDUCE, name, p, nbytes, fabric,
                                      comm.placement, layout=layout).seconds
        native = [q for q in decision.predictions if q.algorithm == "native"]
        if native:
            predicted["native"] = native[0].seconds
        result["cells"][str(nbytes)] = {
            "measured": {k: statistics.median(v) for k, v in times.items()},
            "best": {k: min(v) for k, v in times.items()},
            "times": times, "predicted": predicted, "auto_ran": ran,
            "auto_choice": decision.name, "explain": str(decision)}
        if rank == 0:
            cell = result["cells"][str(nbytes)]
            print(f"  {human(nbytes):>7} auto ran {ran}; " + ", ".join(
                f"{k} {cell['measured'][k] * 1e3:.2f}/{predicted.get(k, float('nan')) * 1e3:.2f}"
                for k in calls), flush=True)
    comm.free()
    return result


# --- driver -----------------------------------------------------------------------------------

def launch(cmd_env, sizes: list[str], repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        argv = [sys.executable, os.path.abspath(__file__), "--worker", "-s", *sizes, "-r",
                str(repeats), "--out", path]
        cmd, env = cmd_env(argv)
        proc = subprocess.run(cmd, env=env)
        if proc.returncode != 0 or not os.path.exists(path):
            raise SystemExit(f"the run failed: {' '.join(cmd)} -> {proc.returncode}")
        with open(path) as f:
            return json.load(f)


def _pick(cell: dict) -> str:
    """The model's winner: auto's decision (ties broken as auto breaks them)."""
    choice = cell.get("auto_choice")
    return choice if choice in cell["predicted"] else min(cell["predicted"],
                                                          key=cell["predicted"].get)


def score(runs: dict, statistic: str = "best") -> dict:
    """The targets over every cell of every run, against each method's ``"best"`` repeat
    (the calibration keeps its best too) or its ``"measured"`` median."""
    errors, winners, versus = [], [], []
    for label, run in runs.items():
        for size, cell in run["cells"].items():
            measured, predicted = cell[statistic], cell["predicted"]
            for name, guess in predicted.items():
                if name != "native":
                    errors.append(abs(guess - measured[name]) / measured[name])
            real_best = min(measured[k] for k in predicted)
            pick = _pick(cell)
            winners.append(measured[pick] <= 1.10 * real_best)
            if predicted.get("native") is not None and pick != "native":
                versus.append((label, size, cell["auto_ran"], measured["auto"], measured[ANCHOR],
                               measured["auto"] <= measured[ANCHOR]))
    return {"median_error": statistics.median(errors) if errors else None,
            "winner_within_10pct": sum(winners) / len(winners) if winners else None,
            "cells": len(winners), "auto_vs_mpich": versus}


def table(label: str, run: dict) -> str:
    sizes = list(run["cells"])
    names = [ANCHOR, "auto", "native"] + [k for k in run["cells"][sizes[0]]["predicted"]
                                          if k != "native"]
    lines = [f"### {label}", "", "| method | " + " | ".join(human(int(s)) for s in sizes) + " |",
             "|---" * (len(sizes) + 1) + "|"]
    for name in names:
        row = [name]
        for s in sizes:
            cell = run["cells"][s]
            m = cell["measured"][name]
            guess = cell["predicted"].get(name)
            text = _ms(m) + (f" / {_ms(guess)}" if guess is not None else "")
            if name == "auto":
                text += f" [{cell['auto_ran']}]"
            if name == _pick(cell):
                text += " *"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def summary(runs: dict) -> str:
    """One row per cell: the predicted winner and the measured one, what auto ran, MPICH."""
    lines = ["| layout, link | size | predicted winner | measured best | auto ran | MPICH's "
             "Allreduce | median error |", "|---|---|---|---|---|---|---|"]
    for label, run in runs.items():
        for size, cell in run["cells"].items():
            m, p = cell["measured"], cell["predicted"]
            pick = _pick(cell)
            best = min(p, key=m.get)
            errors = [abs(p[k] - m[k]) / m[k] for k in p if k != "native"]
            lines.append(f"| {label} | {human(int(size))} | {pick} {_ms(m[pick])} | {best} "
                         f"{_ms(m[best])} | {cell['auto_ran']} {_ms(m['auto'])} | "
                         f"{_ms(m[ANCHOR])} | {statistics.median(errors):.0%} |")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layouts", nargs="+", default=["2x2", "3x1"], help="HOSTSxPPN")
    parser.add_argument("--rates", nargs="+", default=["1gbit", "2gbit", "5gbit"])
    parser.add_argument("--local", type=int, nargs="+", help="rank counts on this host, no lab")
    parser.add_argument("-s", "--sizes", nargs="+", default=["4K", "64K", "1M", "16M", "64M"])
    parser.add_argument("-r", "--repeats", type=int, default=3)
    parser.add_argument("--netmod", default="ucx", choices=sorted(lab.NETWORK_ENV))
    parser.add_argument("--json")
    parser.add_argument("--from", dest="saved", metavar="JSON",
                        help="print the tables of a run saved with --json, running nothing")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    if args.worker:
        result = worker(sizes, args.repeats)
        if int(os.environ.get("PMI_RANK", "0")) == 0:
            with open(args.out, "w") as f:
                json.dump(result, f)
        return
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    runs = {}
    if args.saved:
        with open(args.saved) as f:
            runs = json.load(f)["runs"]
    elif args.local:
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        for p in args.local:
            print(f"## one host, {p} ranks", flush=True)
            runs[f"one host, {p} ranks"] = launch(
                lambda argv, p=p: ([mpiexec, "-n", str(p), *argv], {**os.environ, **env}),
                args.sizes, args.repeats)
    else:
        reason = lab.available()
        if reason:
            raise SystemExit(reason)
        for layout in args.layouts:
            hosts, ppn = (int(v) for v in layout.lower().split("x"))
            for rate in args.rates:
                label = f"{hosts} hosts x {ppn}, {rate}"
                print(f"## {label}", flush=True)
                with lab.Lab(hosts, rate=rate) as the_lab:
                    runs[label] = launch(lambda argv, the_lab=the_lab, ppn=ppn: the_lab.mpiexec(
                        argv, ranks_per_host=ppn, netmod=args.netmod, env=env),
                        args.sizes, args.repeats)
    print("\nCells: measured / predicted (median per all-reduce, float32); * the predicted "
          "winner; native's prediction is its calibration's own timing\n")
    for label, run in runs.items():
        print(table(label, run) + "\n")
    print(summary(runs) + "\n")
    for statistic, what in (("best", "best repeat"), ("measured", "median")):
        result = score(runs, statistic)
        print(f"against each method's {what}: median prediction error (schedules) "
              f"{result['median_error']:.1%}; predicted winner measured within 10% of the "
              f"real winner in {result['winner_within_10pct']:.0%} of {result['cells']} cells")
    result = score(runs, "measured")
    for label, size, ran, auto, anchor, ok in result["auto_vs_mpich"]:
        print(f"  model says a schedule beats MPICH: {label} {human(int(size))}: auto [{ran}] "
              f"{_ms(auto)} vs MPICH {_ms(anchor)}: {'ok' if ok else 'SLOWER'}")
    if args.json and not args.saved:
        with open(args.json, "w") as f:
            json.dump({"when": datetime.datetime.now().isoformat(timespec="seconds"),
                       "command": " ".join(sys.argv), "runs": runs,
                       "score": {k: score(runs, k) for k in ("best", "measured")}}, f,
                      indent=1)


if __name__ == "__main__":
    main()
