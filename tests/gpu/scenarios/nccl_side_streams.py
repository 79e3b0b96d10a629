"""Under mpiexec on a GPU: an asynchronous all-reduce issued on the default stream and waited
on under a side stream is read correctly there (docs/gpu.md, "Streams": ``wait()`` orders the
stream current at ``wait()``, of the result's own library).

Before each call the default stream sleeps (a spin kernel of about 20 ms), so the all-reduce,
which waits for the default stream at issue, starts late: a side stream that ``wait()`` did not
order reads the sentinel the result was filled with. ``torch`` (PyTorch tensors: the hot path
of an agreed SUM, and MEAN, the engine's way) and ``cupy`` (CuPy arrays, the same two paths).
Each trial's input is new (see ``expected``), so stale memory cannot pass for a result.
"""

from __future__ import annotations

import sys

import cupy

import collectives

mode = sys.argv[1]
comm = collectives.load_backend("nccl").init(timeout=60)
rank, size = comm.rank, comm.size
COUNT = 1 << 22  # 16 MiB of float32
SPIN = cupy.RawKernel(r'''
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}''', "spin")
CYCLES = 40_000_000  # about 20 ms at 2 GHz
checked = 0


def expected(op: str, trial: int) -> float:
    """Each rank's input is ``(rank + 1) * (trial + 2)``: a value per trial, so memory left
    from an earlier trial cannot pass for this one's result."""
    total = (trial + 2) * size * (size + 1) / 2
    return total / size if op == "mean" else total


if mode == "torch":
    import torch

    device = torch.device("cuda", comm.transport.device)
    torch.cuda.set_device(device)
    side = torch.cuda.Stream(device)
    x = torch.full((COUNT,), 1.0, device=device)
    for op in ("sum", "mean"):
        for _ in range(2):  # agreed, then bound to the hot path (SUM)
            comm.all_reduce(x, op, "nccl")
        for trial in range(3):
            x.fill_(float((rank + 1) * (trial + 2)))
            out = torch.full_like(x, -1.0)  # the sentinel, on the default stream
            torch.cuda._sleep(CYCLES)  # the default stream is busy: the all-reduce starts late
            handle = comm.all_reduce(x, op, "nccl", out=out, async_op=True)
            with torch.cuda.stream(side):
                got = handle.wait()
                copy = got.clone()  # read on the side stream
                low, high = copy.min(), copy.max()
            torch.cuda.synchronize()
            assert got is out, (op, trial)
            assert float(low) == float(high) == expected(op, trial), (op, trial, float(low), float(high))
            checked += 1
elif mode == "cupy":
    side = cupy.cuda.Stream(non_blocking=True)
    x = cupy.ones(COUNT, cupy.float32)
    for op in ("sum", "mean"):
        for _ in range(2):
            comm.all_reduce(x, op, "nccl")
        for trial in range(3):
            x.fill((rank + 1) * (trial + 2))
            out = cupy.full(COUNT, -1.0, cupy.float32)
            SPIN((1,), (1,), (cupy.int64(CYCLES),))
            handle = comm.all_reduce(x, op, "nccl", out=out, async_op=True)
            with side:
                got = handle.wait()
                copy = got.copy()
                low, high = copy.min(), copy.max()
            cupy.cuda.Device().synchronize()
            assert got is out, (op, trial)
            assert float(low) == float(high) == expected(op, trial), (op, trial, float(low), float(high))
            checked += 1
comm.barrier()
if rank == 0:
    print(f"SUMMARY {mode} PASS checked={checked} ranks={size}")
