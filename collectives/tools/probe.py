"""``collectives probe``: measure the cost model's constants on this job, cache and print them.

Under an MPI launcher every rank of the launch takes part (``mpiexec -n 4 collectives
probe``); otherwise ``-n`` thread ranks of this process do. Rank 0 prints the links of each
class present (latency and bandwidth through the library's own schedules), the per-call and
per-message overheads, where a host has more ranks than cores what a round and each peer
received from wait for them, the reduction speed per dtype, the transport's own collectives'
times, the checks (other schedules timed beside the probes, against what the probes'
constants predict: a warning where they disagree by far), and where the cache file went
(``collectives.init(calibrate=True)`` reads it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ..algorithms.cost import human_time
from ..api import calibration
from ..api.initialize import launched_by_mpi
from ..output_path import check_writable
from . import arguments

DESCRIPTION = """\
Measure what auto's cost model needs on this job: per link class present (threads or
devices of one process, processes of one host, hosts), latency by ping-pong and bandwidth by
streaming between a pair of ranks crossing it; the per-call and per-message overheads; where a
host runs more ranks than cores, what a round and each peer received from wait for them
(crowding); the reduction speed
per dtype; and the transport's own collectives (MPI's) at a few sizes.
Cached per host set in the user's cache folder; collectives.init(calibrate=True) uses it.
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``probe`` among the subcommands ``sub``."""
    positive = arguments.positive
    p = sub.add_parser("probe", help="measure and cache the cost model's constants on this job",
                       description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--ranks", type=arguments.in_one_process, default=2,
                   help="thread ranks when not under an MPI launcher; default 2")
    p.add_argument("-r", "--repeats", type=positive, default=7,
                   help="timed repeats; the median counts; default 7")
    p.add_argument("--no-natives", action="store_true",
                   help="do not time the transport's own collectives")
    p.add_argument("--cached", action="store_true",
                   help="print the cached numbers of this host set, measure only if none")
    p.add_argument("--json", metavar="PATH", help="also write the numbers as JSON (the "
                                                  "folder must exist)")
    p.set_defaults(run=main, parser=p)
    return p


def _probe(comm: Any, args: argparse.Namespace) -> tuple[Any, str]:
    mode = "1" if args.cached else "fresh"
    fabric = calibration.apply(comm, mode, repeats=args.repeats,
                               natives=not args.no_natives)
    return fabric, str(calibration.cache_file(calibration.host_set(comm)))


def report(fabric: Any, where: str) -> str:
    lines = [f"# {fabric.source}", "# link classes (alpha: per message; bandwidth: streaming)"]
    lines += [f"  {line}" for line in fabric.describe().splitlines()]
    if fabric.measured:
        lines.append("# the transport's own collectives (float32, bytes per rank: time)")
    for method, collective, size, points in fabric.measured:
        cells = ", ".join(f"{_size(b)}: {human_time(t)}" for b, t in points)
        lines.append(f"  {method} {collective} over {size}: {cells}")
    if fabric.checks:
        lines.append("# checks: other schedules timed beside the probes, measured / predicted "
                     "by the probes' constants")
        lines += [f"  {cls} {name.split('.')[1]}: rechd {_size(nbytes)}: {human_time(m)} / "
                  f"{human_time(p)} ({m / p:.2f}x)" for cls, name, nbytes, m, p in fabric.checks]
    lines += [f"# WARNING: {flag}" for flag in fabric.flags]
    if fabric.raw:
        lines.append("# raw seconds per call: " + ", ".join(
            f"{k} {human_time(v)}" for k, v in fabric.raw))
    lines.append(f"# cached in {where}")
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}"


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``collectives probe``; returns the exit status."""
    import collectives

    parser = args.parser
    if args.json is not None:  # before a measurement, not after it
        try:
            check_writable(args.json, "--json")
        except ValueError as exc:
            parser.error(str(exc))
    cache = calibration.cache_dir()  # (the measurement is kept there: tried first too)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        check_writable(str(cache / ".probe-check"), "the calibration cache")
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        parser.error(f"the calibration cache {cache} cannot be written ({why}); set "
                     f"{calibration.CACHE_ENV} to a folder this process can write")
    if launched_by_mpi():
        try:
            comm = collectives.init("mpi")
        except ImportError as exc:
            parser.error(str(exc))
        fabric, where = _probe(comm, args)
        rank = comm.rank
    else:
        results = collectives.run(lambda comm: _probe(comm, args), args.ranks, timeout=600)
        (fabric, where), rank = results[0], 0
    if rank == 0:
        print(report(fabric, where))
        if args.json is not None:
            with open(args.json, "w") as f:
                json.dump(json.loads(fabric.to_json()), f, indent=1)
        sys.stdout.flush()
    return 0
