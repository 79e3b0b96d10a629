"""All-reduce across real hosts: this library next to MPICH's Allreduce, on a lab of namespaces.

Run it as root; it builds the lab itself (``benchmarks/lab.py``: 2 hosts, each link shaped to
2 Gbit/s both ways) and launches everything with ``mpiexec`` beside this Python:

    python benchmarks/multihost_compare.py [--hosts 2] [--ppn 2] [--rate 2gbit]
        [-s 1M 16M 64M] [-r 5] [--netmod ucx] [--lab NAME] [--json out.json]
        [--methods auto ring ...] [--compression fp16 bf16]

Per size (float32, S bytes per rank), in one run, interleaved:

* mpi4py ``Comm.Allreduce(x, out)`` (MPICH's own; the anchor);
* this library's ``comm.all_reduce(x, "sum", algorithm, out=out)`` for ``auto``, ``native``,
  ``ring``, ``rechd`` and the two-level ``ring/ring``, ``rechd/ring``, ``shuffle/ring``, whose
  groups are the nodes MPI found (``Split_type(COMM_TYPE_SHARED)``: one group per host)
  (``--methods`` picks some);
* with ``--compression fp16 bf16``: each method again with ``compression=`` (the wire carries
  float16 or bfloat16, half the bytes of float32), rows named like ``auto fp16``. The inputs
  are small integers, so the compressed sums are exact and checked like the others.

Protocol as ``benchmarks/mpi_compare.py``: each repeat starts with a barrier, times ``ITERS``
back-to-back calls and takes the max over ranks of the time per call; cells are medians over
repeats, each method timed once per repeat in an order rotated from repeat to repeat. Results
are checked before timing.

The network bound. Whatever the algorithm, each host must get the other hosts' contribution
and give its own: with H hosts, each host sends at least 2 (H - 1) / H * S bytes over its link
(a reduce-scatter then an all-gather between the hosts), S for two hosts. At the link rate R
that takes ``2 (H - 1) / H * S / R`` (TCP/IP headers come on top, about 3%). The table gives
each method's time, its ratio to MPICH (above 1: faster), the fraction of the bound it reaches,
and the bytes host 0 really sent per call (counted on its interface, headers included).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import lab  # noqa: E402
from mpi_compare import human, interleaved, parse_size  # noqa: E402

METHODS = ("auto", "native", "ring", "rechd", "ring/ring", "rechd/ring", "shuffle/ring")
ANCHOR = "mpi4py Allreduce"
ITERS = {1 << 20: 10, 16 << 20: 3}  # calls per repeat; larger sizes: 2


def iters_for(nbytes: int) -> int:
    return next((n for limit, n in sorted(ITERS.items()) if nbytes <= limit), 2)


def network_bound(nbytes: int, hosts: int, rate_bits: float) -> float:
    """Seconds each host needs at least to send its share of an all-reduce over its link."""
    return 2 * (hosts - 1) / hosts * nbytes * 8 / rate_bits


# --- worker (runs under mpiexec, one process per rank) ---------------------------------------

# What a call sends is counted over this many calls and the middle count taken: a
# retransmission on the shaped link, or a packet of something else, adds to one call's count,
# and a call's count can also come out short (the least of three once read 1.26 S for the
# ring's 1.5 S; not traced: bytes counted after the closing barrier would do it); the middle
# count is moved by neither one high nor one low call.
COUNTED_CALLS = 3


def sent_bytes() -> int:
    """Bytes this host sent over its lab interface (the host's own /sys: ``ip netns exec``)."""
    with open(f"/sys/class/net/{lab.IFACE}/statistics/tx_bytes") as f:
        return int(f.read())


def worker(sizes: list[int], repeats: int, methods: list[str], compressions: list[str]) -> dict:
    sys.path.insert(0, ROOT)
    from collectives.backends import mpi
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    p, rank = world.size, world.rank
    comm = mpi.init(timeout=300)
    reduce_max = lambda t: world.allreduce(t, op=MPI.MAX)  # noqa: E731
    results: dict = {"groups": [list(g) for g in comm.transport.nodes], "methods": {}}
    for nbytes in sizes:
        x = np.full(nbytes // 4, rank + 1, np.float32)
        want = np.full(nbytes // 4, p * (p + 1) // 2, np.float32)
        out = np.empty_like(x)
        calls = {ANCHOR: lambda x=x, out=out: world.Allreduce(x, out)}
        for name in methods:
            calls[name] = lambda name=name, x=x, out=out: comm.all_reduce(x, "sum", name, out=out)
            for c in compressions:
                calls[f"{name} {c}"] = (lambda name=name, c=c, x=x, out=out: comm.all_reduce(
                    x, "sum", name, out=out, compression=c))
        info = {}
        for name, fn in calls.items():  # check, and count what host 0 sends in one call
            counts = []
            for _ in range(COUNTED_CALLS):
                out.fill(0)
                world.Barrier()
                before = sent_bytes()
                fn()
                world.Barrier()
                counts.append(sent_bytes() - before)
                if not world.allreduce(bool(np.array_equal(out, want)), op=MPI.LAND):
                    raise AssertionError(f"{name} at {human(nbytes)} gave a wrong result")
            wire = sorted(counts)[len(counts) // 2]
            info[name] = {"ran": comm.last_algorithm if name != ANCHOR else None, "wire": wire}
        times = interleaved(calls, iters_for(nbytes), repeats, world.Barrier, reduce_max)
        for name in calls:
            results["methods"].setdefault(name, {})[str(nbytes)] = {"times": times[name],
                                                                    **info[name]}
            if rank == 0:
                print(f"  {human(nbytes):>7} {name:<18} {statistics.median(times[name]) * 1e3:9.1f} ms"
                      f"  host 0 sent {info[name]['wire'] / 2**20:7.1f} MiB  ran={info[name]['ran']}",
                      flush=True)
    return results


# --- driver ------------------------------------------------------------------------------------

def table(sizes: list[int], data: dict, hosts: int, rate_bits: float) -> str:
    base = data[ANCHOR]
    head = "| method | " + " | ".join(human(s) for s in sizes) + " |"
    lines = [head, "|---" * (len(sizes) + 1) + "|"]
    bounds = [network_bound(s, hosts, rate_bits) for s in sizes]
    lines.append("| network bound | " + " | ".join(f"{b * 1e3:.1f} ms" for b in bounds) + " |")
    for name, cells in data.items():
        row = [name]
        for s, bound in zip(sizes, bounds):
            cell = cells[str(s)]
            t = statistics.median(cell["times"])
            text = f"{t * 1e3:.1f} ms"
            if name != ANCHOR:
                text += f" ({statistics.median(base[str(s)]['times']) / t:.2f}× MPI)"
            text += f", {bound / t:.2f} of bound, sends {cell['wire'] / s:.2f} S"
            if name.split()[0] == "auto":
                text += f" [{cell['ran']}]"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def launch(the_lab, args, sizes: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        cmd, env = the_lab.mpiexec(
            [sys.executable, os.path.abspath(__file__), "--worker", "-s", *sizes,
             "-r", str(args.repeats), "--out", path, "--methods", *args.methods,
             "--compression", *args.compression],
            hosts=args.hosts, ranks_per_host=args.ppn, netmod=args.netmod,
            env={"OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT})
        proc = subprocess.run(cmd, env=env)
        if proc.returncode != 0 or not os.path.exists(path):
            raise SystemExit(f"the run failed: {' '.join(cmd)} -> {proc.returncode}")
        with open(path) as f:
            return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--ppn", type=int, default=2, help="ranks per host")
    parser.add_argument("--rate", default="2gbit", help="each link's rate, tc syntax")
    parser.add_argument("-s", "--sizes", nargs="+", default=["1M", "16M", "64M"])
    parser.add_argument("-r", "--repeats", type=int, default=5)
    parser.add_argument("--netmod", default="ucx", choices=sorted(lab.NETWORK_ENV))
    parser.add_argument("--lab", help="use this lab (from `lab.py up`) as it is, rate included")
    parser.add_argument("--json")
    parser.add_argument("--methods", nargs="+", default=list(METHODS),
                        help="the library's algorithms to time (default: all)")
    parser.add_argument("--compression", nargs="*", default=[], choices=["fp16", "bf16"],
                        help="also time each method with compression=")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    if args.worker:
        result = worker(sizes, args.repeats, args.methods, args.compression)
        if int(os.environ.get("PMI_RANK", "0")) == 0:
            with open(args.out, "w") as f:
                json.dump(result, f)
        return
    if args.lab:
        the_lab = lab.Lab.load(args.lab)
        args.rate = the_lab.rate
        result = launch(the_lab, args, args.sizes)
    else:
        reason = lab.available()
        if reason:
            raise SystemExit(reason)
        with lab.Lab(args.hosts, rate=args.rate) as the_lab:
            result = launch(the_lab, args, args.sizes)
    if not args.rate:
        raise SystemExit("the lab's links are not shaped: no network bound to report")
    rate_bits = lab.parse_rate(args.rate)
    print(f"\n{args.hosts} hosts x {args.ppn} ranks, links {args.rate} each way, MPICH over "
          f"{args.netmod}/TCP; node groups {result['groups']}. Cells: median per call (speed-up "
          "over MPICH's Allreduce), fraction of the network bound reached, bytes host 0 sent "
          "per call in units of S [what auto ran]\n")
    print(table(sizes, result["methods"], args.hosts, rate_bits))
    if args.json:
        everything = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
                      "machine": f"{platform.node()} {os.cpu_count()} CPUs",
                      "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                      "hosts": args.hosts, "ranks_per_host": args.ppn, "rate": args.rate,
                      "netmod": args.netmod, **result}
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
