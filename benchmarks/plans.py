"""Plan time: how long one rank takes to build its plan of an all-reduce, cold.

For each case (algorithm, participant count, group size for two-level names), the plan of a
few sample ranks (the first, one past the middle, the last) is built with every plan cache
cleared first (``algorithms._plan``, ``base.cached_ownership``, ``two_level._shape_inside``),
``-r`` times each; a cell is the slowest sampled rank's median. Beside it: the same plan plus
its first conversion to element offsets for a 4 KiB float32 buffer (what a rank's first call
also pays), a cached lookup (what every later call pays), and the plan's size (rounds the rank
takes part in, steps it receives, messages it sends).

``--old COMMIT`` also times the global schedule that every rank built before per-rank plans
(``algorithms.build`` at that commit, exported with ``git archive`` into a temporary directory
and imported in a subprocess; its ``_build`` cache cleared before each build) at the sizes
given by ``--old-cases``.

    python benchmarks/plans.py [-r 5] [--old 40e67c5] [--json plans.json]

Cases are written ``name:size`` or ``name:size:group`` (two-level names: groups of ``group``
consecutive participants), e.g. ``ring/ring:4096:8``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial

TARGETS = ("ring:4096", "rechd:4096", "tree:4096", "shuffle:4096", "ring/ring:4096:8",
           "rechd:65536", "tree:65536", "ring:65536", "shuffle:65536")
LIMIT_MS = {4096: 10.0, 65536: 100.0}  # the targets: rechd and tree only at 65,536
TARGETED = {"ring:4096", "rechd:4096", "tree:4096", "shuffle:4096", "ring/ring:4096:8",
            "rechd:65536", "tree:65536"}
OLD_CASES = ("ring:256", "ring:512", "rechd:512", "rechd:4096", "tree:512", "tree:4096",
             "shuffle:256", "shuffle:512", "ring/ring:256:8", "ring/ring:512:8")
UNITS = 1024  # 4 KiB of float32


def parse_case(text: str) -> tuple[str, int, int]:
    parts = text.split(":")
    name, size = parts[0], int(parts[1])
    group = int(parts[2]) if len(parts) > 2 else 0
    return name, size, group


def groups_of(size: int, group: int) -> list[range] | None:
    return [range(i, i + group) for i in range(0, size, group)] if group else None


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


LOOKUPS = 10000


def _lookups(name: str, size: int, rank: int, layout) -> None:
    from collectives import algorithms
    from collectives.algorithms.schedule import Collective

    for _ in range(LOOKUPS):
        algorithms.rank_plan(Collective.ALL_REDUCE, name, size, rank, layout=layout)


def measure_new(cases: list[str], repeats: int) -> list[dict]:
    from collectives import algorithms
    from collectives.algorithms import base, two_level
    from collectives.algorithms.base import Layout
    from collectives.algorithms.schedule import Collective

    def clear() -> None:
        algorithms._plan.cache_clear()
        base.cached_ownership.cache_clear()
        two_level._shape_inside.cache_clear()

    def cold_plan(name: str, size: int, rank: int, layout):
        clear()
        return algorithms.rank_plan(Collective.ALL_REDUCE, name, size, rank, layout=layout)

    rows = []
    for case in cases:
        name, size, group = parse_case(case)
        start = time.perf_counter()
        layout = Layout(groups_of(size, group)) if group else None
        layout_ms = (time.perf_counter() - start) * 1e3
        ranks = sorted({0, size // 2 + 1 if size > 2 else 0, size - 1})
        per_rank = {}
        for rank in ranks:
            args = (name, size, rank, layout)
            cold = _median_ms(partial(cold_plan, *args), repeats)
            first_call = _median_ms(lambda args=args: cold_plan(*args).offsets(UNITS), repeats)
            p = cold_plan(*args)
            cached_us = _median_ms(partial(_lookups, *args), repeats) / LOOKUPS * 1e3
            per_rank[rank] = {
                "cold_ms": cold, "with_offsets_ms": first_call, "cached_us": cached_us,
                "rounds": len(p.rounds), "num_rounds": p.num_rounds,
                "steps": sum(len(r[2]) for r in p.rounds),
                "sends": sum(len(r[1]) for r in p.rounds)}
        slowest = max(per_rank, key=lambda r: per_rank[r]["cold_ms"])
        rows.append({"case": case, "name": name, "size": size, "group": group,
                     "layout_ms": layout_ms if group else None, "ranks": per_rank,
                     "slowest_rank": slowest, **per_rank[slowest]})
        print(f"# {case}: {per_rank[slowest]['cold_ms']:.3f} ms (rank {slowest})",
              file=sys.stderr)
    clear()
    return rows


def measure_old(cases: list[str], repeats: int) -> list[dict]:
    """Runs in the subprocess whose ``collectives`` is the old tree."""
    import collectives
    from collectives import algorithms
    from collectives.algorithms.schedule import Collective

    print(f"# old tree: {collectives.__file__}", file=sys.stderr)
    rows = []
    for case in cases:
        name, size, group = parse_case(case)
        groups = groups_of(size, group)

        def build(name=name, size=size, groups=groups):
            algorithms._build.cache_clear()
            return algorithms.build(Collective.ALL_REDUCE, name, size, groups=groups)

        ms = _median_ms(build, repeats)
        schedule = build()
        steps = sum(len(r) for r in schedule.rounds)
        rows.append({"case": case, "global_ms": ms, "rounds": len(schedule.rounds),
                     "steps": steps})
        print(f"# old {case}: {ms:.1f} ms, {steps} steps", file=sys.stderr)
    return rows


def run_old(commit: str, cases: list[str], repeats: int) -> list[dict]:
    """``measure_old`` in a subprocess over ``git archive COMMIT collectives``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", root, "archive", commit, "collectives"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        out = os.path.join(tmp, "old.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--as-old", tmp, "--old-cases",
               *cases, "-r", str(repeats), "--json", out]
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": tmp}, cwd=tmp)
        with open(out) as f:
            return json.load(f)


def markdown(new: list[dict], old: list[dict], meta: dict) -> str:
    lines = [
        "| case | rounds (of) | steps / sends | cold plan ms | + offsets ms | cached µs | "
        "target | |",
        "|:---|---:|---:|---:|---:|---:|---:|:---|"]
    for r in new:
        limit = LIMIT_MS.get(r["size"]) if r["case"] in TARGETED else None
        verdict = "" if limit is None else ("met" if r["cold_ms"] < limit else "**missed**")
        lines.append(
            f"| {r['case']} | {r['rounds']} ({r['num_rounds']}) | {r['steps']} / {r['sends']} | "
            f"{r['cold_ms']:.3f} | {r['with_offsets_ms']:.3f} | {r['cached_us']:.2f} | "
            f"{'' if limit is None else f'< {limit:.0f} ms'} | {verdict} |")
    layouts = [r for r in new if r["layout_ms"] is not None]
    for r in layouts:
        lines.append(f"\n{r['case']}: building the `Layout` of {r['size'] // r['group']} groups "
                     f"takes {r['layout_ms']:.2f} ms (once per communicator, not per plan).")
    if old:
        by_case = {r["case"]: r for r in new}
        lines += ["", "| case | old global schedule ms (steps) | new one rank's plan ms | "
                  "old / new |", "|:---|---:|---:|---:|"]
        for o in old:
            n = by_case.get(o["case"])
            ratio = f"{o['global_ms'] / n['cold_ms']:.0f}×" if n else "n/a"
            cell = f"{n['cold_ms']:.3f}" if n else "n/a"
            lines.append(f"| {o['case']} | {o['global_ms']:.1f} ({o['steps']}) | {cell} | "
                         f"{ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=list(TARGETS))
    parser.add_argument("-r", "--repeats", type=int, default=5)
    parser.add_argument("--old", metavar="COMMIT", help="also time that commit's global schedule")
    parser.add_argument("--old-cases", nargs="+", default=list(OLD_CASES))
    parser.add_argument("--as-old", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.as_old:
        sys.path.insert(0, args.as_old)
        rows = measure_old(args.old_cases, args.repeats)
        with open(args.json, "w") as f:
            json.dump(rows, f)
        return 0
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "benchmarks/plans.py", *argv])
    load_before = os.getloadavg()
    cases = list(dict.fromkeys(args.cases + ([c for c in args.old_cases if c not in args.cases]
                                             if args.old else [])))
    new = measure_new(cases, args.repeats)
    old = run_old(args.old, args.old_cases, max(1, args.repeats // 2)) if args.old else []
    load_after = os.getloadavg()
    from collectives.tools import bench

    meta = bench.metadata(command)
    meta["load"] = {"before": load_before, "after": load_after}
    print(f"Command: `{command}`; load average (1/5/15 min) before "
          f"{'/'.join(f'{x:.2f}' for x in load_before)}, after "
          f"{'/'.join(f'{x:.2f}' for x in load_after)}.\n")
    print(markdown(new, old, meta))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**meta, "new": new, "old": old}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
