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

Every method of a cell is timed in the same interleaved repeats (at least ``-r``, 7 by default;
a cell whose verdict the noise leaves open gets ``--more`` repeats at a time, up to
``--max-repeats``). Per cell, a paired bootstrap over the repeats (``model_stats.py``) gives
an interval for the ratio of the model's pick's median to the least median among the
library's methods, and one for the prediction error (the median over the schedules of
``|predicted / measured median - 1|``). A cell counts as "picked within 10%" or "missed"
only where its interval resolves 10%, and its error as within or beyond 20% only where that
interval resolves 20%; the summary says how many cells were resolved (at least 60% should
be: else add repeats). It also says whether the calibration flagged its probes (checks the
schedules timed beside them contradicted). The machine is shared, so expect noise: that is
what the intervals are for.
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
import model_stats  # noqa: E402
from mpi_compare import human, parse_size  # noqa: E402

FLAT = ("ring", "rechd", "tree", "shuffle", "one_device")
TWO_LEVEL = ("ring/ring", "rechd/ring", "ring/rechd", "shuffle/ring", "tree/tree")
ANCHOR = "mpi4py Allreduce"
TARGET = 0.05  # seconds per timed repeat, about


# --- worker (under mpiexec) -------------------------------------------------------------------

def _iters(calls: dict, world, MPI) -> dict:
    """Calls per repeat, the same on every rank: about ``TARGET`` seconds."""
    iters = {}
    for name, fn in calls.items():
        world.Barrier()
        start = time.perf_counter()
        fn()
        once = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
        iters[name] = int(min(max(TARGET / max(once, 1e-6), 1), 200))
    return iters


def _interleaved(calls: dict, repeats: int, world, MPI, iters: dict, times: dict) -> None:
    """``repeats`` more repeats of every method into ``times``, each repeat every method
    once, the order rotating."""
    names = list(calls)
    for _ in range(repeats):
        k = len(times[names[0]]) % len(names)
        for name in names[k:] + names[:k]:
            world.Barrier()
            start = time.perf_counter()
            for _ in range(iters[name]):
                calls[name]()
            times[name].append(world.allreduce((time.perf_counter() - start) / iters[name],
                                               op=MPI.MAX))


def worker(sizes: list[int], repeats: int, more: int, most: int) -> dict:
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
    if rank == 0:
        for flag in fabric.flags:
            print(f"  calibration flagged: {flag}", flush=True)
    result: dict = {"fabric": json.loads(fabric.to_json()), "calibration_seconds": calibrated,
                    "hosts": [list(g) for g in comm.transport.nodes], "cells": {}}
    for nbytes in sizes:
        x = np.full(nbytes // 4, rank + 1, np.float32)
        want = np.full(nbytes // 4, p * (p + 1) // 2, np.float32)
        out = np.empty_like(x)
        calls = {ANCHOR: lambda x=x, out=out: world.Allreduce(x, out)}
        decision = comm.explain("all_reduce", x)
        own = [q.algorithm for q in decision.predictions
               if q.note == "measured" and q.algorithm != "native"]  # MPI's shm, where timed
        for name in ["auto", "native", *own, *methods]:
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
        times: dict = {name: [] for name in calls}
        iters = _iters(calls, world, MPI)
        _interleaved(calls, repeats, world, MPI, iters, times)
        predicted = {}
        for name in methods:
            layout = hosts if "/" in name else None
            predicted[name] = predict(Collective.ALL_REDUCE, name, p, nbytes, fabric,
                                      comm.placement, layout=layout).seconds
        for q in decision.predictions:
            if q.algorithm == "native" or q.algorithm in own:
                predicted[q.algorithm] = q.seconds
        pick = _pick({"auto_choice": decision.name, "predicted": predicted})
        while True:  # more repeats while the noise leaves the cell open
            open_ = model_stats.judge(times, predicted, pick)["picked"] == "unresolved"
            if not world.bcast(open_ and len(times[pick]) < most, root=0):
                break
            _interleaved(calls, more, world, MPI, iters, times)
        judged = model_stats.judge(times, predicted, pick)
        result["cells"][str(nbytes)] = {"judged": judged, "pick": pick,
            "measured": {k: statistics.median(v) for k, v in times.items()},
            "best": {k: min(v) for k, v in times.items()},
            "times": times, "predicted": predicted, "auto_ran": ran,
            "auto_choice": decision.name, "explain": str(decision)}
        if rank == 0:
            cell = result["cells"][str(nbytes)]
            print(f"  {human(nbytes):>7} auto ran {ran}; {len(times[pick])} repeats; " + ", ".join(
                f"{k} {cell['measured'][k] * 1e3:.2f}/{predicted.get(k, float('nan')) * 1e3:.2f}"
                for k in calls), flush=True)
    comm.free()
    return result


# --- driver -----------------------------------------------------------------------------------

def launch(cmd_env, sizes: list[str], repeats: list[int]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        argv = [sys.executable, os.path.abspath(__file__), "--worker", "-s", *sizes, "-r",
                str(repeats[0]), "--more", str(repeats[1]), "--max-repeats", str(repeats[2]),
                "--out", path]
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


def cells(runs: dict) -> list[dict]:
    """Every cell's verdicts (``model_stats.judge``), with its run and size."""
    out = []
    for label, run in runs.items():
        for size, cell in run["cells"].items():
            judged = cell.get("judged") or model_stats.judge(cell["times"], cell["predicted"],
                                                             _pick(cell))
            judged = {**judged, **model_stats.versus_native(cell["times"], _pick(cell))}
            out.append({**judged, "label": label, "nbytes": int(size), "pick": _pick(cell),
                        "auto_ran": cell["auto_ran"], "measured": cell["measured"]})
    return out


def table(label: str, run: dict) -> str:
    sizes = list(run["cells"])
    names = [ANCHOR, "auto"] + [k for k in run["cells"][sizes[0]]["measured"]
                                if k not in (ANCHOR, "auto")]
    lines = [f"### {label}", "", "| method | " + " | ".join(human(int(s)) for s in sizes) + " |",
             "|---" * (len(sizes) + 1) + "|"]
    for name in names:
        row = [name]
        for s in sizes:
            cell = run["cells"][s]
            m = cell["measured"].get(name)
            guess = cell["predicted"].get(name)
            text = "" if m is None else _ms(m) + (f" / {_ms(guess)}" if guess is not None else "")
            if name == "auto":
                text += f" [{cell['auto_ran']}]"
            if name == _pick(cell):
                text += " *"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def summary(judged: list[dict]) -> str:
    """One row per cell: the pick and the measured best, the pick's ratio and the error with
    their intervals and verdicts."""
    lines = ["| run | size | repeats | model's pick | measured best | pick / best (90% "
             "interval) | within 10%? | pick / native (interval) | prediction error "
             "(interval) | within 20%? |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in judged:
        lo, hi = c["ratio_interval"]
        err = (f"{c['error']:.0%} ({c['error_interval'][0]:.0%}-{c['error_interval'][1]:.0%}) | "
               f"{c['error_verdict']}") if "error" in c else "- | -"
        m = c["measured"]
        native = (f"{c['native_ratio']:.2f} ({c['native_interval'][0]:.2f}-"
                  f"{c['native_interval'][1]:.2f})" if "native_ratio" in c else "-")
        lines.append(f"| {c['label']} | {human(c['nbytes'])} | {c['repeats']} | {c['pick']} "
                     f"{_ms(m[c['pick']])} | {c['best']} {_ms(m[c['best']])} | "
                     f"{c['ratio']:.2f} ({lo:.2f}-{hi:.2f}) | {c['picked']} | {native} | {err} |")
    return "\n".join(lines)


def headline(judged: list[dict]) -> str:
    t = model_stats.summarize(judged)
    n, r = t["cells"], t["resolved"]
    out = [f"resolved cells: {r} of {n} ({r / max(n, 1):.0%}); of those, the model's pick "
           f"measured within 10% of the best in {t['within']}, missed in {t['missed']}"]
    if t["native_cells"]:
        out.append(f"against native (the transport's own, timed in every cell): the pick more "
                   f"than 10% slower in {t['native_slower']} of {t['native_cells']} cells, not "
                   f"in {t['native_within']}, unresolved in "
                   f"{t['native_cells'] - t['native_slower'] - t['native_within']}")
    if r < 0.6 * n:
        out.append("fewer than 60% of the cells resolved: add repeats (-r, --max-repeats)")
    for part, words in (("large", "from 1 MiB up"), ("small", "below 1 MiB")):
        e = t[part]
        if e["cells"]:
            resolved = (f"{e['median_error_resolved']:.0%}" if e["median_error_resolved"]
                        is not None else "-")
            out.append(f"median prediction error (schedules) {words}: {e['median_error']:.0%} "
                       f"over {e['cells']} cells; {e['resolved']} resolved at 20% "
                       f"({e['within_mark']} within, median {resolved})")
    return "\n".join(out)


def contradiction(label: str, run: dict) -> str:
    """Whether the schedules timed after the calibration contradict it: per size, the median
    over the cell's schedules of measured median / predicted; more than 2x off at a size
    contradicts."""
    ratios = {int(size): statistics.median(
        cell["measured"][k] / v for k, v in cell["predicted"].items()
        if not model_stats.measured_native(k))
        for size, cell in run["cells"].items()}
    overall = statistics.median(ratios.values())
    worst = max(max(r, 1 / r) for r in ratios.values())
    words = (f"the schedules contradict the calibration (up to {worst:.1f}x off)"
             if worst > 2 else "within 2x at every size")
    return (f"{label}: schedules measured / predicted, median {overall:.2f} ("
            + ", ".join(f"{human(b)} {r:.2f}" for b, r in ratios.items()) + f"): {words}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layouts", nargs="+", default=["2x2", "3x1"], help="HOSTSxPPN")
    parser.add_argument("--rates", nargs="+", default=["1gbit", "2gbit", "5gbit"])
    parser.add_argument("--local", type=int, nargs="+", help="rank counts on this host, no lab")
    parser.add_argument("-s", "--sizes", nargs="+", default=["4K", "64K", "1M", "16M", "64M"])
    parser.add_argument("-r", "--repeats", type=int, default=7,
                        help="interleaved repeats of every method in every cell; default 7")
    parser.add_argument("--more", type=int, default=4,
                        help="repeats added at a time to a cell the noise leaves open")
    parser.add_argument("--max-repeats", type=int, default=19)
    parser.add_argument("--netmod", default="ucx", choices=sorted(lab.NETWORK_ENV))
    parser.add_argument("--json")
    parser.add_argument("--from", dest="saved", metavar="JSON",
                        help="print the tables of a run saved with --json, running nothing")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    repeats = [args.repeats, args.more, max(args.max_repeats, args.repeats)]
    if args.worker:
        result = worker(sizes, *repeats)
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
                args.sizes, repeats)
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
                        args.sizes, repeats)
    print("\nCells: measured median / predicted (per all-reduce, float32); * the model's pick; "
          "native's and shm's predictions are their calibration's own timings\n")
    for label, run in runs.items():
        print(table(label, run) + "\n")
        for flag in run["fabric"].get("flags", ()):
            print(f"calibration flagged ({label}): {flag}\n")
        print(contradiction(label, run) + "\n")
    judged = cells(runs)
    print(summary(judged) + "\n")
    print(headline(judged))
    for c in judged:
        if c["pick"] != "native" and "native" in c["measured"]:
            auto, anchor = c["measured"]["auto"], c["measured"][ANCHOR]
            print(f"  {c['label']} {human(c['nbytes'])}: auto [{c['auto_ran']}] {_ms(auto)} vs "
                  f"MPICH's Allreduce {_ms(anchor)}: {'ok' if auto <= 1.1 * anchor else 'SLOWER'}")
    if args.json and not args.saved:
        with open(args.json, "w") as f:
            json.dump({"when": datetime.datetime.now().isoformat(timespec="seconds"),
                       "command": " ".join(sys.argv), "runs": runs,
                       "summary": model_stats.summarize(judged)}, f, indent=1)


if __name__ == "__main__":
    main()
