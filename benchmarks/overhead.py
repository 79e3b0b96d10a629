"""Per-call overhead of a 4 KiB SPMD all-reduce: what one rank's call costs at 2 and 64 ranks.

Two measurements, both after warm-up calls (plans cached, the call's signature agreed):

* **core alone**: one rank's ``Communicator.all_reduce`` over a *mirror* transport, in one
  thread: every receive is complete the moment it is posted and holds this rank's own data,
  every send completes at once. Nothing waits and no peer runs, so the time per call is the
  core's own work (communicator entry, call lookup, operation, engine, the plan's rounds in the
  SPMD executor, the result), for the plan of rank ``r`` of ``p``, in thread CPU time.
  Fitting these times against the rounds the rank takes part in splits them into a fixed
  part and a part per round.
* **thread ranks**: ``collectives.run(fn, p)``, every rank calling the same all-reduce; the
  probe rank's thread CPU time per call (``time.thread_time``: running, not waiting), its wall
  time, how often it went to sleep (``transport.idle``) and polled (``SpmdRun.advance``),
  and the CPU time spent inside those sleeps (a clock read on either side of each, about
  2 µs per sleep, which the CPU time per call also includes).
  CPU time minus the core alone is what the thread transport and the waiting loop add.

A third table: the functions whose calls per all-reduce differ between 2 and 64 thread ranks
(a profile of the probe rank: counts, which noise cannot move). A fourth: the cost of
re-deriving a plan's element offsets when one plan serves more
buffer lengths than ``RankPlan.offsets`` keeps (8), in the mirror setting.

Each cell is the median over ``-r`` repeats of a per-repeat median; repeats interleave the
configurations in rotated order.

    python benchmarks/overhead.py [-r 3] [--json overhead.json]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from collectives.backends.local.threads import ThreadTransport  # noqa: E402
from mirror import MirrorTransport  # noqa: E402

import collectives  # noqa: E402
from collectives import algorithms  # noqa: E402
from collectives.algorithms.schedule import Collective  # noqa: E402
from collectives.api.communicator import Communicator  # noqa: E402
from collectives.runtime.execute.spmd import SpmdRun  # noqa: E402
from collectives.tools import bench  # noqa: E402

COUNT = 1024  # float32: 4 KiB
ISOLATED = [(a, r, p) for p in (2, 64) for a, r in (("auto", -1), ("auto", 0), ("one_device", -1),
                                                     ("rechd", 0), ("ring", 0), ("shuffle", 0))]
ISOLATED += [("auto", -1, 4096), ("auto", 0, 4096), ("rechd", 0, 4096)]
THREADED = [(a, r, p) for p in (2, 64) for a, r in (("auto", -1), ("auto", 0), ("rechd", 0),
                                                     ("ring", 0))]
LENGTHS = [("ring", 64), ("rechd", 64), ("tree", 64)]


def plan_shape(name: str, p: int, rank: int) -> tuple[int, int]:
    """(rounds the rank takes part in, messages it sends and receives)."""
    plan = algorithms.rank_plan(Collective.ALL_REDUCE, name, p, rank)
    messages = sum(len(s) + sum(len(step[1]) for step in r) for _, s, r in plan.rounds)
    return len(plan.rounds), messages


def isolated(alg: str, rank: int, p: int, calls: int, lengths: int = 1) -> dict:
    comm = Communicator(MirrorTransport(rank, p))
    xs = [np.zeros(COUNT + i, np.float32) for i in range(lengths)]
    for x in xs * 3 + xs[:1] * 20:
        comm.all_reduce(x, "sum", alg)
    start = time.thread_time()  # CPU time: other processes' turns on the cores do not count
    for i in range(calls):
        comm.all_reduce(xs[i % lengths], "sum", alg)
    us = (time.thread_time() - start) / calls * 1e6
    rounds, messages = plan_shape(comm.last_algorithm, p, rank)
    return {"us": us, "ran": comm.last_algorithm, "rounds": rounds, "messages": messages}


# --- thread ranks ---------------------------------------------------------------------------

class Counters:
    """The probe thread's sleeps and polls (counted), and the thread CPU time it spends inside
    sleeps (``ThreadTransport.idle``, a clock read on either side of each)."""

    def __init__(self) -> None:
        self.ident = None
        self.idle = self.advance = 0
        self.idle_cpu = 0.0
        self._patched = [(ThreadTransport, "idle"), (SpmdRun, "advance")]
        self._originals = [getattr(c, a) for c, a in self._patched]
        ThreadTransport.idle = self._timed(self._originals[0])
        SpmdRun.advance = self._counting(self._originals[1])

    def reset(self, ident) -> None:
        self.ident, self.idle, self.advance, self.idle_cpu = ident, 0, 0, 0.0

    def _timed(self, original):
        def idle(obj, *args):
            if threading.get_ident() != self.ident:
                return original(obj, *args)
            self.idle += 1
            start = time.thread_time()
            try:
                return original(obj, *args)
            finally:
                self.idle_cpu += time.thread_time() - start
        return idle

    def _counting(self, original):
        def advance(obj, *args):
            if threading.get_ident() == self.ident:
                self.advance += 1
            return original(obj, *args)
        return advance

    def close(self) -> None:
        for (cls, attr), original in zip(self._patched, self._originals):
            setattr(cls, attr, original)


WARMUP_CALLS = 20  # before a thread-rank cell is measured: plans cached, signature agreed


def threaded(alg: str, probe: int, p: int, calls: int, counters: Counters,
             warmup: int = WARMUP_CALLS) -> dict:
    def body(comm):
        x = np.zeros(COUNT, np.float32)
        for _ in range(warmup):
            comm.all_reduce(x, "sum", alg)
        mine = comm.rank == probe
        cpu, wall = [], []
        if mine:
            counters.reset(threading.get_ident())
        for _ in range(calls):
            c0, w0 = time.thread_time(), time.perf_counter()
            comm.all_reduce(x, "sum", alg)
            cpu.append(time.thread_time() - c0)
            wall.append(time.perf_counter() - w0)
        if mine:
            counters.ident = None
            return {"cpu_us": statistics.median(cpu) * 1e6,
                    "wall_us": statistics.median(wall) * 1e6, "ran": comm.last_algorithm,
                    "sleeps": counters.idle / calls, "polls": counters.advance / calls,
                    "sleep_cpu_us": counters.idle_cpu / calls * 1e6}
        return None

    row = collectives.run(body, p, timeout=600)[probe]
    row["rounds"], row["messages"] = plan_shape(row["ran"], p, probe)
    return row


def call_counts(alg: str, probe: int, p: int, calls: int,
                warmup: int = WARMUP_CALLS) -> dict[str, float]:
    """Calls per all-reduce of every function the probe rank runs (cProfile; counts only)."""
    import cProfile
    import pstats

    def body(comm):
        x = np.zeros(COUNT, np.float32)
        for _ in range(warmup):
            comm.all_reduce(x, "sum", alg)
        profile = cProfile.Profile() if comm.rank == probe else None
        if profile is not None:
            profile.enable()
        for _ in range(calls):
            comm.all_reduce(x, "sum", alg)
        if profile is None:
            return None
        profile.disable()
        return {f"{os.path.basename(file)}:{line} {name}": v[1] / calls
                for (file, line, name), v in pstats.Stats(profile).stats.items()}

    return collectives.run(body, p, timeout=600)[probe]


# --- the run ----------------------------------------------------------------------------------

def interleaved(configs, measure, repeats: int) -> dict:
    """config -> list of per-repeat results, configurations rotated from repeat to repeat."""
    out: dict = {c: [] for c in configs}
    measure(configs[0])  # warm-up: imports, first allocations
    for rep in range(repeats):
        shift = rep % len(configs)
        for config in configs[shift:] + configs[:shift]:
            out[config].append(measure(config))
            print(f"# {config}: {out[config][-1]}", file=sys.stderr)
    return out


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``us = fixed + per_round * rounds``."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = (sum((x - mx) * (y - my) for x, y in points)
             / sum((x - mx) ** 2 for x in xs))
    return my - slope * mx, slope


def counts_table(counts: dict[int, dict[str, float]]) -> list[str]:
    """The functions whose calls per all-reduce differ between the participant counts."""
    ps = sorted(counts)
    names = sorted(set().union(*counts.values()))
    lines = ["", f"Calls per all-reduce that differ between {' and '.join(map(str, ps))} thread "
             "ranks (auto, the last rank; every other function of the call runs equally often):",
             "", "| function | " + " | ".join(f"p = {p}" for p in ps) + " |",
             "|:---|" + "---:|" * len(ps)]
    for name in names:
        row = [counts[p].get(name, 0.0) for p in ps]
        if max(row) - min(row) > 0.05:
            lines.append(f"| `{name}` | " + " | ".join(f"{c:.2f}" for c in row) + " |")
    return lines


def markdown(iso: dict, thr: dict, lengths: dict, counts: list[str]) -> str:
    lines = ["Core alone (mirror transport, one thread), µs per call:", "",
             "| algorithm (ran) | p | rank | rounds | messages | µs / call |",
             "|:---|---:|---:|---:|---:|---:|"]
    core = {}
    for (alg, rank, p), rows in iso.items():
        r = rows[0]
        core[(alg, rank % p, p)] = us = med(rows, "us")
        lines.append(f"| {alg} ({r['ran']}) | {p} | {rank % p} | {r['rounds']} | "
                     f"{r['messages']} | {us:.1f} |")
    one_message = [(rows[0]["rounds"], med(rows, "us")) for (a, _, _), rows in iso.items()
                   if a != "shuffle"]
    fixed, per_round = fit(one_message)
    lines += ["", f"Fit over the one-message-per-round rows: {fixed:.1f} µs fixed + "
              f"{per_round:.2f} µs per round."]
    shuffle = {p: rows for (a, _, p), rows in iso.items() if a == "shuffle"}
    if 2 in shuffle and 64 in shuffle:
        dm = shuffle[64][0]["messages"] - shuffle[2][0]["messages"]
        du = med(shuffle[64], "us") - med(shuffle[2], "us")
        lines.append(f"Shuffle (two rounds, a message to and from everyone): {du / dm:.2f} µs "
                     "per extra message.")
    lines += ["", "Thread ranks (`collectives.run`), the probe rank's medians per call:", "",
              "| algorithm (ran) | p | rank | rounds | thread CPU µs | wall µs | sleeps | polls | "
              "CPU in sleeps µs | CPU − core alone | per round | per sleep |",
              "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (alg, rank, p), rows in thr.items():
        r, cpu, sleeps = rows[0], med(rows, "cpu_us"), med(rows, "sleeps")
        extra = cpu - core[(alg, rank % p, p)]
        lines.append(f"| {alg} ({r['ran']}) | {p} | {rank % p} | {r['rounds']} | {cpu:.1f} | "
                     f"{med(rows, 'wall_us'):.0f} | {sleeps:.1f} | {med(rows, 'polls'):.1f} | "
                     f"{med(rows, 'sleep_cpu_us'):.1f} | {extra:.1f} | "
                     f"{extra / r['rounds']:.1f} | {extra / max(sleeps, 1):.1f} |")
    lines += counts
    lines += ["", "One plan, several buffer lengths in turn (mirror transport, rank 0), µs per "
              "call:", "", "| algorithm | p | rounds | 1 length | 8 lengths | 9 lengths |",
              "|:---|---:|---:|---:|---:|---:|"]
    by_alg: dict = {}
    for (alg, p, k), rows in lengths.items():
        by_alg.setdefault((alg, p), {})[k] = rows
    for (alg, p), ks in by_alg.items():
        lines.append(f"| {alg} | {p} | {ks[1][0]['rounds']} | " + " | ".join(
            f"{med(ks[k], 'us'):.1f}" for k in (1, 8, 9)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-r", "--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000, help="calls per core-alone cell")
    parser.add_argument("--thread-calls", type=int, default=200,
                        help="calls per thread-rank cell (a tenth of that for the ring at 64)")
    parser.add_argument("--warmup", type=int, default=WARMUP_CALLS,
                        help="unmeasured calls before each thread-rank cell (at least 1: the "
                             "first call agrees the signature)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "benchmarks/overhead.py", *argv])
    load_before = os.getloadavg()

    def core_alone(config):
        alg, rank, p = config
        calls = args.calls // 10 if (alg in ("ring", "shuffle") and p > 2) else args.calls
        return isolated(alg, rank % p, p, calls)

    iso = interleaved(ISOLATED, core_alone, args.repeats)
    lengths = interleaved([(a, p, k) for a, p in LENGTHS for k in (1, 8, 9)],
                          lambda c: isolated(c[0], 0, c[1], args.calls // 4, lengths=c[2]),
                          args.repeats)
    counters = Counters()
    try:
        def on_threads(config):
            alg, rank, p = config
            calls = args.thread_calls // 10 if (alg == "ring" and p > 2) else args.thread_calls
            return threaded(alg, rank % p, p, calls, counters, args.warmup)

        thr = interleaved(THREADED, on_threads, args.repeats)
    finally:
        counters.close()
    counts = {p: call_counts("auto", p - 1, p, args.thread_calls, args.warmup) for p in (2, 64)}
    load_after = os.getloadavg()
    print(f"Command: `{command}`; load average (1/5/15 min) before "
          f"{'/'.join(f'{x:.2f}' for x in load_before)}, after "
          f"{'/'.join(f'{x:.2f}' for x in load_after)}.\n")
    print(markdown(iso, thr, lengths, counts_table(counts)))
    if args.json:
        import json

        meta = bench.metadata(command)
        meta["load"] = {"before": load_before, "after": load_after}
        with open(args.json, "w") as f:
            json.dump({**meta, "core_alone": [[list(k), v] for k, v in iso.items()],
                       "threads": [[list(k), v] for k, v in thr.items()],
                       "lengths": [[list(k), v] for k, v in lengths.items()],
                       "call_counts": counts}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
