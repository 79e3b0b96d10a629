"""Overlap on the card: a compute kernel of about 1 ms on the caller's stream beside an
asynchronous out-of-place all-reduce of 256 MiB on the library's one-rank NCCL communicator
(``gpu_peers.py`` runs it as the ``overlap`` part).

A step issues the all-reduce (``async_op=True``, into ``out=``: on one rank NCCL copies the
256 MiB), enqueues the kernel on the caller's current stream, then ``wait()``s. The all-reduce
runs on the communicator's stream, so the kernel need not wait for it: the step should take
about as long as the longer of the two, not their sum. Interleaved with the step: the kernel
alone and the all-reduce alone (issue + ``wait()``). Per repeat, their sum and the longer of
them; the ratios ``step/sum`` (1: no overlap) and ``step/longer`` (1: full overlap) come with
paired-bootstrap intervals. The kernel spins one thread block on the clock (``clock64``),
calibrated to about 1 ms, so it leaves the copy the card's bandwidth; CuPy arrays, and
PyTorch tensors (the kernel: ``torch.cuda._sleep``) where PyTorch sees the GPU. Under the NumPy
stand-in for CuPy the kernel is an elementwise multiply (a dry run: no numbers).
"""

from __future__ import annotations

import time
from pathlib import Path

from gpu_compare import Record
from gpu_peers import fence_for, library, torch_dist
from gpu_stats import brief, interleaved, row

TARGET_SECONDS = 1e-3


def _spin_kernel():
    """``spin(cycles)`` on CuPy's current stream, or None where CuPy has no RawKernel."""
    import cupy

    if not hasattr(cupy, "RawKernel"):
        return None
    kernel = cupy.RawKernel(r'''
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}''', "spin")
    return lambda cycles: kernel((1,), (1,), (cupy.int64(cycles),))


def _calibrated(run, fence) -> tuple[int, float]:
    """Cycles for about ``TARGET_SECONDS`` of ``run(cycles)``, and the seconds measured."""
    cycles, seconds = 1 << 20, 0.0
    for _ in range(8):
        run(cycles)
        fence()
        start = time.perf_counter()
        run(cycles)
        fence()
        seconds = time.perf_counter() - start
        if 0.8 * TARGET_SECONDS < seconds < 1.25 * TARGET_SECONDS:
            break
        cycles = max(int(cycles * TARGET_SECONDS / max(seconds, 1e-6)), 1)
    return cycles, seconds


def _with_sums(times: dict) -> dict:
    """``times`` with, per repeat, the sum and the longer of the kernel and the all-reduce."""
    if "compute" in times and "all_reduce" in times:
        pairs = list(zip(times["compute"], times["all_reduce"]))
        times = {**times, "sum": [c + a for c, a in pairs], "longer": [max(p) for p in pairs]}
    return times


def _one(record: Record, label: dict, compute, all_reduce, fence, args) -> None:
    def step():
        handle = all_reduce()
        compute()
        handle.wait()

    times = interleaved({"step": step, "compute": compute,
                         "all_reduce": lambda: all_reduce().wait()}, fence, args.repeats,
                        max(args.calls // 4, 1))
    r = row(label, _with_sums(times), [("step", "sum"), ("step", "longer"),
                                       ("compute", "all_reduce")])
    record.add(r)
    print(brief(r), flush=True)


def overlap_part(out: Path, args) -> None:
    import cupy

    comm = library()
    peers, why = torch_dist()
    fence = fence_for(peers)
    nbytes = args.overlap_bytes
    record = Record(out, "overlap", bytes=nbytes, repeats=args.repeats,
                    torch=why or peers[0].__version__)
    x, y = cupy.ones(nbytes // 4, cupy.float32), cupy.empty(nbytes // 4, cupy.float32)
    spin = _spin_kernel()
    if spin is not None:
        cycles, seconds = _calibrated(spin, fence)
        compute = lambda: spin(cycles)  # noqa: E731
    else:  # (the stand-in: a dry run)
        z = cupy.ones(1 << 10, cupy.float32)
        cycles, seconds = 0, 0.0
        compute = lambda: z.__imul__(1.0)  # noqa: E731
    _one(record, {"arrays": "cupy", "kernel_cycles": cycles, "kernel_us": seconds * 1e6},
         compute, lambda: comm.all_reduce(x, out=y, async_op=True), fence, args)
    if peers is not None:
        torch = peers[0]
        t = torch.ones(nbytes // 4, device="cuda:0")
        u = torch.empty_like(t)
        cycles, seconds = _calibrated(torch.cuda._sleep, fence)
        _one(record, {"arrays": "torch", "kernel_cycles": cycles, "kernel_us": seconds * 1e6},
             lambda: torch.cuda._sleep(cycles),
             lambda: comm.all_reduce(t, out=u, async_op=True), fence, args)
    fence()
