"""Per-call costs of the multi-device API that do not move data, and the result pool.

Two measurements, each a median over ``-r`` interleaved repeats:

* **Bookkeeping of a small call.** ``collectives.all_reduce(values, "sum", algorithm,
  out=outs)`` on 4 KiB float32 per device, beside the two pieces of it that do not touch the
  data and are recomputed on every call: the check that no output aliases an input
  (``overlap.unsafe_outputs``, which reads every array's extent) and the schedule's conversion
  to element offsets (``execute.steps.element_steps``, over every participant's steps).
* **Results the caller keeps.** ``all_reduce`` without ``out=`` in a loop that keeps the
  previous call's results until the next call returns (``held = all_reduce(...)``), beside
  one that drops them first and one that passes ``out=``; with the minor page faults per call
  (``getrusage``), which show results that the pool could not serve from mapped memory.

    python benchmarks/hotspots.py [-r 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import sys
import time
import timeit
from functools import partial

import numpy as np

import collectives
from collectives import algorithms
from collectives.algorithms.schedule import Collective
from collectives.arrays import NUMPY
from collectives.overlap import unsafe_outputs
from collectives.runtime.execute.steps import element_steps


def per_call_us(fn, seconds: float = 0.02) -> float:
    number = max(1, int(seconds / max(timeit.timeit(fn, number=3) / 3, 1e-7)))
    return timeit.timeit(fn, number=number) / number * 1e6


def interleaved(methods: dict, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(methods[name]())
    return {name: statistics.median(t) for name, t in times.items()}


def bookkeeping(repeats: int) -> list[str]:
    lines = ["| algorithm | p | steps | all_reduce µs | aliasing check µs | element offsets µs |",
             "|:---|---:|---:|---:|---:|---:|"]
    for name in ("auto", "ring"):
        for p in (4, 8, 16):
            values = [np.ones(1024, np.float32) for _ in range(p)]
            outs = [np.empty(1024, np.float32) for _ in range(p)]
            collectives.all_reduce(values, "sum", name, out=outs)
            ran = name if name != "auto" else "one_device"
            schedule = algorithms.schedule(Collective.ALL_REDUCE, ran, p)
            medians = interleaved({
                "call": lambda v=values, o=outs, a=name: per_call_us(
                    lambda: collectives.all_reduce(v, "sum", a, out=o)),
                "alias": lambda v=values, o=outs: per_call_us(lambda: unsafe_outputs(NUMPY, v, o)),
                "offsets": lambda s=schedule: per_call_us(lambda: element_steps(s, 1024, 1)),
            }, repeats)
            steps = sum(len(r) for r in schedule.rounds)
            lines.append(f"| {name} ({ran}) | {p} | {steps} | {medians['call']:.1f} | "
                         f"{medians['alias']:.1f} | {medians['offsets']:.1f} |")
    return lines


def kept_row(mb: int, p: int, repeats: int) -> str:
    values = [np.ones(mb << 18, np.float32) for _ in range(p)]
    outs = [np.empty(mb << 18, np.float32) for _ in range(p)]
    held: list = [None]
    calls = {"out": lambda: collectives.all_reduce(values, "sum", "auto", out=outs),
             "dropped": lambda: collectives.all_reduce(values, "sum", "auto"),
             "kept": lambda: held.__setitem__(0, collectives.all_reduce(values, "sum", "auto"))}
    faults: dict[str, list[float]] = {name: [] for name in calls}

    def timed(name: str, k: int = max(3, 64 // mb)) -> float:
        calls[name]()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        for _ in range(k):
            calls[name]()
        elapsed = (time.perf_counter() - start) / k * 1e6
        faults[name].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / k)
        return elapsed

    medians = interleaved({name: partial(timed, name) for name in calls}, repeats)
    return (f"| {mb} MiB | {medians['out']:.0f} | {medians['dropped']:.0f} | "
            f"{medians['kept']:.0f} | "
            + ", ".join(f"{statistics.median(faults[n]):.0f}" for n in calls) + " |")


def kept_results(repeats: int, p: int = 4) -> list[str]:
    return ["| size / device | `out=` µs | dropped µs | kept µs | faults / call: out=, dropped, "
            "kept |", "|---:|---:|---:|---:|:---|", *(kept_row(mb, p, repeats) for mb in (1, 16))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-r", "--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    load = os.getloadavg()
    lines = bookkeeping(args.repeats)
    lines += ["", *kept_results(args.repeats)]
    after = os.getloadavg()
    print(f"Command: `{shlex.join(['python', 'benchmarks/hotspots.py', *argv])}`; load average "
          f"{load[0]:.2f} before, {after[0]:.2f} after.\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
