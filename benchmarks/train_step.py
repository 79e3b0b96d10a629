"""A training step's overlap: ResNet-50's gradients all-reduced while a backward pass runs.

ResNet-50's 161 float32 gradient shapes (``--width full``: 102 MB; ``half``, every channel
count halved: 27.7 MB; ``--scale`` further shrinks each tensor for a quick look) are produced
last layer first by a stand-in for the backward pass. Layer k takes its share of ``--compute-ms``
(default: as long as way (a)'s communication alone), a share proportional to its parameters
times the positions they are applied at (convolutions run over 112x112 to 7x7 maps), in one of
two ``--modes``:

* ``idle``: ``time.sleep`` until the layer's deadline: the cores stay idle, as under a GPU;
* ``matmul``: 128x128 float32 NumPy matmuls: the cores are busy computing.

Ways (``B`` = ``--bucket-mb``): (a) ``comm.buckets(grads, bucket_bytes=B)``, ``ready(k, g)``
after each layer, ``wait()`` at the end; (b) the same with ``bucket_bytes=0``; (c) hand-packed
DDP-style buckets (consecutive tensors, the first at most 1 MiB), each copied into its buffer
and started with ``all_reduce(out=buf, async_op=True)`` once complete; (d) mpi4py, the same
buckets by ``Iallreduce``, then ``Waitall``; (g) the same, tested by a thread of its own every
``--poll-ms`` (MPI's own cost beside a compute, with the progress a caller could give it); where
PyTorch imports, DDP (``bucket_cap_mb=B``) over (e) gloo, (f) the library's hook
(``adapters.torch_ddp``) and (h) a hook of mpi4py's ``Iallreduce`` tested as (g), the layers
as a chain of autograd functions whose backward runs the stand-in (see ``train_step_ddp.py``;
ways (a)-(d) and (g) in ``train_step_ways.py``).

Per way and mode: compute alone, communication alone, sequential (compute, then
communication), overlapped, and the overlap efficiency (compute + comm - overlapped) /
min(compute, comm): 1 when the step takes the longer of the two, 0 when it takes their sum.
Protocol: every (way, phase) once per repeat, in an order rotated from repeat to repeat, each
after a barrier; a time is the slowest rank's; cells are medians; intervals (90 %) come from a
paired bootstrap over the repeats (``gpu_stats``). Run it as a plain script; it launches
``mpiexec`` itself, or with ``--lab`` (root) across two hosts of ``lab.py`` at ``--rate``::

    python benchmarks/train_step.py [-p 2] [--width half] [--bucket-mb 6] [-r 7] [--lab]
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
from collections.abc import Callable
from functools import partial
from math import prod

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_stats  # noqa: E402  (interleaved repeats, ratios with intervals)
from gpu_peers import resnet50_shapes  # noqa: E402
from train_step_ways import numpy_ways  # noqa: E402

BLOCK = 128  # the matmul stand-in's block size


def shapes(width: str, scale: float) -> list[tuple[int, ...]]:
    """ResNet-50's gradient shapes in forward order; ``half``: every channel count halved
    (not the 3 input channels, not the 1000 classes)."""
    out = []
    for s in resnet50_shapes():
        if width == "half":
            s = ((s[0] // 2, s[1] if s[1] == 3 else s[1] // 2, *s[2:]) if len(s) == 4 else
                 (s[0], s[1] // 2) if len(s) == 2 else s if s == (1000,) else (s[0] // 2,))
        out.append(s if scale >= 1 else (max(1, int(s[0] * scale)), *s[1:]))
    return out


def positions() -> list[int]:
    """Where each tensor of ``resnet50_shapes`` is applied: the output map's positions."""
    out = [112 * 112] * 3
    for blocks, side in ((3, 56), (4, 28), (6, 14), (3, 7)):
        out += [side * side] * (9 * blocks + 3)
    return out + [1, 1]


class Backward:
    """The stand-in for the backward pass: layer k (backward order) ends at its deadline
    (``idle``) or after its share of matmul blocks (``matmul``); ``total`` seconds in all."""

    def __init__(self, shapes_fw: list, total: float, mode: str, block_seconds: float):
        work = np.array([prod(s) * p for s, p in zip(shapes_fw, positions(), strict=True)][::-1],
                        float)
        share = np.cumsum(work) / work.sum()
        self.mode, self.n = mode, len(work)
        self.deadlines = share * total
        self.blocks = np.rint(share * total / block_seconds).astype(int)
        self.a = np.ones((BLOCK, BLOCK), np.float32)
        self.out = np.empty_like(self.a)
        self.t0, self.done = 0.0, 0

    def layer(self, k: int) -> None:
        if k == 0:
            self.t0, self.done = time.perf_counter(), 0
        if self.mode == "idle":
            left = self.t0 + self.deadlines[k] - time.perf_counter()
            if left > 0:
                time.sleep(left)
        elif self.mode == "matmul":
            for _ in range(self.blocks[k] - self.done):
                np.matmul(self.a, self.a, out=self.out)
            self.done = self.blocks[k]

    def run(self, on_ready=None) -> None:
        for k in range(self.n):
            self.layer(k)
            if on_ready is not None:
                on_ready(k)


def block_seconds() -> float:
    a, out = np.ones((BLOCK, BLOCK), np.float32), np.empty((BLOCK, BLOCK), np.float32)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(50):
            np.matmul(a, a, out=out)
        best = min(best, (time.perf_counter() - start) / 50)
    return best


def bucket_trace(comm, grads: list, bucket_bytes: int, backward: Backward) -> list[dict]:
    """One overlapped step of way (a): each bucket's size, when it started and finished (ms
    from the first layer's start), and when the compute loop ended."""
    buckets = comm.buckets(grads, bucket_bytes=bucket_bytes)
    for k, g in enumerate(grads):  # (a warm step: the buckets' first calls agree on them)
        buckets.ready(k, g)
    buckets.wait()
    comm.barrier()
    rows: list[dict] = []

    def ready(k: int) -> None:
        before = buckets.started
        buckets.ready(k, grads[k])
        for work in buckets.pending[before:]:
            row = {"started_ms": 1e3 * (time.perf_counter() - backward.t0), "layer": k}
            work.add_done_callback(
                lambda _w, row=row: row.update(done_ms=1e3 * (time.perf_counter() - backward.t0)))
            rows.append(row)

    backward.run(ready)
    end = 1e3 * (time.perf_counter() - backward.t0)
    buckets.wait()
    first = 0
    for row in rows:  # (each ready(k) starts at most one bucket: runs end at k)
        row["bytes"] = sum(g.nbytes for g in grads[first:row["layer"] + 1])
        first = row["layer"] + 1
    return rows + [{"compute_end_ms": end}]


def efficiency(c, m, o, seed: int = 0) -> dict:
    """(compute + comm - overlapped) / min(compute, comm) of the medians, with the paired
    bootstrap's interval over the repeats."""
    c, m, o = (np.asarray(v, float) for v in (c, m, o))
    n = min(len(c), len(m), len(o))
    med = np.median

    def eff(cc, mm, oo):
        return (med(cc, -1) + med(mm, -1) - med(oo, -1)) / np.minimum(med(cc, -1), med(mm, -1))

    pick = np.random.default_rng(seed).integers(0, n, size=(gpu_stats.DRAWS, n))
    boot = eff(c[:n][pick], m[:n][pick], o[:n][pick])
    lo, hi = np.quantile(boot, [(1 - gpu_stats.LEVEL) / 2, (1 + gpu_stats.LEVEL) / 2])
    return {"efficiency": float(eff(c[:n], m[:n], o[:n])), "interval": [float(lo), float(hi)]}


def rank_main(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    import collectives

    world = MPI.COMM_WORLD
    comm = collectives.init(timeout=300)
    bucket_bytes = int(args.bucket_mb * 2**20)
    fw = shapes(args.width, args.scale)
    grads = [np.full(s, 0.5, np.float32) for s in fw[::-1]]  # backward order
    ways = numpy_ways(comm, world, grads, bucket_bytes, args.poll_ms / 1e3)
    for name, (ready, wait) in ways.items():  # checked once before timing
        for k, g in enumerate(grads):
            ready(k, g)
        assert all((r == 0.5 * comm.size).all() for r in wait()), name
    a_ready, a_wait = next(iter(ways.values()))

    def comm_only(ready, wait) -> None:
        for k, g in enumerate(grads):
            ready(k, g)
        wait()

    def sequential(ready, wait, backward: Backward) -> None:
        backward.run()
        comm_only(ready, wait)

    def overlapped(ready, wait, backward: Backward) -> None:
        backward.run(lambda k: ready(k, grads[k]))
        wait()

    def timed(step: Callable[[], object]) -> float:
        """The median of 3 steps' slowest rank."""
        took = []
        for _ in range(3):
            world.Barrier()
            start = time.perf_counter()
            step()
            took.append(world.allreduce(time.perf_counter() - start, op=MPI.MAX))
        return sorted(took)[1]

    # (a)'s communication alone sets the compute time unless given
    total = args.compute_ms / 1e3 if args.compute_ms else timed(partial(comm_only, a_ready, a_wait))
    # ... and its CPU time on each rank (every thread, user and system): what the communication
    # can take from a compute beside it where no core is idle (at most: MPI's waits spin, so
    # part of it is waiting, which a rank that computes does not do)
    cpu = []
    for _ in range(5):
        world.Barrier()
        start = time.process_time()
        comm_only(a_ready, a_wait)
        cpu.append(time.process_time() - start)
    comm_cpu_ms = 1e3 * max(world.allgather(float(np.median(cpu))))
    block = world.allreduce(block_seconds(), op=MPI.MAX)
    for _ in range(2):  # a block's time with every rank computing, as in the step
        block *= timed(Backward(fw, total, "matmul", block).run) / total
    ddp = None
    if not args.no_ddp:
        try:
            import train_step_ddp
            ddp = train_step_ddp.DdpWays(comm, fw, bucket_bytes, args.store, args.poll_ms / 1e3)
        except ImportError as exc:
            if comm.rank == 0:
                print(f"# DDP ways left out: {exc}", flush=True)
    result: dict = {"host": platform.node(), "cpus": os.cpu_count(), "ranks": comm.size,
                    "width": args.width, "scale": args.scale, "bucket_bytes": bucket_bytes,
                    "bytes": sum(g.nbytes for g in grads), "compute_ms": total * 1e3,
                    "lab": args.lab_rate, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "loadavg": os.getloadavg()[0], "comm_cpu_ms": comm_cpu_ms, "modes": {}}
    for mode in args.modes:
        backward = Backward(fw, total, mode, block)
        items: dict[tuple[str, str], Callable[[], object]] = {("numpy", "compute"): backward.run}
        for name, (ready, wait) in ways.items():
            items[(name, "comm")] = partial(comm_only, ready, wait)
            items[(name, "sequential")] = partial(sequential, ready, wait, backward)
            items[(name, "overlapped")] = partial(overlapped, ready, wait, backward)
        if ddp is not None:
            items.update(ddp.items(backward))
        keys = list(items)
        times = gpu_stats.interleaved({f"{w}|{p}": items[(w, p)] for w, p in keys},
                                      world.Barrier, args.repeats, 1, warmup=1)
        slowest = {k: [max(v) for v in zip(*world.allgather(t))] for k, t in sorted(times.items())
                   if isinstance(t, list)}
        errors = {k: t for k, t in times.items() if not isinstance(t, list)}
        rows = []
        for way in dict.fromkeys(w for w, p in keys if p == "overlapped"):
            base = "torch" if way.startswith(("(e)", "(f)", "(h)")) else "numpy"
            c, m = slowest.get(f"{base}|compute"), slowest.get(f"{way}|comm")
            s, o = slowest.get(f"{way}|sequential"), slowest.get(f"{way}|overlapped")
            if not (c and m and s and o):
                continue
            rows.append({"way": way, **{f"{ph}_ms": 1e3 * float(np.median(v)) for ph, v in
                                         (("compute", c), ("comm", m), ("sequential", s),
                                          ("overlapped", o))},
                         "overlapped/sequential": gpu_stats.ratio({"o": o, "s": s}, "o", "s"),
                         **efficiency(c, m, o)})
        ratios = {}
        if ddp is not None:
            for phase in ("comm", "overlapped"):
                for way, name in ((ddp.hook, "(f)"), (ddp.mpi, "(h)")):
                    ratios[f"{name}/(e) {phase}"] = gpu_stats.ratio(
                        slowest, f"{way}|{phase}", f"{ddp.gloo}|{phase}")
        trace = bucket_trace(comm, grads, bucket_bytes, backward)
        result["modes"][mode] = {"rows": rows, "ratios": ratios, "errors": errors,
                                 "bucket_trace": trace, "repeats_s": slowest}
        if comm.rank == 0:
            report(mode, result, rows, ratios, errors, trace)
    if comm.rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if ddp is not None:
        ddp.close()


def report(mode: str, result: dict, rows: list, ratios: dict, errors: dict, trace: list) -> None:
    def iv(x: dict) -> str:
        return f"[{x['interval'][0]:.2f}, {x['interval'][1]:.2f}]"

    print(f"\n## {mode}: {result['bytes'] / 1e6:.1f} MB in 161 tensors, {result['ranks']} ranks, "
          f"compute {result['compute_ms']:.0f} ms, load average {result['loadavg']:.1f}\n\n"
          "| way | compute ms | comm ms | sequential ms | overlapped ms | overlapped / "
          "sequential | overlap efficiency |\n|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = r["overlapped/sequential"]
        print(f"| {r['way']} | {r['compute_ms']:.1f} | {r['comm_ms']:.1f} | "
              f"{r['sequential_ms']:.1f} | {r['overlapped_ms']:.1f} | {ratio['ratio']:.2f} "
              f"{iv(ratio)} | {r['efficiency']:.2f} {iv(r)} |")
    print(f"\nway (a), communication alone: {result['comm_cpu_ms']:.1f} ms of CPU time on the "
          "busiest rank (all its threads, user and system)")
    for name, x in ratios.items():
        if x:
            print(f"\nDDP step, {name}: {x['ratio']:.2f}x {iv(x)}")
    for name, error in errors.items():
        print(f"\n{name}: {error}")
    end = trace[-1]["compute_end_ms"]
    print(f"\nway (a), one overlapped step: compute ends at {end:.1f} ms; buckets "
          "(MiB, started at ms, done at ms): " + ", ".join(
              f"{r['bytes'] / 2**20:.1f} {r['started_ms']:.1f}-{r.get('done_ms', float('nan')):.1f}"
              for r in trace[:-1]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", "--ranks", type=int, default=2)
    parser.add_argument("-r", "--repeats", type=int, default=7)
    parser.add_argument("--width", choices=["half", "full"], default="half")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="shrink every tensor's first dimension by this factor")
    parser.add_argument("--bucket-mb", type=float, default=6.0, help="B, in MiB")
    parser.add_argument("--modes", nargs="+", choices=["idle", "matmul"], default=["idle", "matmul"])
    parser.add_argument("--compute-ms", type=float, default=0,
                        help="the backward pass's compute (default: way (a)'s communication)")
    parser.add_argument("--poll-ms", type=float, default=0.2,
                        help="how often the threads of ways (g) and (h) test MPI's requests (ms)")
    parser.add_argument("--no-ddp", action="store_true", help="leave out the DDP ways")
    parser.add_argument("--lab", action="store_true", help="across two hosts of lab.py (root)")
    parser.add_argument("--rate", default="1gbit", help="the lab's links, tc syntax")
    parser.add_argument("--json", help="write every repeat and row here")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--lab-rate", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args)
        return
    with tempfile.TemporaryDirectory() as scratch:
        argv = [sys.executable, os.path.abspath(__file__), "--rank", "-r", str(args.repeats),
                "--width", args.width, "--scale", str(args.scale), "--bucket-mb",
                str(args.bucket_mb), "--modes", *args.modes, "--compute-ms", str(args.compute_ms),
                "--poll-ms", str(args.poll_ms),
                "--store", os.path.join(scratch, "store")]
        argv += ["--no-ddp"] if args.no_ddp else []
        argv += ["--json", os.path.abspath(args.json)] if args.json else []
        env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        if not args.lab:
            mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
            sys.exit(subprocess.run([mpiexec, "-n", str(args.ranks), *argv],
                                    env=dict(os.environ, **env)).returncode)
        import lab

        reason = lab.available()
        if reason:
            sys.exit(f"--lab: {reason}")
        with lab.Lab(2, rate=args.rate) as the_lab:
            cmd, full = the_lab.mpiexec(argv + ["--lab-rate", args.rate], hosts=2, env={
                **env, "PYTHONPATH": os.path.dirname(HERE), "GLOO_SOCKET_IFNAME": lab.IFACE})
            sys.exit(subprocess.run(cmd, env=full).returncode)


if __name__ == "__main__":
    main()
