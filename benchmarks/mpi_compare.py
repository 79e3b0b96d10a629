"""All-reduce across MPI processes: this library next to mpi4py's Allreduce (and torch gloo).

Run it as a plain script; it launches everything itself (``mpiexec`` beside this Python):

    python benchmarks/mpi_compare.py [-p 2 4] [-s 4K 64K 1M 16M 64M] [-r 7] [--json out.json]

For each rank count it runs, float32, per size, in one launch:

* mpi4py ``Comm.Allreduce(x, out)`` (MPICH's own, blocking, preallocated output);
* this library's ``comm.all_reduce(x, "sum", algorithm, out=out)`` for ``auto``, ``native``
  and every schedule, with the default cross-rank check; ``auto`` also with ``check=False``,
  without ``out=`` (results from the pool of mapped memory), and as a prepared call
  (``comm.all_reduce_init(x, out=out)``, then ``start().wait()``); ``shm`` and ``auto`` in
  place on an array every rank maps (``comm.shared_empty``: each rank reads the others'
  slices where they lie, the bound's own traffic; its values grow from call to call, which
  costs the additions nothing); ``auto`` again on a
  communicator whose cost model was calibrated by this very launch (links, overheads and
  MPICH's all-reduce at these sizes: ``collectives.api.calibration.measure``);
* with ``--overlap``: a 64 MiB ``async_op=True`` all-reduce issued before a NumPy compute loop
  of about the same length, then waited on, against the two back to back;
* torch.distributed gloo ``all_reduce`` (a separate ``mpiexec`` launch that uses MPI only to
  start the processes; rendezvous over 127.0.0.1), when torch is installed;
* the SPMD bound of ``ceiling.py`` (``ceiling.SpmdShare``: each rank reduces its slice and
  copies the others', every rank at once), and that bound plus the copy-in that exposes private
  inputs through shared memory, and the pushed bound (each rank writes its reduced blocks into
  every rank's output: reads S, writes S), timed like methods; every cell says its time over
  the bound and over the pushed bound.

Protocol: each repeat starts with a barrier, times ``ITERS[size]`` back-to-back calls, takes
the max over ranks of the per-call time; every method runs once per repeat, in an order
rotated from repeat to repeat (a burst of noise on a shared machine hits them all alike);
cells are medians over repeats. busbw = bytes / time * 2 (p - 1) / p (nccl-tests). Results
are checked before timing. ``OMP_NUM_THREADS=1``.
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
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCHEDULES = ("ring", "rechd", "tree", "shuffle", "one_device")
ITERS = {4 << 10: 1000, 64 << 10: 300, 1 << 20: 40, 16 << 20: 5, 64 << 20: 3}
BASE = "mpi4py Allreduce"
BOUND = "bound (SPMD share)"
BOUND_COPY_IN = "bound + copy-in"
BOUND_PUSH = "bound, pushed (reads S, writes S)"


def iters_for(nbytes: int) -> int:
    for limit in sorted(ITERS):
        if nbytes <= limit:
            return ITERS[limit]
    return 2


def parse_size(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


# --- workers (run under mpiexec) -----------------------------------------------------------------

def timed(fn, iters: int, barrier, reduce_max) -> float:
    """One repeat: the max over ranks of the time per call of ``iters`` back-to-back calls,
    after one untimed call (the first call after another method's pays for what that one
    left behind: after MPICH's own 16 MiB all-reduce, about 0.4 ms more for any method)."""
    fn()
    barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return reduce_max((time.perf_counter() - start) / iters)


def interleaved(calls: dict, iters: int, repeats: int, barrier, reduce_max) -> dict:
    names = list(calls)
    times: dict = {name: [] for name in names}
    for rep in range(repeats):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(timed(calls[name], iters, barrier, reduce_max))
    return times


def mpi_calls(world, checked, unchecked, x, out, calibrated=None) -> dict:
    """name -> (communicator or None, call) for one size."""
    calls: dict[str, tuple[Any, Callable[[], Any]]] = {BASE: (None, lambda: world.Allreduce(x, out))}
    if calibrated is not None:
        calls["collectives auto, calibrated"] = (calibrated, lambda: calibrated.all_reduce(
            x, out=out))
    def named(name: str) -> Callable[[], Any]:
        return lambda: checked.all_reduce(x, "sum", name, out=out)

    for name in ("auto", "native", "shm", *SCHEDULES):
        calls[f"collectives {name}"] = (checked, named(name))
    calls["collectives auto, check=False"] = (unchecked, lambda: unchecked.all_reduce(x, out=out))
    calls["collectives auto, no out="] = (checked, lambda: checked.all_reduce(x))
    prepared = checked.all_reduce_init(x, out=out)
    calls["collectives prepared"] = (checked, lambda: prepared.start().wait())
    for name in ("shm", "auto"):  # (one array each: the check is each one's first call)
        shared = checked.shared_empty(x.shape, x.dtype)  # (collective: every rank, every size)
        shared[:] = x
        calls[f"collectives {name}, shared in place"] = (
            checked, lambda name=name, shared=shared: checked.all_reduce(shared, "sum", name, out=shared))
    return calls


def bound_calls(p: int, nbytes: int) -> dict:
    """The SPMD bound's kernels (``ceiling.SpmdShare``) as methods without a communicator."""
    sys.path.insert(0, HERE)
    import ceiling

    return {BOUND: ceiling.SpmdShare(p, nbytes), BOUND_COPY_IN: ceiling.SpmdShare(p, nbytes, True),
            BOUND_PUSH: ceiling.SpmdShare(p, nbytes, push=True)}


def ran_by(comm: Any) -> str | None:
    """What the latest call ran: a schedule, or "native" and which of the transport's own
    ("native mpi", "native shm")."""
    if comm is None:
        return None
    name = comm.last_algorithm or "native"
    own = getattr(comm.transport.native, "last", None)
    return f"{name} {own}" if name == "native" and own else name


def mpi_worker(sizes: list[int], repeats: int, methods: list[str]) -> dict:
    sys.path.insert(0, ROOT)
    from collectives.backends import mpi
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    p, rank = world.size, world.rank
    checked = mpi.init(timeout=120)
    unchecked = mpi.init(timeout=120, check=False)
    calibrated = None
    if not methods or any(m in "collectives auto, calibrated" for m in methods):
        from collectives.api import calibration

        calibrated = mpi.init(timeout=120)  # auto on constants measured by this job
        calibrated.fabric = calibration.measure(calibrated, sizes=tuple(sizes),
                                                collectives=("all_reduce",))
        if rank == 0:
            print("  calibrated:", calibrated.fabric.describe().replace("\n", "; "), flush=True)
    reduce_max = lambda t: world.allreduce(t, op=MPI.MAX)  # noqa: E731
    results: dict = {}
    for nbytes in sizes:
        count = nbytes // 4
        x = np.full(count, rank + 1, np.float32)
        want = np.full(count, p * (p + 1) // 2, np.float32)
        out = np.empty_like(x)
        calls = {k: v for k, v in mpi_calls(world, checked, unchecked, x, out,
                                            calibrated).items()
                 if not methods or k == BASE or any(m in k for m in methods)}
        bounds = bound_calls(p, nbytes)
        ran: dict = {}
        for name, (comm, fn) in calls.items():
            out.fill(0)
            if comm is not None:  # (the hot path of repeated natives leaves both be)
                comm.last_algorithm = comm.transport.native.last = None
            got = fn()
            ok = np.array_equal(got if got is not None else out, want)
            if not world.allreduce(ok, op=MPI.LAND):
                raise AssertionError(f"{name} at {nbytes} B gave a wrong result")
            ran[name] = ran_by(comm)
        ran.update(dict.fromkeys(bounds))
        times = interleaved({**{k: fn for k, (_, fn) in calls.items()}, **bounds},
                            iters_for(nbytes), repeats, world.Barrier, reduce_max)
        for name in ran:
            results.setdefault(name, {})[str(nbytes)] = {"times": times[name], "ran": ran[name]}
            if rank == 0:
                print(f"  p={p} {human(nbytes):>7} {name:<32} "
                      f"{statistics.median(times[name]) * 1e6:10.1f} us  ran={ran[name]}",
                      flush=True)
    checked.free()
    unchecked.free()
    if calibrated is not None:
        calibrated.free()
    return results


def overlap_worker(nbytes: int, repeats: int) -> dict:
    """Communication and computation, back to back and overlapped (async_op=True)."""
    sys.path.insert(0, ROOT)
    from collectives.backends import mpi
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    comm = mpi.init(timeout=120)
    reduce_max = lambda t: world.allreduce(t, op=MPI.MAX)  # noqa: E731
    x = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x)
    a = np.ones(1 << 20, np.float64)

    def compute(rounds: int) -> None:
        for _ in range(rounds):
            np.multiply(a, 1.0000001, out=a)

    comm.all_reduce(x, out=out)
    t_comm = statistics.median(timed(lambda: comm.all_reduce(x, out=out), 1, world.Barrier,
                                     reduce_max) for _ in range(repeats))
    rounds = 10
    for _ in range(2):  # scale the loop until it takes about as long as the all-reduce
        took = statistics.median(timed(lambda r=rounds: compute(r), 1, world.Barrier, reduce_max)
                                 for _ in range(3))
        rounds = max(1, round(rounds * t_comm / took))

    def both() -> None:
        comm.all_reduce(x, out=out)
        compute(rounds)

    def overlapped() -> None:
        work = comm.all_reduce(x, out=out, async_op=True)
        compute(rounds)
        work.wait()

    times = interleaved({"back to back": both, "overlapped": overlapped,
                         "compute alone": lambda: compute(rounds)}, 1, repeats, world.Barrier,
                        reduce_max)
    comm.free()
    return {"comm alone": [t_comm], **times, "ran": comm.last_algorithm}


def gloo_worker(sizes: list[int], repeats: int, port: int) -> dict:
    import torch
    import torch.distributed as dist

    rank, p = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    torch.set_num_threads(1)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "GLOO_SOCKET_IFNAME": "lo"})
    dist.init_process_group("gloo", rank=rank, world_size=p)
    reduce_max = lambda t: (lambda v: (dist.all_reduce(v, op=dist.ReduceOp.MAX),  # noqa: E731
                                       float(v))[1])(torch.tensor(t, dtype=torch.float64))
    results: dict = {"torch gloo": {}}
    for nbytes in sizes:
        x = torch.full((nbytes // 4,), float(rank + 1))
        dist.all_reduce(x)
        assert bool((x == p * (p + 1) // 2).all()), "gloo gave a wrong result"
        times = [timed(lambda x=x: dist.all_reduce(x), iters_for(nbytes), dist.barrier,
                       reduce_max) for _ in range(repeats)]
        results["torch gloo"][str(nbytes)] = {"times": times, "ran": None}
    dist.destroy_process_group()
    return results


# --- driver -------------------------------------------------------------------------------------

def launch(p: int, args: list[str]) -> dict:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
        cmd = [mpiexec, "-n", str(p), sys.executable, os.path.abspath(__file__), "--worker",
               *args, "--out", path]
        proc = subprocess.run(cmd, env=env)
        if proc.returncode != 0 or not os.path.exists(path):
            print(f"(launch failed: {' '.join(cmd)} -> {proc.returncode})", file=sys.stderr)
            return {}
        with open(path) as f:
            return json.load(f)


def table(p: int, sizes: list[int], data: dict) -> str:
    base = data.get(BASE, {})
    gloo = data.get("torch gloo", {})
    bound = data.get(BOUND, {})
    pushed = data.get(BOUND_PUSH, {})
    head = f"| method (p={p}) | " + " | ".join(human(s) for s in sizes) + " |"
    lines = [head, "|---" * (len(sizes) + 1) + "|"]
    for name, cells in data.items():
        row = [name]
        for s in sizes:
            cell = cells.get(str(s))
            if not cell:
                row.append("—")
                continue
            t = statistics.median(cell["times"])
            busbw = s / t * 2 * (p - 1) / p / 1e9
            text = f"{t * 1e6:.1f} µs / {busbw:.2f}"
            if name != BASE and str(s) in base:
                text += f" ({statistics.median(base[str(s)]['times']) / t:.2f}× MPI"
                if str(s) in gloo and name != "torch gloo":
                    text += f", {statistics.median(gloo[str(s)]['times']) / t:.1f}× gloo"
                if str(s) in bound and name != BOUND:
                    text += f", {t / statistics.median(bound[str(s)]['times']):.2f}× bound"
                if str(s) in pushed and name not in (BOUND, BOUND_PUSH):
                    text += f", {t / statistics.median(pushed[str(s)]['times']):.2f}× pushed"
                text += ")"
            if cell.get("ran") and name.startswith("collectives auto"):
                text += f" [{cell['ran']}]"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def overlap_table(p: int, data: dict) -> str:
    cells = {k: statistics.median(v) * 1e3 for k, v in data.items() if k != "ran"}
    return (f"overlap, p={p}, 64 MiB auto [{data.get('ran')}]: comm alone {cells['comm alone']:.1f} ms, "
            f"compute alone {cells['compute alone']:.1f} ms, back to back "
            f"{cells['back to back']:.1f} ms, overlapped {cells['overlapped']:.1f} ms "
            f"({cells['back to back'] / cells['overlapped']:.2f}× back to back)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-p", type=int, nargs="+", default=[2, 4])
    parser.add_argument("-s", "--sizes", nargs="+", default=["4K", "64K", "1M", "16M", "64M"])
    parser.add_argument("-r", "--repeats", type=int, default=7)
    parser.add_argument("-m", "--methods", nargs="*", default=[],
                        help="only methods whose name contains one of these (and mpi4py's)")
    parser.add_argument("--overlap", action="store_true", help="also time the overlap case")
    parser.add_argument("--no-gloo", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--worker", choices=["mpi", "gloo", "overlap"])
    parser.add_argument("--port", type=int, default=29533)
    parser.add_argument("--out")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    if args.worker:
        if args.worker == "mpi":
            result = mpi_worker(sizes, args.repeats, args.methods)
        elif args.worker == "overlap":
            result = overlap_worker(64 << 20, args.repeats)
        else:
            result = gloo_worker(sizes, args.repeats, args.port)
        if int(os.environ.get("PMI_RANK", "0")) == 0:
            with open(args.out, "w") as f:
                json.dump(result, f)
        return
    have_torch = False
    if not args.no_gloo:  # (importing torch alone takes seconds: not when its rows are off)
        try:
            import torch  # noqa: F401
            have_torch = True
        except ImportError:
            print("(torch is not installed: no gloo rows)", file=sys.stderr)
    common = ["-s", *args.sizes, "-r", str(args.repeats)]
    everything: dict[str, Any] = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
                  "machine": f"{platform.node()} {os.cpu_count()} CPUs {platform.processor()}",
                  "command": " ".join([os.path.basename(sys.executable), *sys.argv]), "runs": {}}
    tables = []
    for p in args.p:
        data = launch(p, ["mpi", *common, *(["-m", *args.methods] if args.methods else [])])
        if have_torch:
            data.update(launch(p, ["gloo", *common, "--port", str(args.port + p)]))
        everything["runs"][str(p)] = data
        tables.append(table(p, sizes, data))
        if args.overlap:
            overlap = launch(p, ["overlap", *common])
            everything["runs"][f"{p} overlap"] = overlap
            if overlap:
                tables.append(overlap_table(p, overlap))
    print("\nCells: median µs per call / busbw GB/s (speed-up over mpi4py's Allreduce, "
          "over gloo; time over the SPMD bound's) [what auto ran]\n")
    print("\n\n".join(tables))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
