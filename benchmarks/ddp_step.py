"""DDP step time with the library's communication hook against DDP over gloo, on MPI ranks.

Each rank builds the same model twice: once under DDP over the library (``process_group(comm)``
and ``allreduce_hook``, the mean; with ``--fp16`` also a third copy with
``compression="fp16"``), once under DDP over a gloo group (its built-in all-reduce, the
mean). A step is forward, backward (DDP's buckets all-reduced while it runs) and an SGD step.
Models (``-m``):

* ``resnet50``: parameters of ResNet-50's 161 shapes (25.6 M float32, 97.5 MiB) and almost
  no computation (the loss is a weighted sum of each parameter), so the step is DDP's own work
  and its all-reduces: what communication costs;
* ``mlp``: a 4-layer MLP, 1024 wide (3.2 M parameters), batch 64: some computation for the
  all-reduces to overlap.

Each repeat times ``-c`` steps of every way back to back (the slowest rank's wall time, after
a barrier), the ways in an order rotated from repeat to repeat, so a slow moment of a shared
machine falls on all of them alike; a cell is the median over repeats, and each ratio's 90%
interval a paired bootstrap over the repeats (``gpu_stats.ratio``).

Run it as a plain script; it launches ``mpiexec`` beside this Python itself::

    python benchmarks/ddp_step.py [-p 2] [-m resnet50 mlp] [-r 9] [-c 3] [--fp16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_stats  # noqa: E402  (interleaved repeats' ratio and interval)
from gpu_peers import resnet50_shapes  # noqa: E402


def build(name: str, torch):
    """The model ``name`` and a function making one rank's batch for it."""
    if name == "resnet50":
        class Weighted(torch.nn.Module):
            """ResNet-50's parameter shapes; the loss weighs each parameter by the input."""

            def __init__(self):
                super().__init__()
                self.weights = torch.nn.ParameterList(
                    torch.nn.Parameter(torch.full(s, 0.01)) for s in resnet50_shapes())

            def forward(self, x):
                return sum((p.sum() * x) for p in self.weights)

        return Weighted(), lambda: torch.ones(())
    width = 1024
    layers = [torch.nn.Linear(width, width) if k < 3 else torch.nn.Linear(width, 16)
              for k in range(4)]
    net = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())][:-1])
    generator = torch.Generator().manual_seed(0)
    return net, lambda: torch.randn(64, width, generator=generator)


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from collectives.adapters import torch_ddp
    from mpi4py import MPI
    from torch.nn.parallel import DistributedDataParallel as DDP

    import collectives

    world = MPI.COMM_WORLD
    comm = collectives.init(timeout=300)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=comm.rank,
                            world_size=comm.size)
    rows = []
    for name in args.models:
        ways = {}
        options = {"library": {}, **({"library fp16": {"compression": "fp16"}} if args.fp16 else {})}
        for way, kwargs in options.items():
            net, batch = build(name, torch)
            ddp = DDP(net, process_group=torch_ddp.process_group(comm))
            torch_ddp.register(ddp, comm, **kwargs)
            ways[way] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-6), batch)
        net, batch = build(name, torch)
        gloo = DDP(net)
        ways["gloo"] = (gloo, torch.optim.SGD(gloo.parameters(), lr=1e-6), batch)

        def step(way, ways=ways):
            ddp, opt, batch = ways[way]
            opt.zero_grad()
            ddp(batch()).sum().backward()
            opt.step()

        def fence():
            world.Barrier()

        times = gpu_stats.interleaved({w: (lambda w=w: step(w)) for w in ways}, fence,
                                      args.repeats, args.calls)
        # repeat r of a way at its slowest rank (every rank has the same ways, in one order)
        slowest = {w: [max(v) for v in zip(*world.allgather(t))] if isinstance(t, list) else t
                   for w, t in sorted(times.items())}
        params = sum(p.numel() for p in net.parameters())
        row = {"model": name, "parameters": params, "ranks": comm.size,
               "ms": {w: 1e3 * sorted(t)[len(t) // 2] for w, t in slowest.items()
                      if isinstance(t, list)},
               "repeats_ms": {w: [1e3 * x for x in t] for w, t in slowest.items()
                              if isinstance(t, list)},
               "errors": {w: t for w, t in slowest.items() if not isinstance(t, list)},
               "ratios": {f"{w} / gloo": gpu_stats.ratio(slowest, w, "gloo") for w in options}}
        rows.append(row)
        if comm.rank == 0:
            print(f"# {name}: {params:,} parameters, {comm.size} ranks, {args.repeats} repeats "
                  f"of {args.calls} steps: median ms per step (slowest rank)", flush=True)
            for way, ms in row["ms"].items():
                ratio = row["ratios"].get(f"{way} / gloo")
                text = (f"  {ratio['ratio']:.2f}x gloo [{ratio['interval'][0]:.2f}, "
                        f"{ratio['interval'][1]:.2f}]" if ratio else "")
                print(f"{way:<14} {ms:>9.2f} ms{text}", flush=True)
            for way, error in row["errors"].items():
                print(f"{way}: {error}", flush=True)
    if comm.rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
                       "when": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, f, indent=1)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", "--ranks", type=int, default=2)
    parser.add_argument("-m", "--models", nargs="+", default=["resnet50", "mlp"],
                        choices=["resnet50", "mlp"])
    parser.add_argument("-r", "--repeats", type=int, default=9)
    parser.add_argument("-c", "--calls", type=int, default=3, help="steps per way per repeat")
    parser.add_argument("--fp16", action="store_true", help="also time compression='fp16'")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args)
        return
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    with tempfile.TemporaryDirectory() as scratch:
        command = [mpiexec, "-n", str(args.ranks), sys.executable, os.path.abspath(__file__),
                   "--rank", "-m", *args.models, "-r", str(args.repeats), "-c", str(args.calls),
                   "--store", os.path.join(scratch, "store")]
        command += ["--fp16"] if args.fp16 else []
        if args.json:
            command += ["--json", os.path.abspath(args.json)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        sys.exit(subprocess.run(command, env=env).returncode)


if __name__ == "__main__":
    main()
