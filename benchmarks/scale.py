"""Crossover tables at scale, from the cost model: what ``auto`` picks and the busbw it reaches.

    python benchmarks/scale.py [--clusters gpu cpu] [-n 64 256 1024 4096 16384 65536]
        [-s 4K 64K 1M 16M 256M 1G] [--classic]

For each modelled cluster (``collectives simulate``'s ``--cluster`` presets: 8-GPU nodes with
NVLink and a 400 Gbit/s NIC per GPU; 16-rank CPU nodes sharing one 25 Gbit/s link) and
participant count, prints the all-reduce ``auto`` would run at each size with its predicted
busbw (nccl-tests' ``2 (n-1)/n x size / time``), then the flat ring, recursive
halving-doubling (rechd), binomial tree and two-level ring/ring side by side. ``--classic``
adds the textbook alpha-beta-gamma formulas for the ring and for Rabenseifner's algorithm on
one flat network of the cluster's inter-node link, next to the model's own numbers for
one participant per node. Nothing runs: every number is a prediction (docs/scale.md).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from collectives.algorithms import select  # noqa: E402
from collectives.algorithms.cost import Placement  # noqa: E402
from collectives.algorithms.sampling import predict  # noqa: E402
from collectives.algorithms.schedule import Collective  # noqa: E402
from collectives.tools.simulate import CLUSTERS, parse_size  # noqa: E402

AR = Collective.ALL_REDUCE
COMPARED = ("ring", "rechd", "tree", "ring/ring")


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def busbw(n: int, nbytes: int, seconds: float) -> float:
    return nbytes / seconds * 2 * (n - 1) / n / 1e9


def short(label: str) -> str:
    return label.split(" (")[0]


def crossover(cluster: str, counts, sizes) -> str:
    per, fabric = CLUSTERS[cluster]
    lines = [f"**{cluster}** ({fabric.source}): what auto runs, predicted busbw GB/s", "",
             "| participants | " + " | ".join(human(s) for s in sizes) + " |",
             "|---" * (len(sizes) + 1) + "|"]
    for n in counts:
        placement = Placement.nodes(max(n // per, 1), min(per, n))
        row = []
        for s in sizes:
            d = select.decide(AR, n, s, fabric, placement)
            row.append(f"{short(d.best.label)} {busbw(n, s, d.best.seconds):.3g}")
        lines.append(f"| {n} ({n // per}x{per}) | " + " | ".join(row) + " |")
    return "\n".join(lines)


def side_by_side(cluster: str, counts, sizes) -> str:
    per, fabric = CLUSTERS[cluster]
    lines = [f"**{cluster}**: predicted busbw GB/s of " + ", ".join(COMPARED), "",
             "| participants | size | " + " | ".join(COMPARED) + " |",
             "|---" * (len(COMPARED) + 2) + "|"]
    for n in counts:
        placement = Placement.nodes(max(n // per, 1), min(per, n))
        for s in sizes:
            cells = []
            for name in COMPARED:
                layout = placement.hosts if "/" in name else None
                if "/" in name and layout is None:
                    cells.append("—")
                    continue
                p = predict(AR, name, n, s, fabric, placement, layout=layout)
                cells.append(f"{busbw(n, s, p.seconds):.3g}")
            lines.append(f"| {n} | {human(s)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def classic(cluster: str, counts, sizes) -> str:
    """Ring: 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma; Rabenseifner (p a power of
    two): 2 log2 p alpha + the same bandwidth and reduction terms (Thakur, Rabenseifner and
    Gropp 2005). One participant per node: one flat network."""
    _, fabric = CLUSTERS[cluster]
    a, b, g = fabric.net.alpha, fabric.net.beta, fabric.gamma
    lines = [f"**{cluster}**, one participant per node: classic formula / model, microseconds",
             "", "| p | size | ring | rechd |", "|---|---|---|---|"]
    for p in counts:
        placement = Placement.nodes(p, 1)
        for s in sizes:
            ring = 2 * (p - 1) * a + 2 * (p - 1) / p * s * b + (p - 1) / p * s * g
            rab = 2 * math.log2(p) * a + 2 * (p - 1) / p * s * b + (p - 1) / p * s * g
            got = [predict(AR, name, p, s, fabric, placement).seconds for name in ("ring", "rechd")]
            lines.append(f"| {p} | {human(s)} | {ring * 1e6:.4g} / {got[0] * 1e6:.4g} | "
                         f"{rab * 1e6:.4g} / {got[1] * 1e6:.4g} |")
    return "\n".join(lines)


# Published nccl-tests all-reduce figures (busbw, GB/s, the largest sizes reported), and the
# fabric of each system as this model sees it: NVLink per GPU, the NICs' rate per GPU.
PUBLISHED = (
    ("8x H100, one node (NVLink 4)", 1, 8, 450e9, 50e9, 1 << 30,
     "about 360-480 (ring; NVLS higher): NVIDIA DGX H100 nccl-tests runs"),
    ("2 nodes x 8 H100, 8x 200 Gbit/s TCPXO per node", 2, 8, 450e9, 25e9, 1 << 30,
     "298 at 1 GiB, 339 at 8 GiB (NCCL's choice; lessizzmore/create-a3mega-ztan-fork)"),
    ("5 nodes x 8 H100, 4x 400 Gbit/s RoCE per node", 5, 8, 450e9, 25e9, 1 << 30,
     "ring 190, tree 150 (NVIDIA/nccl#1368)"),
)


def published() -> str:
    """The model's busbw on systems with published nccl-tests figures."""
    from dataclasses import replace

    _, base = CLUSTERS["gpu"]
    lines = ["| system | published busbw | ring | tree | ring/ring | auto |",
             "|---|---|---|---|---|---|"]
    for label, nodes, per, nvlink, nic, size, figure in PUBLISHED:
        fabric = replace(base, host=replace(base.host, beta=1 / nvlink),
                         net=replace(base.net, beta=1 / nic))
        n = nodes * per
        placement = Placement.nodes(nodes, per)
        cells = []
        for name in ("ring", "tree", "ring/ring"):
            if "/" in name and placement.hosts is None:
                cells.append("—")
                continue
            p = predict(AR, name, n, size, fabric, placement,
                        layout=placement.hosts if "/" in name else None)
            cells.append(f"{busbw(n, size, p.seconds):.0f}")
        d = select.decide(AR, n, size, fabric, placement)
        cells.append(f"{short(d.best.label)} {busbw(n, size, d.best.seconds):.0f}")
        lines.append(f"| {label}, {human(size)} | {figure} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clusters", nargs="+", default=sorted(CLUSTERS))
    parser.add_argument("-n", type=int, nargs="+", default=[64, 256, 1024, 4096, 16384, 65536])
    parser.add_argument("-s", "--sizes", nargs="+", default=["4K", "64K", "1M", "16M", "256M", "1G"])
    parser.add_argument("--compare", nargs="+", default=["16M", "1G"],
                        help="sizes of the side-by-side table")
    parser.add_argument("--classic", action="store_true")
    parser.add_argument("--published", action="store_true",
                        help="only the comparison with published nccl-tests figures")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    started = time.perf_counter()
    print(published() + "\n", flush=True)
    if args.published:
        return
    for cluster in args.clusters:
        print(crossover(cluster, args.n, sizes) + "\n", flush=True)
        print(side_by_side(cluster, args.n, [parse_size(s) for s in args.compare]) + "\n",
              flush=True)
        if args.classic:
            print(classic(cluster, [n for n in args.n if n & (n - 1) == 0][:4], sizes) + "\n")
    print(f"({time.perf_counter() - started:.0f} s of predictions)")


if __name__ == "__main__":
    main()
