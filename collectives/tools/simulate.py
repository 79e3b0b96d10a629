"""``collectives simulate``: an algorithm's predicted time at any scale, from the cost model.

    collectives simulate ring -n 65536 --nodes 8192x8 --link host=3us:150GB/s,net=5us:400Gbit/s
    collectives simulate auto -n 4096 --cluster cpu -b 1M

prints, per size, the predicted time, algbw and busbw (nccl-tests' bus factors) and the
critical path round by round (equal rounds merged); ``auto`` prints every candidate's price
instead. Nothing runs and no plan of O(n) rounds is built: the plans' closed forms
(``collectives.algorithms.closed_form``) price every algorithm at any participant count,
equal to the per-participant pricing and in under a second up to 10**9 participants on hosts
of a few. ``auto`` compares its candidates by that per-participant pricing, so it takes at
most ``AUTO_LIMIT`` (131,072) participants.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import algorithms
from ..algorithms import select
from ..algorithms.closed_form import price
from ..algorithms.cost import CLASSES, Fabric, Link, Placement, human_time
from ..algorithms.native_prices import NATIVE_AS, predict_native
from ..algorithms.schedule import Collective
from . import arguments

DESCRIPTION = """\
Predict an algorithm's time at any scale from the cost model, per size: the time, algbw and
busbw (nccl-tests' bus factors) and the critical path round by round; 'auto' prints every
candidate's price instead. Nothing runs: the plans' closed forms (runs of equal rounds priced
once) price every algorithm and 'native' at any participant count, the same as pricing the
participants' plans, in under a second up to 10^9 participants on hosts of a few (the time
grows with the participants of a host). 'auto' compares its candidates by their plans, so it
takes at most 131,072 participants.

examples:
  collectives simulate ring -n 65536 --nodes 8192x8 --link host=3us:150GB/s,net=5us:400Gbit/s
  collectives simulate ring -n 1000000000 --nodes 125000000x8
  collectives simulate auto -n 4096 --cluster cpu -b 1M
"""

# Modelled clusters (docs/scale.md): the numbers are assumptions, written out there.
CLUSTERS: dict[str, tuple[int, Fabric]] = {
    # 8 GPUs per node (H100-like): NVLink at 450 GB/s each way per GPU, one 400 Gbit/s NIC
    # per GPU (its own, not shared), reductions at HBM speed
    "gpu": (8, Fabric(proc=Link(2e-6, 1 / 450e9), host=Link(2e-6, 1 / 450e9),
                      net=Link(5e-6, 1 / 50e9), gamma=1 / 1000e9, overhead=0.5e-6,
                      nic_shared=False,
                      source="8-GPU nodes: NVLink 450 GB/s, a 400 Gbit/s NIC per GPU")),
    # 16 ranks per CPU node over shared memory, one 25 Gbit/s link per node, shared
    "cpu": (16, Fabric(proc=Link(0.5e-6, 1 / 10e9), host=Link(1e-6, 1 / 5e9),
                       net=Link(10e-6, 1 / 3.125e9), gamma=1 / 5e9, overhead=0.5e-6,
                       source="16-rank CPU nodes: shared memory 5 GB/s, one 25 Gbit/s link "
                              "per node")),
}
# 'auto' prices its candidates through their plans (O(n) rounds for the ring: linear in n):
# past this count a decision takes minutes and gigabytes, and simulate says so at once instead.
AUTO_LIMIT = 1 << 17

BUS = {Collective.ALL_REDUCE: lambda n: 2 * (n - 1) / n,
       Collective.REDUCE_SCATTER: lambda n: (n - 1) / n,
       Collective.ALL_GATHER: lambda n: (n - 1) / n}
UNITS = {"gb/s": 1e9, "mb/s": 1e6, "gbit/s": 1e9 / 8, "gb/s/8": 1e9 / 8, "mbit/s": 1e6 / 8,
         "gbps": 1e9 / 8, "mbps": 1e6 / 8}
TIMES = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_bandwidth(text: str) -> float:
    """``150GB/s``, ``400Gbit/s``, ``25gbps`` in bytes per second."""
    m = re.fullmatch(r"\s*([0-9.e+]+)\s*([a-z/]+)\s*", text.lower())
    try:
        value = float(m.group(1)) * UNITS[m.group(2)] if m else 0.0
    except (ValueError, KeyError):
        value = 0.0
    if not value > 0:
        raise ValueError(f"bandwidth {text!r}: write it like 150GB/s or 400Gbit/s (above zero)")
    return value


def parse_time(text: str) -> float:
    """``5us``, ``1.5us``, ``2ms`` in seconds."""
    m = re.fullmatch(r"\s*([0-9.e+]+)\s*(ns|us|ms|s)\s*", text.lower())
    try:
        return float(m.group(1)) * TIMES[m.group(2)] if m else float("")
    except ValueError:  # no match, or a number that is not one (1.2.3us)
        raise ValueError(f"latency {text!r}: write it like 5us or 1.5us") from None


def parse_links(text: str, fabric: Fabric) -> Fabric:
    """``host=3us:150GB/s,net=5us:400Gbit/s`` over ``fabric``."""
    changes: dict[str, Any] = {}  # Fabric's Link fields, by name
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        alpha, _, rate = value.partition(":")
        if name not in CLASSES or not rate:
            raise ValueError(f"--link {item!r}: write CLASS=LATENCY:BANDWIDTH with CLASS one of "
                             f"{', '.join(CLASSES)}, e.g. net=5us:400Gbit/s")
        changes[name] = Link(parse_time(alpha), 1 / parse_bandwidth(rate))
    return replace(fabric, **changes)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``simulate`` among the subcommands ``sub``."""
    p = sub.add_parser("simulate", help="predict an algorithm's time at any participant count",
                       description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("algorithm", help="a name ('ring', 'rechd/ring', ...), 'native' (MPI's, "
                                     "modelled) or 'auto' (every candidate's price; at "
                                     "most 131,072 participants)")
    p.add_argument("-c", "--collective", default="all_reduce",
                   choices=[c.value for c in Collective], help="default: all_reduce")
    p.add_argument("-n", "--participants", type=arguments.positive, default=64,
                   help="participants (devices or ranks) in all; default 64")
    p.add_argument("--nodes", help="COUNTxPER: hosts and participants per host (default: "
                                   "the cluster's, or one host)")
    p.add_argument("--cluster", choices=sorted(CLUSTERS), default="gpu",
                   help="modelled constants to start from (default gpu)")
    p.add_argument("--link", default="", help="override link classes: "
                                              "CLASS=LATENCY:BANDWIDTH,... (proc, host, net)")
    p.add_argument("--gamma", help="reduction speed, e.g. 10GB/s")
    p.add_argument("--fabric", metavar="PATH", help="constants from a 'probe --json' file")
    p.add_argument("-b", "--bytes", nargs="+", type=arguments.size, default=[64 << 20],
                   metavar="SIZE", help="buffer sizes (K, M, G suffixes); default 64M")
    p.add_argument("--threads", action="store_true",
                   help="participants of one host share a process (proc links)")
    arguments.add_root_and_shards(p)
    p.add_argument("--group-size", type=arguments.non_negative, default=0,
                   help="groups of a two-level name (default: the hosts); it must divide -n")
    p.add_argument("--rounds", type=arguments.positive, default=12,
                   help="critical-path lines to print; default 12")
    p.set_defaults(run=main, parser=p)
    return p


def parse_size(text: str) -> int:
    """Bytes from ``64M``, ``1G``, ``4K`` or a plain count."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def setup(args: argparse.Namespace) -> tuple[Fabric, int]:
    """The constants and the participants per host the arguments describe (hosts of
    consecutive participants); ValueError naming the argument where one is wrong."""
    per, fabric = CLUSTERS[args.cluster]
    if args.fabric:
        try:
            fabric = Fabric.from_json(Path(args.fabric).read_text())
        except OSError as exc:
            raise ValueError(f"--fabric {args.fabric}: {exc.strerror or exc}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"--fabric {args.fabric} is not a 'collectives probe --json' "
                             f"file ({type(exc).__name__}: {exc})") from None
    fabric = parse_links(args.link, fabric)
    if args.gamma:
        try:
            gamma = parse_bandwidth(args.gamma)
        except ValueError as exc:
            raise ValueError(f"--gamma {exc}") from None
        if gamma <= 0:
            raise ValueError(f"--gamma {args.gamma}: a reduction speed is above zero")
        fabric = replace(fabric, gamma=1 / gamma, gammas=())
    n = args.participants
    if args.nodes:
        count, _, each = args.nodes.lower().partition("x")
        if not (count.isdigit() and each.isdigit() and int(count) and int(each)):
            raise ValueError(f"--nodes {args.nodes}: write COUNTxPER, e.g. 8x8")
        count, per = int(count), int(each)
        if count * per != n:
            raise ValueError(f"--nodes {args.nodes}: {count} x {per} is not -n {n}")
    elif n % per:
        per = 1
    return fabric, per


def _line(p, n: int, nbytes: int) -> str:
    head = f"{p.label}: {p.collective.value} of {_human(nbytes)} over {n}: "
    if not p.seconds:  # (one participant, or no bytes: no bandwidth to speak of)
        return head + "0 ns, nothing moves (no algbw or busbw)"
    algbw = nbytes / p.seconds / 1e9
    bus = BUS.get(p.collective, lambda n: 1.0)(n)
    return (head + f"{human_time(p.seconds)}, algbw {algbw:.2f} GB/s, busbw {algbw * bus:.2f} GB/s "
            f"(latency {human_time(p.latency)}, transfer {human_time(p.transfer)}, "
            f"reduction {human_time(p.reduction)})")


def _human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``collectives simulate``; returns the exit status."""
    n = args.participants
    try:  # every argument checked before the first line of output
        fabric, per = setup(args)
        collective = Collective(args.collective)
        name = args.algorithm.strip().lower()
        if name == "native" and collective not in NATIVE_AS:
            raise ValueError(f"native has no model for {collective.value} (modelled: "
                             f"{', '.join(c.value for c in NATIVE_AS)})")
        if name not in ("auto", "native"):
            name = algorithms.canonical(name)
            if not algorithms.supports(collective, name):
                raise ValueError(f"{name} has no {collective.value}")
        if args.root >= n:
            raise ValueError(f"--root {args.root} is not a participant of -n {n}")
        if name == "auto" and n > AUTO_LIMIT:
            raise ValueError(f"-n {n}: auto compares its candidates by their plans, at most "
                             f"{AUTO_LIMIT:,} participants; name an algorithm (ring, "
                             "rechd/ring, native, ...) to price any count")
        group = per if n // per > 1 else 0  # the hosts are the groups by default
        if args.group_size:
            if n % args.group_size:
                raise ValueError(f"--group-size {args.group_size} does not divide -n {n}")
            group = args.group_size if n // args.group_size > 1 else 0
        if "/" in name and not group:
            given = (f"--group-size {args.group_size}" if args.group_size else
                     f"--nodes {args.nodes}" if args.nodes else "")
            if given:  # (groups of every participant: one group, nothing above it)
                raise ValueError(f"{name} is two-level, and {given} makes one group of all "
                                 f"{n}: pass a group size that divides -n into two or more")
            raise ValueError(f"{name} is two-level: pass --group-size G or --nodes COUNTxPER")
    except ValueError as exc:
        args.parser.error(str(exc))
    guessed = ([c for c in ("proc", "host", "net") if c not in fabric.probed]
               if fabric.probed is not None else [])
    note = f" ({', '.join(guessed)}: the transport's defaults, not measured)" if guessed else ""
    print(f"# {n} participant{'' if n == 1 else 's'}, {_where(n, per)}; {fabric.source}{note}")
    for nbytes in args.bytes:
        if name == "auto":
            placement = Placement.nodes(n // per, per, processes=not args.threads)
            groups = Placement.nodes(n // group, group).hosts if args.group_size and group else None
            print(select.explain(select.decide(collective, n, nbytes, fabric, placement,
                                               groups=groups)))
            continue
        p = _priced(args, name, collective, nbytes, fabric, per, group)
        assert p is not None  # (native: a modelled collective, checked above)
        print(_line(p, n, nbytes))
        print(p.critical_path(args.rounds))
    return 0


def _priced(args: argparse.Namespace, name: str, collective: Collective, nbytes: int,
            fabric: Fabric, per: int, group: int):
    """One algorithm's prediction (or the transport's own, 'native') in closed form."""
    n = args.participants
    hosts = per if n // per > 1 else 0

    def pricing(algorithm: str, on: Fabric, root: int = 0, shards: int = 0, layout: int = 0):
        return price(collective, algorithm, n, nbytes, on, per=hosts, processes=not args.threads,
                     root=root, shards=shards, group=layout)

    if name == "native":
        return predict_native("native", collective, n, nbytes, fabric, pricing=pricing)
    return pricing(name, fabric, args.root, args.shards,
                   group if "/" in name or args.shards else 0)


def _where(n: int, per: int) -> str:
    return "one host" if n // per <= 1 else f"{n // per} hosts x {per}"
