"""The DDP ways of ``train_step.py``: DDP over gloo, over the library's hook, and over a hook
of MPI's own.

The model is a chain of ResNet-50's parameter shapes, one autograd function per layer: its
forward does nothing, its backward runs the layer's share of the stand-in backward pass
(``train_step.Backward``) and then produces the layer's gradient, so autograd hands DDP the
gradients last layer first, each as soon as its layer is done, as a real backward pass does.
Both DDPs use the same buckets (``bucket_cap_mb`` = B, DDP's 1 MiB first bucket) and give the
mean. Built as ``benchmarks/ddp_step.py`` builds its ways (a gloo group through a file store,
``process_group(comm)`` and ``register(ddp, comm)`` for the hook). Way (h), `MpiHook`, is
the hook a user could write on mpi4py alone: each bucket an ``Iallreduce`` in place, tested by
a thread of its own every ``poll`` seconds (as way (g)), its future completed there: what MPI
itself does inside DDP, with nothing of the library between.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from collectives.adapters import torch_ddp
from torch.nn.parallel import DistributedDataParallel as DDP


class Compute:
    """Which stand-in the layers' backward runs now (None: no compute)."""

    backward: Any = None


class Layer(torch.autograd.Function):
    """Layer k (backward order): backward runs its compute, then makes its gradient."""

    @staticmethod
    def forward(ctx, h, p, k, compute):
        ctx.k, ctx.compute, ctx.shape = k, compute, p.shape
        return h.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.compute.backward is not None:
            ctx.compute.backward.layer(ctx.k)
        return grad, grad.expand(ctx.shape).contiguous(), None, None


class Chain(torch.nn.Module):
    def __init__(self, shapes: list, compute: Compute):
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(s)) for s in shapes)
        self.compute = compute

    def forward(self, x):
        n = len(self.weights)
        for i, p in enumerate(self.weights):
            x = Layer.apply(x, p, n - 1 - i, self.compute)
        return x


class MpiHook:
    """Way (h): DDP's buckets all-reduced by MPI's own ``Iallreduce`` (the mean: a sum, then
    one division), tested every ``poll`` seconds by a thread that runs while any is in flight."""

    def __init__(self, poll: float):
        from mpi4py import MPI

        self.comm, self.poll = MPI.COMM_WORLD.Dup(), poll
        self.pending: list = []  # (request, bucket buffer, future)
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def hook(self, _state, bucket):  # (unannotated: DDP checks a hook's annotations)
        from mpi4py import MPI

        buffer = bucket.buffer()
        future: torch.futures.Future = torch.futures.Future()
        request = self.comm.Iallreduce(MPI.IN_PLACE, np.from_dlpack(buffer))
        with self.lock:
            self.pending.append((request, buffer, future))
            if self.thread is None:
                self.thread = threading.Thread(target=self._drive, daemon=True)
                self.thread.start()
        return future

    def _drive(self) -> None:
        size = self.comm.Get_size()
        while True:
            with self.lock:
                done, left = [], []
                for item in self.pending:
                    (done if item[0].Test() else left).append(item)
                self.pending = left
                if not done and not self.pending:
                    self.thread = None
                    return
            for _, buffer, future in done:
                future.set_result(buffer.div_(size))
            time.sleep(self.poll)


class DdpWays:
    """Ways (e), (f) and (h), and the torch compute alone, as ``(way, phase)`` -> step."""

    gloo = "(e) DDP gloo"
    hook = "(f) DDP library hook"
    mpi = "(h) DDP mpi4py hook"

    def __init__(self, comm: Any, shapes: list, bucket_bytes: int, store: str,
                 poll: float = 2e-4):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=comm.rank,
                                world_size=comm.size)
        self.compute = Compute()
        cap = bucket_bytes / 2**20
        self.plain = Chain(shapes, self.compute)
        self.models = {self.gloo: DDP(Chain(shapes, self.compute), bucket_cap_mb=cap),
                       self.hook: DDP(Chain(shapes, self.compute), bucket_cap_mb=cap,
                                      process_group=torch_ddp.process_group(comm)),
                       self.mpi: DDP(Chain(shapes, self.compute), bucket_cap_mb=cap)}
        torch_ddp.register(self.models[self.hook], comm)
        self.models[self.mpi].register_comm_hook(None, MpiHook(poll).hook)
        self.x = torch.ones(())
        for name in self.models:  # checked once: the mean of every rank's ones
            self.step(self.models[name], None)
            grads = [p.grad for p in self.models[name].parameters()]
            assert all(g is not None and torch.equal(g, torch.ones_like(g)) for g in grads), name

    def step(self, model, backward) -> None:
        model.zero_grad(set_to_none=True)
        self.compute.backward = backward
        try:
            model(self.x).backward()
        finally:
            self.compute.backward = None

    def sequential(self, model, backward) -> None:
        backward.run()
        self.step(model, None)

    def items(self, backward) -> dict:
        out: dict = {("torch", "compute"): lambda: self.step(self.plain, backward)}
        for name, model in self.models.items():
            out[(name, "comm")] = lambda m=model: self.step(m, None)
            out[(name, "sequential")] = partial(self.sequential, model, backward)
            out[(name, "overlapped")] = lambda m=model: self.step(m, backward)
        return out

    def close(self) -> None:
        dist.destroy_process_group()
