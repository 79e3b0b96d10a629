"""The ``collectives`` command. ``collectives bench`` times collectives like nccl-tests;
``collectives draw`` prints and proves an algorithm's schedule.

    collectives bench -c all_reduce -a ring,tree -n 4 -b 8 -e 64M -f 2 --json out.json
    collectives draw rechd -n 5

The table goes to stdout (one row per size and algorithm); a progress bar goes to stderr
when it is a terminal. The exit status is 1 when any output element was wrong, 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from . import bench


def _size(text: str) -> int:
    try:
        return bench.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must not be negative")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``collectives`` and its subcommands."""
    parser = argparse.ArgumentParser(prog="collectives", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    b = sub.add_parser(
        "bench", help="time a collective over a sweep of sizes (like nccl-tests' *_perf)",
        description="Time a collective over a sweep of sizes, printing nccl-tests style rows: "
                    "median over repeats of the time per call, algbw = size/time, busbw = "
                    "algbw x nccl-tests' factor, and #wrong = output elements that differ from "
                    "a float64 NumPy reference.",
    )
    b.add_argument("-c", "--collective", default="all_reduce", choices=bench.COLLECTIVES,
                   help="default: all_reduce")
    b.add_argument("-a", "--algorithm", action="append", metavar="NAME",
                   help="algorithm(s) to compare, repeatable or comma-separated "
                        "(auto, one_device, ring, rechd, tree, shuffle, aliases, 'A/B'); "
                        "default: auto")
    b.add_argument("-n", "--participants", type=int, default=4,
                   help="devices (devices mode) or ranks (spmd mode); default 4")
    b.add_argument("--mode", default="devices", choices=bench.MODES,
                   help="devices: the multi-device API from one thread; spmd: thread ranks "
                        "via collectives.run; mpi: this process is one rank of an mpiexec "
                        "launch (-n is the launch's size; rank 0 prints); default: devices")
    b.add_argument("-b", "--minbytes", type=_size, default="8",
                   help="smallest size, K/M/G suffixes; default 8")
    b.add_argument("-e", "--maxbytes", type=_size, default="64M", help="largest size; default 64M")
    b.add_argument("-f", "--stepfactor", type=int, default=2, help="size multiplier between rows; default 2")
    b.add_argument("-d", "--dtype", default="float32", help="NumPy dtype name, or bfloat16; default float32")
    b.add_argument("-o", "--op", default="sum", help="sum, prod, max, min or mean; default sum")
    b.add_argument("--root", type=_positive, default=0, help="root of reduce and broadcast; default 0")
    b.add_argument("-w", "--warmup", type=_positive, default=2, help="untimed calls first; default 2")
    b.add_argument("-i", "--iters", type=_positive, default=None,
                   help="calls per timed repeat (default: adapt so a repeat takes >= 20 ms, "
                        f"at most {bench.MAX_ITERS})")
    b.add_argument("-r", "--repeats", type=_positive, default=5,
                   help="timed repeats, the median is reported; default 5")
    b.add_argument("--json", metavar="PATH", help="write rows and metadata as JSON")
    b.add_argument("--plot", metavar="PATH", help="write a PNG of busbw against size")
    b.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="count wrong output elements (default: check)")
    b.set_defaults(subparser=b)

    d = sub.add_parser("draw", help="print an algorithm's schedule, round by round, and prove it",
                       description="Print the schedule of a collective: one line per round, "
                                   "'d+=s[lo,hi)' for a reduce into d of s's range, 'd<-s[lo,hi)' "
                                   "for a copy; then run the checker on it.")
    d.add_argument("algorithm", help="one_device, ring, rechd, tree, shuffle, an alias or 'A/B'")
    d.add_argument("-c", "--collective", default="all_reduce", choices=bench.COLLECTIVES)
    d.add_argument("-n", "--participants", type=int, default=4)
    d.add_argument("--root", type=_positive, default=0)
    d.add_argument("--shards", type=_positive, default=0)
    d.add_argument("--rank", type=_positive, default=None,
                   help="draw only this participant's plan (works for thousands of participants)")
    d.add_argument("--group-size", type=_positive, default=0,
                   help="participants per group for two-level 'A/B' algorithms")
    d.set_defaults(subparser=d)
    return parser


def _algorithms(values: Sequence[str] | None) -> tuple[str, ...]:
    names = [part.strip() for v in (values or ["auto"]) for part in v.split(",") if part.strip()]
    return tuple(dict.fromkeys(names))


def bench_main(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: Sequence[str]) -> int:
    """Run ``collectives bench``; returns the exit status."""
    config = bench.BenchConfig(
        collective=args.collective, algorithms=_algorithms(args.algorithm),
        participants=args.participants, mode=args.mode, minbytes=args.minbytes,
        maxbytes=args.maxbytes, stepfactor=args.stepfactor, dtype=args.dtype, op=args.op,
        warmup=args.warmup, iters=args.iters or None, repeats=args.repeats, check=args.check,
        root=args.root)
    try:
        config.validate()
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    command = shlex.join(["collectives", *argv])
    machine = bench.machine_info()
    if config.mode == "mpi":
        from mpi4py import MPI

        config.participants = MPI.COMM_WORLD.Get_size()
        if MPI.COMM_WORLD.Get_rank() != 0:  # every rank measures; rank 0 alone reports
            rows = bench.run_bench(config)
            return 1 if sum(r["wrong"] or 0 for r in rows) else 0
    print(f"# {command}")
    print(f"# {config.collective} mode {config.mode} participants {config.participants} "
          f"warmup {config.warmup} iters {config.iters or 'auto'} repeats {config.repeats} "
          f"(median) on {machine['node']} ({machine['cpu_count']} CPUs)")
    print(bench.HEADER, flush=True)

    cases = bench.sweep(config)
    progress = bench.progress_context(len(cases) * len(config.algorithms))
    task = None

    def on_row(row: bench.Row) -> None:
        print(bench.format_row(row), flush=True)
        if progress is not None:
            progress.update(task, advance=1, description=f"{row['size']} B {row['algorithm']}")

    if progress is not None:
        with progress:
            task = progress.add_task(config.collective, total=len(cases) * len(config.algorithms))
            rows = bench.run_bench(config, on_row)
    else:
        rows = bench.run_bench(config, on_row)

    wrong = sum(r["wrong"] or 0 for r in rows)
    if rows:
        avg = sum(r["busbw"] for r in rows) / len(rows)
        verdict = ("not checked" if not config.check else f"{wrong} {'OK' if wrong == 0 else 'FAILED'}")
        print(f"# Wrong elements    : {verdict}")
        print(f"# Avg bus bandwidth : {avg:.3f} GB/s")
    if args.json:
        bench.write_json(args.json, rows, bench.metadata(command, config))
    if args.plot:
        bench.write_plot(args.plot, rows, command)
    if wrong:
        print(f"collectives bench: {wrong} wrong output elements", file=sys.stderr)
        return 1
    return 0


def draw_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``collectives draw``; returns the exit status."""
    from .drawing import draw

    try:
        text = draw(args.algorithm, args.collective, args.participants, root=args.root,
                    shards=args.shards, group_size=args.group_size, rank=args.rank)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    print(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``collectives`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench_main(args, args.subparser, argv)
    if args.command == "draw":
        return draw_main(args, args.subparser)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
