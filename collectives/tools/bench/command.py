"""``collectives bench`` on the command line: its options, the checks that refuse a run
before any work (bad settings, a sweep that cannot fit in memory, an output path that cannot
be written, ``--mode mpi`` outside an MPI launch), the table, the JSON and the plot."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

import collectives

from ...api.initialize import LAUNCHER_SIZE
from ...extras import MissingDependencyError, require
from ...output_path import check_figure, check_writable
from .. import arguments
from . import report, run
from .config import MODES, BenchConfig
from .progress import progress
from .timing import MAX_ITERS

DESCRIPTION = """\
Time a collective over a sweep of sizes, one row per size and algorithm, as nccl-tests does:
the median over repeats of the time per call, algbw = size / time, busbw = algbw x the
collective's bus factor, and #wrong = output elements that differ from a float64 NumPy
reference. Each row measures the call out of place (results in separate buffers) and in
place (the result overwrites the input, where the API allows it; N/A elsewhere). 'request'
is the algorithm asked for, 'algorithm' the one that ran.
"""
# Buffers of one participant at the largest size: its input, its output, the in-place buffer
# and the expected output; the library's own work buffers come on top.
BUFFERS_PER_PARTICIPANT = 4


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``bench`` among the subcommands ``sub``."""
    b = sub.add_parser("bench", help="time a collective over a sweep of sizes (like nccl-tests)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("-c", "--collective", default="all_reduce", choices=run.RECORDS,
                   help="default: all_reduce")
    b.add_argument("-a", "--algorithm", action="append", metavar="NAME",
                   help="algorithm(s) to compare, repeatable or comma-separated "
                        "(auto, one_device, ring, rechd, tree, shuffle, TensorFlow's names, "
                        "'A/B'; under --mode mpi also native and shm); default: auto")
    b.add_argument("-n", "--participants", type=arguments.in_one_process, default=4,
                   help="devices (devices mode) or thread ranks (spmd mode); default 4")
    b.add_argument("--mode", default="devices", choices=MODES,
                   help="devices: the multi-device API from one thread; spmd: thread ranks "
                        "via collectives.run; mpi: this process is one rank of an mpiexec "
                        "launch (the launch sets the ranks; rank 0 prints); default: devices")
    b.add_argument("--backend", default="local",
                   help="devices mode: whose arrays (local: NumPy; cupy: GPUs, participant p on "
                        "GPU p mod the GPU count, with a copy ceiling per size); default local")
    b.add_argument("-b", "--minbytes", type=arguments.size, default="8",
                   help="smallest size, K/M/G suffixes; default 8")
    b.add_argument("-e", "--maxbytes", type=arguments.size, default="64M",
                   help="largest size; default 64M")
    b.add_argument("-f", "--stepfactor", type=arguments.count(2), default=2,
                   help="size multiplier between rows; default 2")
    b.add_argument("-d", "--dtype", default="float32",
                   help="NumPy dtype name, or bfloat16; default float32")
    b.add_argument("-o", "--op", default="sum", help="sum, prod, max, min or mean; default sum")
    b.add_argument("--root", type=arguments.non_negative, default=0,
                   help="root of reduce, broadcast, gather and scatter; default 0")
    b.add_argument("-w", "--warmup", type=arguments.non_negative, default=2,
                   help="untimed calls first; default 2")
    b.add_argument("-i", "--iters", type=arguments.positive, default=None,
                   help="calls per timed repeat (default: adapt so a repeat takes >= 20 ms, "
                        f"at most {MAX_ITERS})")
    b.add_argument("-r", "--repeats", type=arguments.positive, default=5,
                   help="timed repeats, the median is reported; default 5")
    b.add_argument("--json", metavar="PATH", help="write rows and metadata as JSON")
    b.add_argument("--plot", metavar="PATH", nargs="?", const="",
                   help="write a PNG of busbw against size (needs matplotlib); default "
                        "PATH: COLLECTIVE_busbw.png")
    b.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="count wrong output elements (default: check)")
    b.set_defaults(run=main, parser=b)
    return b


def algorithms(values: Sequence[str] | None) -> tuple[str, ...]:
    """The ``-a`` names, split at commas, in order, each once."""
    names = [part.strip() for v in (values or ["auto"]) for part in v.split(",") if part.strip()]
    return tuple(dict.fromkeys(names))


def human_size(nbytes: float) -> str:
    """``4K``, ``1M``, ``64M``, ``1.5G``: a byte count in powers of 1024."""
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g}{unit}"
    return f"{nbytes:.3g}"


def available_memory() -> int | None:
    """Bytes of memory this machine can give without swapping (Linux's MemAvailable), else
    its physical memory; None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(config: BenchConfig) -> None:
    """Refuse a sweep whose largest size cannot fit in memory (ValueError naming the fix)."""
    cases = run.sweep(config)
    if not cases:
        return
    largest = max(case.nbytes for case in cases)
    need = largest * config.participants * BUFFERS_PER_PARTICIPANT
    have = available_memory()
    if have is not None and need > have:
        raise ValueError(f"a sweep to {human_size(largest)} over {config.participants} "
                         f"participants needs about {human_size(need)}B of memory, and "
                         f"{human_size(have)}B is available; lower -e/--maxbytes or -n")


def mpi_communicator():
    """This rank's Communicator over the MPI launch (ValueError outside one)."""
    require("mpi4py", "mpi", "--mode mpi")
    if not any(name in os.environ for name in LAUNCHER_SIZE):
        raise ValueError("--mode mpi runs as one rank of an MPI launch, and no MPI launcher "
                         "started this process: launch it with mpiexec -n N collectives bench "
                         "--mode mpi, or use --mode spmd for thread ranks")
    return collectives.load_backend("mpi").init()


def write_plot(path: str, rows: Sequence[report.Row], command: str) -> None:
    """PNG of out-of-place busbw against size, one line per algorithm; sizes read 4K, 1M,
    64M, and the ``auto`` line says what it ran at which sizes."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == algorithm]
        ax.plot([r["size"] for r in mine], [r["busbw"] for r in mine], marker="o", ms=3,
                label=legend_label(algorithm, mine))
    ax.set_xscale("log", base=2)
    sizes = [r["size"] for r in rows]
    if sizes:  # a tick at every power of 4 (of 2 for a short sweep) in the sweep
        lo, hi = min(sizes).bit_length() - 1, max(sizes).bit_length() - 1
        ticks = [1 << k for k in range(lo, hi + 1) if k % 2 == 0] if hi - lo >= 4 else [
            1 << k for k in range(lo, hi + 1)]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: human_size(value)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("size per participant (bytes)")
    ax.set_ylabel("busbw (GB/s), out of place")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="algorithm")
    machine = report.machine_info()
    what = f"{rows[0]['collective']}, {rows[0]['mode']}, n={rows[0]['participants']}, " if rows else ""
    title = f"{what}on {machine['node']} ({machine['cpu_count']} CPUs): {command}"
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def legend_label(algorithm: str, rows: Sequence[report.Row]) -> str:
    """The line's name; where what ran differs from what was asked (``auto``), what ran over
    which sizes: ``auto: rechd 8-64K, ring 128K-64M``."""
    ran = [(r["resolved"], r["size"]) for r in rows]
    if all(name == algorithm for name, _ in ran):
        return algorithm
    spans: list[list] = []
    for name, size in ran:
        if spans and spans[-1][0] == name:
            spans[-1][2] = size
        else:
            spans.append([name, size, size])
    parts = [f"{name} {human_size(lo)}" + (f"-{human_size(hi)}" if hi != lo else "")
             for name, lo, hi in spans]
    return f"{algorithm}: {', '.join(parts)}"


def _summary(rows: list[report.Row], config: BenchConfig) -> int:
    """Print nccl-tests' closing lines; return the number of wrong elements."""
    halves = [h for r in rows for h in (r, r["inplace"]) if h is not None]
    wrong = sum(h["wrong"] or 0 for h in halves)
    if halves:
        verdict = "not checked" if not config.check else f"{wrong} {'OK' if wrong == 0 else 'FAILED'}"
        print(f"# Wrong elements    : {verdict}")
        print(f"# Avg bus bandwidth : {sum(h['busbw'] for h in halves) / len(halves):.3f} GB/s")
    return wrong


def _ceilings(rows: list[report.Row]) -> None:
    """The copy ceiling of each size, where the backend measured one: the time to copy the
    participants' inputs into their outputs, the least any out-of-place collective costs."""
    seen: dict[int, dict] = {}  # size -> its ceiling
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


def prepare(args: argparse.Namespace) -> tuple[BenchConfig, str | None, Any]:
    """The configuration, the plot's path and the MPI communicator (or None), each checked
    before any work; ValueError or MissingDependencyError says what is wrong."""
    config = BenchConfig(
        collective=args.collective, algorithms=algorithms(args.algorithm),
        participants=args.participants, mode=args.mode, minbytes=args.minbytes,
        maxbytes=args.maxbytes, stepfactor=args.stepfactor, dtype=args.dtype, op=args.op,
        warmup=args.warmup, iters=args.iters, repeats=args.repeats, check=args.check,
        root=args.root, backend=args.backend)
    plot = (args.plot or f"{config.collective}_busbw.png") if args.plot is not None else None
    if plot is not None:
        require("matplotlib", "bench", "--plot")
        check_figure(plot, "--plot")
    if args.json is not None:
        check_writable(args.json, "--json")
    comm = None
    if config.mode == "mpi":
        comm = mpi_communicator()
        config.participants = comm.size
    config.validate()
    check_memory(config)
    if config.backend != "local":  # its arrays need its hardware: say so before the sweep
        try:
            collectives.load_backend(config.backend).bench_kit(config.participants)
        except (ImportError, RuntimeError, ValueError, AttributeError) as exc:
            raise ValueError(f"--backend {config.backend}: {exc}") from None
    return config, plot, comm


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``collectives bench``; returns the exit status."""
    try:
        config, plot, comm = prepare(args)
    except (ValueError, TypeError, MissingDependencyError) as exc:
        args.parser.error(str(exc))
    if comm is not None and comm.rank != 0:  # every rank measures; rank 0 alone reports
        rows = run.run_bench(config, comm=comm)
        return 1 if any(h and h["wrong"] for r in rows for h in (r, r["inplace"])) else 0

    command = shlex.join(["collectives", *argv])
    machine = report.machine_info()
    print(f"# {command}")
    print(f"# {config.collective} mode {config.mode} participants {config.participants} "
          f"warmup {config.warmup} iters {config.iters or 'auto'} repeats {config.repeats} "
          f"(median) on {machine['node']} ({machine['cpu_count']} CPUs)")
    print(report.TITLE)
    print(report.HEADER, flush=True)

    total = len(run.sweep(config)) * len(config.algorithms)
    with progress(total, config.collective) as bar:
        def on_row(row: report.Row) -> None:
            bar.clear()
            print(report.format_row(row), flush=True)
            bar.advance(f"{row['size']} B {row['algorithm']}")

        rows = run.run_bench(config, on_row, comm=comm)

    wrong = _summary(rows, config)
    _ceilings(rows)
    if args.json:
        report.write_json(args.json, rows, report.metadata(command, config))
    if plot is not None:
        write_plot(plot, rows, command)
        print(f"# Plot              : {plot}")
    if wrong:
        print(f"collectives bench: {wrong} wrong output elements", file=sys.stderr)
        return 1
    return 0

