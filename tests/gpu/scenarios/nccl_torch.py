"""Under mpiexec on a GPU: PyTorch CUDA tensors on the NCCL backend's Communicator.

``hot`` (any -n, one GPU per rank): a repeated all-reduce of tensors made on a PyTorch stream
of their own takes the hot path through the tensors' pointers (``KindAllReduce``, no DLPack),
into a new tensor, into ``out=`` and in place; asynchronous calls too; MEAN (not hot) and a
batch of tensors give tensors as well; a blocking call's ``out=`` read on PyTorch's side
stream holds the result (that stream is ordered after the call). Every result is checked
bitwise against the reference.
A tensor that requires grad is refused, naming ``detach()``, on every kind of call.
``buckets`` (any -n): docs/gpu.md's training step, each parameter's gradient hooked into
``comm.buckets`` during the backward pass; the waited buckets hold the mean of every rank's
gradients (each rank scales its loss by its rank + 1).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

import collectives
from collectives.ops import ReduceOp
from collectives.tools.reference import exact_input, expected_outputs

mode = sys.argv[1]
comm = collectives.load_backend("nccl").init(timeout=60)
rank, size = comm.rank, comm.size
device = torch.device("cuda", comm.transport.device)
checked = 0


def same(tensor, expected) -> bool:
    got = tensor.cpu().numpy()
    return got.shape == expected.shape and got.dtype == expected.dtype and (
        got.tobytes() == expected.tobytes())


if mode == "hot":
    from collectives.backends.nccl.hot_path import KindAllReduce

    hot_runs: list[bool] = []  # every call of the tensors' hot path: whether it ran the call
    quick = KindAllReduce.quick

    def counted(self, x, out, seq):
        got = quick(self, x, out, seq)
        hot_runs.append(got is not None)
        return got

    KindAllReduce.quick = counted  # (the real one runs; only counted)
    side = torch.cuda.Stream(device)
    for dtype, op in ((np.dtype(np.float32), ReduceOp.SUM), (np.dtype(np.int64), ReduceOp.MAX)):
        for count in (1, 1009, (1 << 20) + 3):
            inputs = [exact_input(size, p, count, dtype, op) for p in range(size)]
            expected = expected_outputs("all_reduce", inputs, op)[rank]
            with torch.cuda.stream(side):  # made, reduced and read on PyTorch's own stream
                for step in range(6):
                    x = torch.from_numpy(inputs[rank]).to(device)
                    target = (None, torch.empty_like(x), x)[step % 3]
                    got = comm.all_reduce(x, op.value, "nccl", out=target)
                    assert isinstance(got, torch.Tensor) and got.device == device, type(got)
                    assert target is None or got is target, step
                    assert same(got, expected), (step, count, dtype)
                    if target is not x:
                        assert same(x, inputs[rank]), "the input was written"
                    # the first call is agreed (through DLPack); the tensors' hot path the rest
                    assert hot_runs == [True] * step, (step, hot_runs)
                    checked += 1
                handle = comm.all_reduce(torch.from_numpy(inputs[rank]).to(device), op.value,
                                         "nccl", async_op=True)
                got = handle.wait()
                assert isinstance(got, torch.Tensor) and same(got, expected), (count, dtype)
                target = torch.empty(count, dtype=x.dtype, device=device)
                handle = comm.all_reduce(torch.from_numpy(inputs[rank]).to(device), op.value,
                                         "nccl", out=target, async_op=True)
                assert handle.wait() is target and same(target, expected)
                assert hot_runs == [True] * 7, hot_runs
                checked += 2
            hot_runs.clear()
    # MEAN is not hot (a division after the sum): the engine's way, tensors back all the same
    inputs = [exact_input(size, p, 1009, np.dtype(np.float64), ReduceOp.MEAN) for p in range(size)]
    expected = expected_outputs("all_reduce", inputs, ReduceOp.MEAN)[rank]
    for _ in range(3):
        got = comm.all_reduce(torch.from_numpy(inputs[rank]).to(device), "mean", "nccl")
        assert isinstance(got, torch.Tensor) and same(got, expected)
        assert not hot_runs, hot_runs
        checked += 1
    for _ in range(2):  # (asynchronous, off the hot path: another library's handle wrapped)
        handle = comm.all_reduce(torch.from_numpy(inputs[rank]).to(device), "mean", "nccl",
                                 async_op=True)
        got = handle.wait()
        assert isinstance(got, torch.Tensor) and same(got, expected)
        checked += 1
    # a blocking call's out= tensor, read on PyTorch's side stream: that stream is ordered
    # after the call's end (a fresh result's DLPack hand-back ordered it; an out= handed back
    # as it was did not), with the communicator's stream made late by a spinning kernel
    import cupy

    spin = cupy.RawKernel(r"""extern "C" __global__ void spin(long long cycles) {
        long long start = clock64(); while (clock64() - start < cycles) {}}""", "spin")
    with torch.cuda.stream(side):
        for step in range(4):
            x = torch.full((1 << 22,), float(step + 2), dtype=torch.float32, device=device)
            out = torch.full_like(x, -1.0)
            with cupy.cuda.Device(comm.transport.device), comm.transport.stream:
                spin((1,), (1,), (cupy.int64(40_000_000),))
            assert comm.all_reduce(x, "mean", "nccl", out=out) is out
            assert float(out.min()) == step + 2, (step, float(out.min()))
            checked += 1
    # a batch of tensors: fused by PyTorch, tensors back
    counts = (5, 0, 70, 1, 1009)
    lists = [[exact_input(size, p, c, np.dtype(np.float32), ReduceOp.SUM) for p in range(size)]
             for c in counts]
    tensors = [torch.from_numpy(v[rank]).to(device) for v in lists]
    for async_op in (False, True):
        got = comm.batch_all_reduce(tensors, "sum", async_op=async_op)
        got = got.wait() if async_op else got
        for g, v in zip(got, lists):
            assert isinstance(g, torch.Tensor)
            assert same(g, expected_outputs("all_reduce", v, ReduceOp.SUM)[rank])
        checked += 1
    # a CUDA tensor that requires grad: refused on every rank before any data moves, on the
    # hot path's calls as on the others, naming the tensor and detach()
    leaf = torch.ones(1009, device=device, requires_grad=True)
    plain = torch.ones(1009, device=device)
    for name, call in (("x", lambda: comm.all_reduce(leaf, "sum", "nccl")),
                       ("x", lambda: comm.all_reduce(leaf, "sum", "nccl", async_op=True)),
                       ("x", lambda: comm.all_reduce(leaf, "sum", "nccl", out=plain)),
                       ("xs[1]", lambda: comm.batch_all_reduce([plain, leaf]))):
        try:
            call()
        except TypeError as exc:
            assert name in str(exc) and "detach()" in str(exc), exc
        else:
            raise AssertionError(f"a tensor that requires grad was reduced ({name})")
        checked += 1
    assert same(comm.all_reduce(plain, "sum", "nccl"), np.full(1009, size, np.float32))
if mode == "buckets":
    torch.manual_seed(0)  # the same model on every rank
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)]).to(device)
    params = [p for p in model.parameters()][::-1]  # the order backward produces them
    buckets = comm.buckets([p.detach() for p in params], "mean", bucket_bytes=256 << 10)
    for k, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda p, k=k: buckets.ready(k, p.grad))
    data = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)).to(device)
    for _step in range(3):
        model.zero_grad()
        loss = model(data).square().mean() * (rank + 1)
        loss.backward()  # buckets start during the pass
        got = buckets.wait()
        # every rank's gradient is (rank + 1) times rank 0's: the mean is (size + 1) / 2 times
        scale = (size + 1) / 2 / (rank + 1)
        for p, g in zip(params, got):
            assert isinstance(g, torch.Tensor) and g.shape == p.grad.shape
            torch.testing.assert_close(g, p.grad * scale, rtol=1e-5, atol=1e-6)
        checked += 1
comm.barrier()
if rank == 0:
    print(f"SUMMARY {mode} PASS checked={checked} ranks={size}")
