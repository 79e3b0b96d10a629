"""DDP over real MPI ranks: the library's communication hook against DDP's own gloo all-reduce.

First, exactness: a small model trains a few SGD steps four ways, on every rank: DDP with the library's
hook (mean, and sum) over the library's process group, and DDP over a gloo group (its built-in
mean, and a gloo hook that sums); and under ``Join`` with uneven inputs, DDP over gloo with
the library's hook beside DDP over gloo alone. Weights, inputs and the learning rate are small dyadic
numbers, so every sum is exact: the parameters must match gloo's bit for bit and a float64
reference computed on one rank from every rank's data. With ``compression="fp16"`` they stay
within float16's rounding of the reference.

Then errors: a failure inside the hook reaches DDP on every rank as the future's exception
(``RuntimeError`` naming the library's error), within about a second, with no hang: a rank with
a bad argument (the others hear ``PeerFailedError``), ranks that disagree (compression on one:
``CollectiveMismatchError`` everywhere), and a rank that never arrives (``CollectiveTimeoutError``
after the hook's one-second timeout), and a communicator broken by an earlier failure
(``CommunicatorBrokenError`` at once, on every rank); ranks whose buckets differ fail the
step at once. After the bad argument the next step
works, or finds the communicator broken (where a rank had moved data before it heard), alike
on every rank.

Run as ``mpiexec -n 2 python tests/mpi_scenarios/torch_ddp.py <scratch folder>`` (the gloo
group's file store goes there).
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from _common import WORLD, Report, meet
from collectives.adapters import torch_ddp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives

SCRATCH = sys.argv[1]
STEPS, LR, BATCH, SIZES = 3, 2.0 ** -5, 4, (8, 16, 4)
report = Report("torch_ddp")
comm = collectives.init(timeout=20)
rank, size = comm.rank, comm.size
torch.set_num_threads(1)


def model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Two linear layers with weights in quarters, the same on every rank."""
    layers = [torch.nn.Linear(a, b) for a, b in zip(SIZES, SIZES[1:])]
    net = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1]).to(dtype)
    with torch.no_grad():
        for k, p in enumerate(net.parameters()):
            values = (torch.arange(p.numel(), dtype=torch.float64) * 7 + 3 * k) % 9 - 4
            p.copy_((values / 4).reshape(p.shape))
    return net


def batch(step: int, who: int, dtype: torch.dtype = torch.float32) -> tuple:
    """Small integers, different on every rank and step."""
    g = torch.Generator().manual_seed(1000 * step + who)
    x = torch.randint(-2, 3, (BATCH, SIZES[0]), generator=g).to(dtype)
    target = torch.randint(-2, 3, (BATCH, SIZES[-1]), generator=g).to(dtype)
    return x, target


def train(net: torch.nn.Module, ddp: torch.nn.Module, steps: int = STEPS) -> list:
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(steps):
        x, target = batch(step, rank, next(net.parameters()).dtype)
        opt.zero_grad()
        (ddp(x) * target).sum().backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def reference(mean: bool) -> list:
    """The same training in float64 on this rank alone, from every rank's batch."""
    net = model(torch.float64)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        for who in range(size):
            x, target = batch(step, who, torch.float64)
            (net(x) * target).sum().backward()
        if mean:
            for p in net.parameters():
                assert p.grad is not None
                p.grad /= size
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def sum_hook(group, bucket):  # (no annotations: DDP compares them with its types, not text)
    """DDP's own all-reduce over gloo, without its division: the sum."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda f: f.value()[0])


def with_library(**options) -> list:
    net = model()
    ddp = DDP(net, process_group=torch_ddp.process_group(comm), bucket_cap_mb=0.0002)
    state = torch_ddp.register(ddp, comm, **options)
    params = train(net, ddp)
    report.check(state.buckets > STEPS, f"{options}: {state.buckets} buckets in {STEPS} steps")
    return params


def with_gloo(hook=None) -> list:
    net = model()
    ddp = DDP(net, bucket_cap_mb=0.0002)
    if hook is not None:
        ddp.register_comm_hook(dist.group.WORLD, hook)
    return train(net, ddp)


def uneven(hooked: bool) -> list:
    """DDP over gloo under ``Join``, rank r training ``STEPS + r`` steps: the ranks that ran out
    shadow the others' all-reduces (through the hook, with zeros), as DDP does."""
    from torch.distributed.algorithms.join import Join

    net = model()
    ddp = DDP(net, bucket_cap_mb=0.0002)
    if hooked:
        torch_ddp.register(ddp, comm)
    with Join([ddp]):
        params = train(net, ddp, STEPS + rank)
    return params


def same(a: list, b: list) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def exact() -> None:
    dist.init_process_group("gloo", init_method=f"file://{SCRATCH}/store", rank=rank,
                            world_size=size)
    for mean in (True, False):
        ours = with_library(mean=mean)
        theirs = with_gloo(None if mean else sum_hook)
        truth = reference(mean)
        report.check(same(ours, theirs), f"mean={mean}: differs from DDP over gloo")
        report.check(same(ours, [t.float() for t in truth]), f"mean={mean}: differs from float64")
        report.check(all(torch.equal(t, t.float().double()) for t in truth),
                     f"mean={mean}: the reference is not exact in float32")
    ours = with_library(compression="fp16")
    theirs = with_gloo(default_hooks.fp16_compress_hook)
    truth = [t.float() for t in reference(True)]
    for o, g, t in zip(ours, theirs, truth, strict=True):
        scale = t.abs().max().item()
        report.check((o - t).abs().max().item() <= 2e-3 * scale, "fp16: far from float64")
        report.check((o - g).abs().max().item() <= 2e-3 * scale, "fp16: far from gloo's fp16 hook")
    # (the library's process group is no default group: Join asks for one; gloo's is, and
    # the hook carries the gradients there)
    report.check(same(uneven(True), uneven(False)), "Join: differs from DDP over gloo")
    dist.destroy_process_group()


def step(ddp: torch.nn.Module, state) -> str:
    """One step, within about a second: "ok", or the name of the error its backward raised
    (which must name it, and be ``state.last_error``)."""
    x, target = batch(0, rank)
    start = time.monotonic()
    try:
        (ddp(x) * target).sum().backward()
        outcome = "ok"
    except RuntimeError as exc:
        outcome = type(state.last_error).__name__
        report.check(outcome in str(exc), f"backward raised {exc}, last_error {state.last_error!r}")
    took = time.monotonic() - start
    report.check(took < 3.0, f"{outcome}: took {took:.2f} s")
    print(f"STEP rank {rank} {outcome} after {took:.2f} s", flush=True)
    return outcome


def fails(ddp: torch.nn.Module, state, expected: str) -> None:
    """One step whose backward must raise ``expected``, within about a second."""
    outcome = step(ddp, state)
    report.check(outcome == expected, f"expected {expected}, got {outcome}")


def library_ddp(on: object, **options) -> tuple:
    """A model under DDP over the library's process group, its hook on ``on``, buckets built."""
    net = model()
    ddp = DDP(net, process_group=torch_ddp.process_group(comm), bucket_cap_mb=0.0002)
    state = torch_ddp.register(ddp, on, **options)
    train(net, ddp, 2)  # buckets rebuilt: the steps below see the final buckets
    return net, ddp, state


def errors() -> None:
    # Every failure after the first step breaks the communicator it happens on (the calls'
    # signatures were agreed, so data moved), so each case has a communicator of its own,
    # made while all still work; the model has no buffers, so its forward calls nothing on
    # the process group's communicator.
    cases = {name: library_ddp(on, timeout=1.0)
             for name, on in (("argument", comm), ("mismatch", comm.dup()), ("late", comm.dup()))}
    net, ddp, state = cases["argument"]
    if rank == 1:  # a bad argument on one rank: its own error there, PeerFailedError elsewhere
        state.algorithm = "no such algorithm"
    fails(ddp, state, "ValueError" if rank == 1 else "PeerFailedError")
    meet()
    # Broken where a rank had moved data before it heard of the bad argument; usable where
    # every rank heard first (a matter of timing): either way, alike on every rank.
    state.algorithm = "auto"
    outcomes = WORLD.allgather(step(ddp, state))
    report.check(len(set(outcomes)) == 1 and outcomes[0] in ("ok", "CommunicatorBrokenError"),
                 f"the step after a bad argument: {outcomes}")
    if outcomes[0] == "ok":  # DDP's mean gradient, the same on every rank
        grads = WORLD.allgather(torch.cat([p.grad.flatten() for p in net.parameters()]))
        report.check(all(torch.equal(g, grads[0]) for g in grads), "gradients differ")
    meet()
    _, ddp, state = cases["mismatch"]
    if rank == 1:  # ranks that disagree about compressing: found when their data meets
        state.compression = "fp16"
    fails(ddp, state, "CollectiveMismatchError")
    meet()
    state.compression = None  # (data had moved: the communicator is broken, at once)
    fails(ddp, state, "CommunicatorBrokenError")
    meet()
    if rank == 0:  # rank 1 never joins: rank 0 times out, as its hook's timeout says
        _, ddp, state = cases["late"]
        fails(ddp, state, "CollectiveTimeoutError")


def layouts(on: collectives.Communicator) -> None:
    """Ranks whose buckets differ (rank 0 cuts the model finer; ``find_unused_parameters``
    keeps the buckets DDP made first): rank 1's map of used parameters meets rank 0's second
    bucket, and every rank fails the step at once (rank 0's last bucket once waited out the
    hook's timeout, here 10 s, for a call rank 1 never makes). ``on``: a communicator of its own,
    made while all still worked."""
    cut = {"bucket_cap_mb": 0.0001} if rank == 0 else {}
    ddp = DDP(model(), process_group=torch_ddp.process_group(on), find_unused_parameters=True,
              **cut)
    torch_ddp.register(ddp, on, timeout=10.0)
    x, target = batch(0, rank)
    start = time.monotonic()
    try:
        (ddp(x) * target).sum().backward()
        error = "none"
    except Exception as exc:  # noqa: BLE001 - judged below
        error = f"{type(exc).__name__}: {exc}"
    took = time.monotonic() - start
    print(f"LAYOUTS rank {rank} after {took:.2f} s: {error[:200]}", flush=True)
    # (rank 0 hears the mismatch at the process group's all-reduce, whose Work fails, or,
    # where its buckets went first, that the ranks issued different numbers of calls)
    expected = ("CollectiveMismatchError", "different numbers of calls") if rank == 0 else (
        "CollectiveMismatchError",)
    report.check(any(e in error for e in expected) and took < 3.0,
                 f"layouts: {error} after {took:.2f} s")


if __name__ == "__main__":
    if size < 2:
        report.finish("skipped: needs 2 or more ranks")
        sys.exit(0)
    exact()
    spare = comm.dup()
    errors()
    meet()
    layouts(spare)
    meet()
    report.finish()
