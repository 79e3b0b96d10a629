"""The ``collectives timeline`` subcommand: ``merge``, ``plot`` and ``summary``.

    collectives timeline merge DIR -o trace.json     # open trace.json in ui.perfetto.dev
    collectives timeline plot trace.json -o timeline.png
    collectives timeline summary trace.json

``plot`` and ``summary`` also take the folder itself (merged on the fly).
"""

from __future__ import annotations

import argparse
import sys

from ..output_path import check_figure, check_writable

DESCRIPTION = """\
Record with COLLECTIVES_TIMELINE=DIR (or collectives.timeline.start(DIR)): every process writes
DIR/<host>-<pid>.trace.json, Chrome trace events that Perfetto (ui.perfetto.dev) and
chrome://tracing open. Then:

  merge DIR -o trace.json      one trace of every rank, clocks lined up
  plot trace.json -o out.png   ranks as rows, calls and rounds as bars, waits hatched
  summary trace.json           per collective and size: calls, time, busbw, waiting and for whom
"""


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``timeline`` to the ``collectives`` command's subparsers."""
    t = sub.add_parser("timeline", help="merge, draw and summarise timelines of every call",
                       description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = t.add_subparsers(dest="action", required=True, metavar="ACTION",
                               help="merge, plot or summary")
    m = actions.add_parser("merge", help="join the ranks' files into one trace")
    m.add_argument("folder", help="the folder COLLECTIVES_TIMELINE named")
    m.add_argument("-o", "--output", default="trace.json", help="default trace.json")
    p = actions.add_parser("plot", help="draw a trace (needs matplotlib: the bench extra)")
    p.add_argument("trace", help="a merged trace, or the folder of the ranks' files")
    p.add_argument("-o", "--output", default="timeline.png", help="PNG, SVG or PDF")
    p.add_argument("--start", type=float, default=None, metavar="MS",
                   help="from this many ms after the first event")
    p.add_argument("--end", type=float, default=None, metavar="MS", help="until this many ms")
    p.add_argument("--title", default=None)
    s = actions.add_parser("summary", help="where the time went, and who was waited for")
    s.add_argument("trace", help="a merged trace, or the folder of the ranks' files")
    t.set_defaults(subparser=t, handler=main)
    return t


def main(args: argparse.Namespace) -> int:
    """Run ``collectives timeline ACTION``; returns the exit status."""
    from . import trace_files

    try:
        if args.action == "merge":
            check_writable(args.output, "-o")  # (before the merge, not after it)
            trace = trace_files.merge(args.folder, leave_out=args.output)
            for note in trace["otherData"]["left_out"]:
                print(f"collectives timeline merge: {note}", file=sys.stderr)
            trace_files.write(trace, args.output)
            ranks = sorted({e["pid"] for e in trace["traceEvents"] if "pid" in e})
            print(f"{args.output}: {len(trace['traceEvents'])} events of {len(ranks)} "
                  "participants (open it in ui.perfetto.dev or chrome://tracing)")
        elif args.action == "plot":
            from .plot import plot

            check_figure(args.output, "-o")
            path = plot(trace_files.load(args.trace), args.output, start_ms=args.start,
                        end_ms=args.end, title=args.title)
            print(path)
        else:
            from .summary import summarize

            print(summarize(trace_files.load(args.trace)))
    except (OSError, ValueError) as exc:  # (a missing file, a folder named like a file)
        print(f"collectives timeline {args.action}: {exc}", file=sys.stderr)
        return 2
    return 0
