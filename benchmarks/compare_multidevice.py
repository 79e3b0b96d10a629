"""Multi-device all-reduce: every algorithm of the library, TensorFlow and the memory bound.

One run, 4 devices (``-p``), float32, 4 KiB..64 MiB per device:

* every algorithm (one_device, ring, rechd, tree, shuffle, auto) through
  ``collectives.all_reduce(values, "sum", algorithm, out=preallocated)``, each with its own
  preallocated outputs, checked against the exact reference after timing;
* ``auto shared``: ``all_reduce(values, "sum", "auto", shared_result=True)`` (the result
  computed once and returned as read-only views: one output's memory traffic, as TensorFlow);
* ``auto rounds`` and ``ring rounds``: ``auto`` and ``ring`` with ``out=`` under the
  executor's ``rounds`` strategy (each round over whole ranges) instead of ``tiles`` (the
  default: every round on one cache-sized tile at a time), by switching the NumPy device
  backend's ``strategy`` around the call;
* the bound of ``ceiling.py``: a copy of p arrays of S bytes on 2 threads and on 1 thread,
  the faster of the two (p outputs); for one output (``shared_result``) the same copy
  bandwidth over its traffic, p·S read + S written: the bound times (p + 1) / 2p;
* TensorFlow's ``ReductionToOneDevice`` (the methods of ``tf_anchor.py``), timed by
  ``tf_worker.py`` in a process of its own (TF's thread pools never share this process), on
  request, one repeat at a time.

Everything is interleaved: each repeat times every method once (TensorFlow's as one turn of
the rotation, its three methods rotated inside it), in an order rotated from repeat to
repeat, so that a burst of noise on this machine hits them all alike; TensorFlow idles while
the library runs and the other way round.
Cells are medians over repeats of the time per call. The output is markdown, ready for
docs/performance.md, and ``--json`` keeps every repeat.

    python benchmarks/compare_multidevice.py [-p 4] [-b 4K] [-e 64M] [-r 9] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from functools import partial

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ceiling  # noqa: E402
from tf_worker import TfWorker  # noqa: E402

import collectives  # noqa: E402
from collectives.algorithms.schedule import Collective  # noqa: E402
from collectives.api.multi_device import pick_algorithm  # noqa: E402
from collectives.registry import backend_for_arrays  # noqa: E402
from collectives.tools import bench  # noqa: E402

ALGORITHMS = ("one_device", "ring", "rechd", "tree", "shuffle", "auto")
VARIANTS = ("auto shared", "auto rounds", "ring rounds")
METHODS = ALGORITHMS + VARIANTS
TF_TARGET = 0.90  # the shared result's target: at most 0.9x TensorFlow's time
HERE = os.path.dirname(os.path.abspath(__file__))


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def measure(p: int, lo: int, hi: int, repeats: int, warmup: int, target: float,
            tf: TfWorker | None) -> list[dict]:
    """Interleaved medians of every method, TensorFlow's and the bound, per size."""
    config = bench.BenchConfig(collective="all_reduce", algorithms=ALGORITHMS, participants=p,
                               minbytes=lo, maxbytes=hi)
    kernels = ceiling.Kernels()
    results = []
    try:
        for index, case in enumerate(bench.sweep(config)):
            inputs = case.inputs()
            model = backend_for_arrays(inputs).cost_model
            outs = {a: [np.zeros(case.count, case.dtype) for _ in range(p)] for a in METHODS}
            methods = {a: (lambda a=a, x=inputs, o=outs[a]: collectives.all_reduce(x, "sum", a, out=o))
                       for a in ALGORITHMS}
            methods.update(variants(inputs, outs))
            for threads in (2, 1):
                methods[f"bound_{threads}t"] = kernels.copy_many(p, case.nbytes, threads)[0]
            iters = {name: bench.measure(call, warmup=warmup, repeats=1, target=target).iters
                     for name, call in methods.items()}
            times: dict[str, list[float]] = {name: [] for name in methods}
            names = list(methods)
            if tf is not None:
                iters.update(tf.ask(case=index, do="calibrate")["iters"])
                names.append("tf")
            for rep in range(repeats):
                shift = rep % len(names)
                for name in names[shift:] + names[:shift]:
                    if name == "tf":
                        answer = tf.ask(case=index, do="time", shift=rep)  # type: ignore[union-attr]
                        for method, seconds in answer["seconds"].items():
                            times.setdefault(method, []).append(seconds)
                        continue
                    call, k = methods[name], iters[name]
                    start = time.perf_counter()
                    for _ in range(k):
                        call()
                    times[name].append((time.perf_counter() - start) / k)
            expected = bench.expected_outputs(case)
            row = {"size": case.nbytes, "count": case.count,
                   "auto_picks": bench.resolve_algorithm(case, "auto", model),
                   "shared_picks": pick_algorithm(Collective.REDUCE, "auto", p, case.nbytes,
                                                  model)[0],
                   "median_us": {n: statistics.median(t) * 1e6 for n, t in times.items()},
                   "repeats_us": {n: [x * 1e6 for x in t] for n, t in times.items()},
                   "iters": iters,
                   "wrong": {a: bench.count_wrong(outs[a], expected) for a in METHODS}}
            if tf is not None:
                row["wrong"].update(tf.ask(case=index, do="check")["wrong"])
            bound = min(row["median_us"]["bound_1t"], row["median_us"]["bound_2t"])
            row["median_us"]["bound"] = bound
            row["median_us"]["bound_one"] = bound * (p + 1) / (2 * p)
            results.append(row)
            print(f"# {human(case.nbytes)}: " + ", ".join(
                f"{n} {v:.0f}" for n, v in row["median_us"].items()) + " us", file=sys.stderr)
    finally:
        kernels.close()
    return results


def variants(inputs: list, outs: dict) -> dict:
    """The timed calls of VARIANTS; each leaves its results in ``outs[name]``."""
    backend = backend_for_arrays(inputs)

    def shared(x=inputs, o=outs["auto shared"]):
        o[:] = collectives.all_reduce(x, "sum", "auto", shared_result=True)

    def rounds(algorithm: str, x=inputs):
        o = outs[f"{algorithm} rounds"]
        saved, backend.strategy = backend.strategy, "rounds"
        try:
            collectives.all_reduce(x, "sum", algorithm, out=o)
        finally:
            backend.strategy = saved

    return {"auto shared": shared, **{f"{a} rounds": partial(rounds, a) for a in ("auto", "ring")}}


def markdown(ours: list[dict], meta: dict, p: int, repeats: int) -> str:
    """The tables for docs/performance.md."""
    tf = {(r["size"], m): v for r in ours for m, v in r["median_us"].items() if m.startswith("tf_")}
    m = meta["machine"]
    tf_version = meta.get("tensorflow") or "not available"
    lines = [
        f"#### Multi-device all-reduce: {p} devices, float32, sum",
        "",
        f"Machine: `{m['node']}`, {m['cpu_count']} CPUs ({m.get('processor_model', '?')}), "
        f"{m['platform']}, Python {m['python']}, "
        f"NumPy {meta['numpy']}, TensorFlow {tf_version}; {meta['date']}; load average "
        f"{meta.get('load', '?')}.  ",
        f"Command: `{meta['command']}`.  ",
        f"Each cell: median over {repeats} repeats of the time per call, a repeat being >= 20 ms "
        "of back-to-back calls (at most 1000); the library's calls, the bound and TensorFlow "
        "(in a process of its own) interleaved, outputs preallocated (`out=`) except for "
        "`auto shared` and TensorFlow. `auto shared`: "
        "`shared_result=True`; `… rounds`: the `rounds` strategy instead of `tiles`. Bound: "
        "copying the p input arrays into p other arrays (p·S read + p·S written), on 2 threads "
        "or 1, whichever is faster (`benchmarks/ceiling.py`); `bound 1 out`: the same bandwidth "
        "over one output's traffic (p·S read + S written). `TF add_n alone` is TF's reduction "
        "step without its broadcast to the other devices.",
        "",
        "Time per call (µs):",
        "",
    ]
    head = ["size / device", *METHODS, "auto picks", "shared picks", "TF reduce",
            "TF batch_reduce", "TF add_n alone", "bound", "bound 1 out"]
    lines += ["| " + " | ".join(head) + " |",
              "|---:|" + "---:|" * len(METHODS) + ":---|:---|" + "---:|" * 5]

    def cell(v: float | None) -> str:
        return "n/a" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")

    for r in ours:
        med, size = r["median_us"], r["size"]
        lines.append("| " + " | ".join(
            [human(size), *(cell(med[a]) for a in METHODS), r["auto_picks"], r["shared_picks"],
             *(cell(tf.get((size, k))) for k in ("tf_r2od", "tf_r2od_batch", "tf_add_n")),
             cell(med["bound"]), cell(med["bound_one"])]) + " |")

    factor = 2 * (p - 1) / p
    busbw_cols = ["one_device", "ring", "auto", "auto shared", "auto rounds"]
    lines += ["", "busbw (GB/s; size / time x 2(p-1)/p, as nccl-tests; the bound's column is the "
              "busbw an all-reduce would have if it took the bound's time):", "",
              "| size / device | " + " | ".join([*busbw_cols, "TF reduce", "bound"]) + " |",
              "|---:|" + "---:|" * (len(busbw_cols) + 2)]

    def busbw(size: int, us: float | None) -> str:
        return "n/a" if not us else f"{size / (us * 1e-6) * factor / 1e9:.2f}"

    for r in ours:
        size, med = r["size"], r["median_us"]
        cells = [busbw(size, us) for us in [*(med[a] for a in busbw_cols),
                                            tf.get((size, "tf_r2od")), med["bound"]]]
        lines.append(f"| {human(size)} | " + " | ".join(cells) + " |")

    def ratio_table(title: str, denominator) -> None:
        lines.extend(["", title, "", "| size / device | " + " | ".join(METHODS) + " |",
                      "|---:|" + "---:|" * len(METHODS)])
        for r in ours:
            d = denominator(r)
            cells = ["n/a" if d is None else f"{r['median_us'][a] / d:.2f}" for a in METHODS]
            lines.append(f"| {human(r['size'])} | " + " | ".join(cells) + " |")

    ratio_table("Ours / TF `ReductionToOneDevice.reduce` (time ratio; below 1: faster than TF):",
                lambda r: tf.get((r["size"], "tf_r2od")))
    ratio_table("Ours / bound for p outputs (time ratio; 1: at the memory bound):",
                lambda r: r["median_us"]["bound"])
    lines += ["", f"Targets: `auto shared` at most {TF_TARGET:.2f}× TF `reduce`'s time; "
              "beside it, `auto shared` against its own bound and the strategies compared:", "",
              "| size / device | auto shared / TF | target | auto shared / bound 1 out | "
              "auto / bound | auto rounds / auto | ring rounds / ring |",
              "|---:|---:|:---|---:|---:|---:|---:|"]
    for r in ours:
        med, t = r["median_us"], tf.get((r["size"], "tf_r2od"))
        ratio = None if t is None else med["auto shared"] / t
        verdict = "n/a" if ratio is None else ("met" if ratio <= TF_TARGET else "**missed**")
        lines.append(f"| {human(r['size'])} | {'n/a' if ratio is None else f'{ratio:.2f}'} | "
                     f"{verdict} | {med['auto shared'] / med['bound_one']:.2f} | "
                     f"{med['auto'] / med['bound']:.2f} | {med['auto rounds'] / med['auto']:.2f} | "
                     f"{med['ring rounds'] / med['ring']:.2f} |")
    wrong = sum(sum(r["wrong"].values()) for r in ours)
    lines += ["", f"Wrong output elements over all cells: {wrong}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure, print the markdown and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--participants", type=int, default=4)
    parser.add_argument("-b", "--minbytes", type=bench.parse_size, default="4K")
    parser.add_argument("-e", "--maxbytes", type=bench.parse_size, default="64M")
    parser.add_argument("-r", "--repeats", type=int, default=9)
    parser.add_argument("-w", "--warmup", type=int, default=2)
    parser.add_argument("--no-tf", action="store_true", help="skip TensorFlow")
    parser.add_argument("--json", metavar="PATH", default="compare_multidevice.json")
    parser.add_argument("--markdown", metavar="PATH", help="also write the markdown here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "benchmarks/compare_multidevice.py", *argv])
    p, lo, hi = args.participants, args.minbytes, args.maxbytes
    start = time.perf_counter()
    load_before = os.getloadavg()

    tf = None if args.no_tf else TfWorker(p, lo, hi)
    try:
        ours = measure(p, lo, hi, args.repeats, args.warmup, bench.TARGET_SECONDS, tf)
    finally:
        if tf is not None:
            tf.close()
    meta = bench.metadata(command)
    meta["tensorflow"] = tf.version if tf is not None else None
    meta["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    meta["machine"]["processor_model"] = _cpu_model()
    meta["load"] = f"{'/'.join(f'{x:.2f}' for x in load_before)} before, " + "/".join(
        f"{x:.2f}" for x in os.getloadavg()) + " after (1/5/15 min)"
    text = markdown(ours, meta, p, args.repeats)
    print(text)
    print(f"\n<!-- {time.perf_counter() - start:.0f} s -->")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    with open(args.json, "w") as f:
        json.dump({**meta, "participants": p, "repeats": args.repeats, "rows": ours}, f,
                  indent=1)
        f.write("\n")
    return 1 if any(sum(r["wrong"].values()) for r in ours) else 0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
