"""The ``collectives`` command: ``bench`` times collectives like nccl-tests' ``*_perf``
programs, ``draw`` prints and proves an algorithm's schedule.

The table goes to stdout; progress goes to stderr when it is a terminal (a rich bar where
rich is installed, one plain line otherwise). Exit status: 0, 1 when any output element was
wrong, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

import collectives

from . import bench
from .timeline import command as timeline_command

DESCRIPTION = """\
Collective communication over NumPy and MPI, one set of algorithms.

commands:
  bench   time a collective over a sweep of sizes and check every result
          (nccl-tests style: time, algbw, busbw and #wrong, out-of-place and in-place)
  draw    print an algorithm's schedule round by round, then prove it correct
  probe   measure (and cache) the cost model's constants on this job
  simulate  predict an algorithm's time at any scale from the cost model
  timeline  merge, draw and summarise the timelines COLLECTIVES_TIMELINE=DIR records

examples:
  collectives bench -n 4 -b 4K -e 64M
  collectives bench -c all_gather -a ring,tree --mode spmd --json rows.json --plot
  mpiexec -n 4 collectives bench --mode mpi -a auto,native,ring
  collectives draw rechd -n 5

'collectives COMMAND --help' lists a command's options.
"""

BENCH_DESCRIPTION = """\
Time a collective over a sweep of sizes, one row per size and algorithm, as nccl-tests does:
the median over repeats of the time per call, algbw = size / time, busbw = algbw x the
collective's bus factor, and #wrong = output elements that differ from a float64 NumPy
reference. Each row measures the call out of place (results in separate buffers) and in
place (the result overwrites the input, where the API allows it; N/A elsewhere). 'request'
is the algorithm asked for, 'algorithm' the one that ran.
"""


def _size(text: str) -> int:
    try:
        return bench.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _count(least: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, not {text}")
        return value

    return parse


_non_negative, _positive = _count(0), _count(1)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``collectives`` and its subcommands."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="collectives", description=DESCRIPTION, formatter_class=raw)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {collectives.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    b = sub.add_parser("bench", help="time a collective over a sweep of sizes (like nccl-tests)",
                       description=BENCH_DESCRIPTION, formatter_class=raw)
    b.add_argument("-c", "--collective", default="all_reduce", choices=bench.COLLECTIVES,
                   help="default: all_reduce")
    b.add_argument("-a", "--algorithm", action="append", metavar="NAME",
                   help="algorithm(s) to compare, repeatable or comma-separated "
                        "(auto, one_device, ring, rechd, tree, shuffle, TensorFlow's names, "
                        "'A/B'; under --mode mpi also native and shm); default: auto")
    b.add_argument("-n", "--participants", type=_positive, default=4,
                   help="devices (devices mode) or thread ranks (spmd mode); default 4")
    b.add_argument("--mode", default="devices", choices=bench.MODES,
                   help="devices: the multi-device API from one thread; spmd: thread ranks "
                        "via collectives.run; mpi: this process is one rank of an mpiexec "
                        "launch (the launch sets the ranks; rank 0 prints); default: devices")
    b.add_argument("--backend", default="local",
                   help="devices mode: whose arrays (local: NumPy; cupy: GPUs, participant p on "
                        "GPU p mod the GPU count, with a copy ceiling per size); default local")
    b.add_argument("-b", "--minbytes", type=_size, default="8",
                   help="smallest size, K/M/G suffixes; default 8")
    b.add_argument("-e", "--maxbytes", type=_size, default="64M", help="largest size; default 64M")
    b.add_argument("-f", "--stepfactor", type=_count(2), default=2,
                   help="size multiplier between rows; default 2")
    b.add_argument("-d", "--dtype", default="float32",
                   help="NumPy dtype name, or bfloat16; default float32")
    b.add_argument("-o", "--op", default="sum", help="sum, prod, max, min or mean; default sum")
    b.add_argument("--root", type=_non_negative, default=0,
                   help="root of reduce and broadcast; default 0")
    b.add_argument("-w", "--warmup", type=_non_negative, default=2,
                   help="untimed calls first; default 2")
    b.add_argument("-i", "--iters", type=_positive, default=None,
                   help="calls per timed repeat (default: adapt so a repeat takes >= 20 ms, "
                        f"at most {bench.MAX_ITERS})")
    b.add_argument("-r", "--repeats", type=_positive, default=5,
                   help="timed repeats, the median is reported; default 5")
    b.add_argument("--json", metavar="PATH", help="write rows and metadata as JSON")
    b.add_argument("--plot", metavar="PATH", nargs="?", const="",
                   help="write a PNG of busbw against size (needs matplotlib); default "
                        "PATH: COLLECTIVE_busbw.png")
    b.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="count wrong output elements (default: check)")
    b.set_defaults(subparser=b)

    d = sub.add_parser("draw", help="print an algorithm's schedule, round by round, and prove it",
                       description="Print the schedule of a collective, one line per round: "
                                   "'d+=s[lo,hi)' reduces s's range into d, 'd<-s[lo,hi)' copies "
                                   "it. Then run the checker on it.")
    d.add_argument("algorithm", help="one_device, ring, rechd, tree, shuffle, an alias or 'A/B'")
    d.add_argument("-c", "--collective", default="all_reduce",
                   choices=[c.value for c in collectives.Collective])
    d.add_argument("-n", "--participants", type=_positive, default=4, help="default 4")
    d.add_argument("--root", type=_non_negative, default=0)
    d.add_argument("--shards", type=_non_negative, default=0)
    d.add_argument("--rank", type=_non_negative, default=None,
                   help="draw only this participant's plan (works for thousands of participants)")
    d.add_argument("--group-size", type=_non_negative, default=0,
                   help="participants per group for two-level 'A/B' algorithms")
    d.set_defaults(subparser=d)
    from . import probe, simulate

    probe.add_parser(sub, _positive)
    simulate.add_parser(sub, _positive)
    timeline_command.add_parser(sub)
    return parser


def _algorithms(values: Sequence[str] | None) -> tuple[str, ...]:
    names = [part.strip() for v in (values or ["auto"]) for part in v.split(",") if part.strip()]
    return tuple(dict.fromkeys(names))


# --- progress ---------------------------------------------------------------------------------

class _Quiet:
    """No progress display (stderr is not a terminal)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def clear(self) -> None:
        pass

    def advance(self, description: str) -> None:
        pass


class _PlainProgress(_Quiet):
    """One line on stderr, rewritten in place: ``[3/12] 4096 B ring``."""

    def __init__(self, total: int):
        self.total, self.done = total, 0

    def clear(self) -> None:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()

    def advance(self, description: str) -> None:
        self.done += 1
        sys.stderr.write(f"\r\033[K[{self.done}/{self.total}] {description}")
        sys.stderr.flush()

    def __exit__(self, *exc) -> None:
        self.clear()


class _RichProgress(_Quiet):
    """rich's progress bar on stderr (rows printed meanwhile scroll above it)."""

    def __init__(self, total: int, title: str):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=Console(file=sys.stderr), transient=True,
                                 redirect_stdout=sys.stdout.isatty(), redirect_stderr=False)
        self.task = self.progress.add_task(title, total=total)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def advance(self, description: str) -> None:
        self.progress.update(self.task, advance=1, description=description)


def progress(total: int, title: str) -> _Quiet:
    """A progress display for ``total`` rows: rich's bar when stderr is a terminal and rich
    is installed, a plain line on such a terminal without rich, nothing otherwise."""
    if not sys.stderr.isatty():
        return _Quiet()
    try:
        return _RichProgress(total, title)
    except ImportError:
        return _PlainProgress(total)


# --- bench ------------------------------------------------------------------------------------

def write_plot(path: str, rows: Sequence[bench.Row], command: str) -> None:
    """PNG of out-of-place busbw against size, one line per algorithm, log2 size axis."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == algorithm]
        ax.plot([r["size"] for r in mine], [r["busbw"] for r in mine], marker="o", ms=3,
                label=algorithm)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size per participant (bytes)")
    ax.set_ylabel("busbw (GB/s), out of place")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="algorithm")
    machine = bench.machine_info()
    what = f"{rows[0]['collective']}, {rows[0]['mode']}, n={rows[0]['participants']}, " if rows else ""
    title = f"{what}on {machine['node']} ({machine['cpu_count']} CPUs): {command}"
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mpi_communicator(parser: argparse.ArgumentParser):
    """This rank's Communicator over the MPI launch, through the backend registry."""
    try:
        return collectives.load_backend("mpi").init()
    except ImportError as exc:
        parser.error(f"--mode mpi needs mpi4py ({exc}); install it with pip install -e '.[mpi]' "
                     "and launch with mpiexec")


def _summary(rows: list[bench.Row], config: bench.BenchConfig) -> int:
    """Print nccl-tests' closing lines; return the number of wrong elements."""
    halves = [h for r in rows for h in (r, r["inplace"]) if h is not None]
    wrong = sum(h["wrong"] or 0 for h in halves)
    if halves:
        verdict = "not checked" if not config.check else f"{wrong} {'OK' if wrong == 0 else 'FAILED'}"
        print(f"# Wrong elements    : {verdict}")
        print(f"# Avg bus bandwidth : {sum(h['busbw'] for h in halves) / len(halves):.3f} GB/s")
    return wrong


def _ceilings(rows: list[bench.Row]) -> None:
    """The copy ceiling of each size, where the backend measured one: the time to copy the
    participants' inputs into their outputs, the least any out-of-place collective costs."""
    seen = {}
    for row in rows:
        if row.get("ceiling") is not None:
            seen.setdefault(row["size"], row["ceiling"])
    if not seen:
        return
    print("# Copy ceiling (inputs -> outputs, every participant):")
    print(f"#{'size(B)':>11} {'time(us)':>11} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
    for size, half in seen.items():
        print(f"#{size:>11} {half['time_us']:>11.2f} {half['algbw']:>12.3f} "
              f"{half['busbw']:>12.3f}")


def bench_main(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: Sequence[str]) -> int:
    """Run ``collectives bench``; returns the exit status."""
    config = bench.BenchConfig(
        collective=args.collective, algorithms=_algorithms(args.algorithm),
        participants=args.participants, mode=args.mode, minbytes=args.minbytes,
        maxbytes=args.maxbytes, stepfactor=args.stepfactor, dtype=args.dtype, op=args.op,
        warmup=args.warmup, iters=args.iters, repeats=args.repeats, check=args.check,
        root=args.root, backend=args.backend)
    plot = (args.plot or f"{config.collective}_busbw.png") if args.plot is not None else None
    if plot is not None:
        try:
            import matplotlib  # noqa: F401 - checked before the sweep, used after it
        except ImportError:
            parser.error("--plot needs matplotlib: pip install -e '.[bench]'")
    comm = None
    if config.mode == "mpi":
        comm = _mpi_communicator(parser)
        config.participants = comm.size
    try:
        config.validate()
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    if config.backend != "local":  # its arrays need its hardware: say so before the sweep
        try:
            collectives.load_backend(config.backend).bench_kit(config.participants)
        except (ImportError, RuntimeError, ValueError, AttributeError) as exc:
            parser.error(f"--backend {config.backend}: {exc}")
    if comm is not None and comm.rank != 0:  # every rank measures; rank 0 alone reports
        rows = bench.run_bench(config, comm=comm)
        return 1 if any(h and h["wrong"] for r in rows for h in (r, r["inplace"])) else 0

    command = shlex.join(["collectives", *argv])
    machine = bench.machine_info()
    print(f"# {command}")
    print(f"# {config.collective} mode {config.mode} participants {config.participants} "
          f"warmup {config.warmup} iters {config.iters or 'auto'} repeats {config.repeats} "
          f"(median) on {machine['node']} ({machine['cpu_count']} CPUs)")
    print(bench.TITLE)
    print(bench.HEADER, flush=True)

    total = len(bench.sweep(config)) * len(config.algorithms)
    with progress(total, config.collective) as bar:
        def on_row(row: bench.Row) -> None:
            bar.clear()
            print(bench.format_row(row), flush=True)
            bar.advance(f"{row['size']} B {row['algorithm']}")

        rows = bench.run_bench(config, on_row, comm=comm)

    wrong = _summary(rows, config)
    _ceilings(rows)
    if args.json:
        bench.write_json(args.json, rows, bench.metadata(command, config))
    if plot is not None:
        write_plot(plot, rows, command)
        print(f"# Plot              : {plot}")
    if wrong:
        print(f"collectives bench: {wrong} wrong output elements", file=sys.stderr)
        return 1
    return 0


# --- draw -------------------------------------------------------------------------------------

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
    if hasattr(args, "run"):  # commands of their own modules
        return args.run(args, args.subparser)
    if args.command == "bench":
        return bench_main(args, args.subparser, argv)
    if args.command == "timeline":
        return args.handler(args)
    return draw_main(args, args.subparser)


if __name__ == "__main__":
    sys.exit(main())
