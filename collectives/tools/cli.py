"""The ``collectives`` command: ``bench`` times collectives like nccl-tests' ``*_perf``
programs, ``draw`` prints and proves an algorithm's schedule, ``probe`` measures the cost
model's constants on the job, ``simulate`` predicts an algorithm's time at any scale, and
``timeline`` reads the timelines a run records.

The table goes to stdout; progress goes to stderr when it is a terminal (a rich bar where
rich is installed, one plain line otherwise). Exit status: 0, 1 when any output element was
wrong, 2 for bad arguments (one line on stderr, before any work), 130 on Ctrl-C, 141 when
the reader of stdout went away (``collectives draw ... | head``).

Each subcommand is a module-level ``add_parser(sub)`` that registers its parser on the
subparsers ``sub`` and sets ``run(args, argv) -> status`` and ``parser`` as its defaults;
``COMMANDS`` lists them in the order ``--help`` shows them.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Sequence

import collectives

from ..timeline import command as timeline_command
from . import arguments, probe, simulate
from .bench import command as bench_command

DESCRIPTION = """\
Collective communication over NumPy and MPI, one set of algorithms.

examples:
  collectives bench -n 4 -b 4K -e 64M
  collectives bench -c all_gather -a ring,tree --mode spmd --json rows.json --plot
  mpiexec -n 4 collectives bench --mode mpi -a auto,native,ring
  collectives draw rechd -n 5
  collectives probe -n 2
  collectives simulate auto -n 4096 --cluster cpu -b 1M

'collectives COMMAND --help' lists a command's options.
"""


# --- draw -------------------------------------------------------------------------------------

def add_draw(sub) -> argparse.ArgumentParser:
    """Register ``draw`` among the subcommands ``sub``."""
    d = sub.add_parser("draw", help="print a schedule round by round, then prove it correct",
                       description="Print the schedule of a collective, one line per round: "
                                   "'d+=s[lo,hi)' reduces s's range into d, 'd<-s[lo,hi)' copies "
                                   "it. Then run the checker on it.")
    d.add_argument("algorithm", help="one_device, ring, rechd, tree, shuffle, an alias or 'A/B' "
                                     "(with --group-size)")
    d.add_argument("-c", "--collective", default="all_reduce",
                   choices=[c.value for c in collectives.Collective], help="default: all_reduce")
    d.add_argument("-n", "--participants", type=arguments.positive, default=4,
                   help="participants (devices or ranks) the schedule runs over; default 4")
    arguments.add_root_and_shards(d)
    d.add_argument("--rank", type=arguments.non_negative, default=None,
                   help="draw only this participant's plan (works for thousands of participants)")
    d.add_argument("--group-size", type=arguments.non_negative, default=0,
                   help="participants per group of a two-level 'A/B' algorithm (required there; "
                        "the last group is smaller where G does not divide -n)")
    d.set_defaults(run=draw_main, parser=d)
    return d


def draw_main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``collectives draw``; returns the exit status."""
    from .drawing import draw

    if "/" in args.algorithm and not args.group_size:
        args.parser.error(f"{args.algorithm} is two-level: pass --group-size G, the "
                          "participants per group (where G does not divide -n, the last "
                          "group is smaller)")
    try:
        text = draw(args.algorithm, args.collective, args.participants, root=args.root,
                    shards=args.shards, group_size=args.group_size, rank=args.rank)
    except (ValueError, TypeError) as exc:
        args.parser.error(str(exc))
    print(text)
    return 0


# --- the command --------------------------------------------------------------------------------

def add_timeline(sub) -> argparse.ArgumentParser:
    """Register ``timeline`` (its actions: merge, plot, summary) among the subcommands ``sub``."""
    t = timeline_command.add_parser(sub)
    t.set_defaults(run=lambda args, argv: args.handler(args), parser=t)
    return t


COMMANDS = (bench_command.add_parser, add_draw, probe.add_parser, simulate.add_parser,
            add_timeline)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``collectives`` and its subcommands."""
    parser = arguments.Parser(prog="collectives", description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {collectives.__version__}")
    sub = parser.add_subparsers(title="commands", dest="command", required=True,
                                metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def _stdout_gone() -> int:
    """The reader of stdout went away: send what is left to /dev/null (so that flushing at
    exit raises nothing) and end quietly, as ``head`` expects of a writer."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


def _interrupted() -> int:
    """Exit status 130, as after SIGINT. Where other threads still run (the thread ranks of
    ``bench --mode spmd``, daemons), the process ends here with its streams flushed: at the
    interpreter's shutdown a daemon frozen in a write to stdout holds its lock, and Python
    aborts ("could not acquire lock for <stdout> at interpreter shutdown", status -6)."""
    if threading.active_count() == 1:
        return 130
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # (a closed pipe, a closed stream: nothing to keep)
            pass
    os._exit(130)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``collectives`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the subcommand, with its own --help
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        status = args.run(args, argv)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        return _stdout_gone()
    except KeyboardInterrupt:
        print(f"\ncollectives {args.command}: interrupted", file=sys.stderr)
        return _interrupted()
    except MemoryError as exc:  # one line, naming what did not fit and how to ask for less
        what = str(exc) or "an allocation failed"
        print(f"collectives {args.command}: out of memory ({what}); ask for less: fewer "
              "participants (-n) or smaller sizes", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
