"""PyTorch DDP over the library (``collectives.adapters.torch_ddp``): real DDP, real torch CPU.

Thread ranks (``collectives.run``) train small models with DDP, the library's hook and its
process group, against a float64 reference computed from every rank's data; weights, inputs
and the learning rate are small dyadic numbers, so sums are exact and the checks bitwise. The
slow test runs ``tests/mpi_scenarios/torch_ddp.py`` on 2 MPI ranks, against DDP over gloo.
"""

from __future__ import annotations

import copy
import importlib.util
import io
import os
import pickle
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import collectives

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="needs PyTorch: pip install torch (the CPU build)")
torch: Any = None
dist: Any = None
DDP: Any = None
torch_ddp: Any = None


@pytest.fixture(autouse=True, scope="module")
def _torch() -> None:
    """PyTorch, imported when this module's first test runs, not when pytest collects it (every
    xdist worker collects every module; importing PyTorch costs seconds of CPU)."""
    global torch, dist, DDP, torch_ddp
    import torch as module
    import torch.distributed
    from collectives.adapters import torch_ddp as adapter
    from torch.nn.parallel import DistributedDataParallel

    torch, dist, DDP, torch_ddp = module, torch.distributed, DistributedDataParallel, adapter

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"
SIZES, BATCH, LR, STEPS = (6, 10, 3), 4, 2.0 ** -4, 2


def model(dtype=None):
    """Two linear layers, weights in quarters, the same on every rank (no global seed: thread
    ranks share torch's generator); float32 unless ``dtype`` says."""
    dtype = torch.float32 if dtype is None else dtype
    net = torch.nn.Sequential(torch.nn.Linear(SIZES[0], SIZES[1]), torch.nn.ReLU(),
                              torch.nn.Linear(SIZES[1], SIZES[2])).to(dtype)
    with torch.no_grad():
        for k, p in enumerate(net.parameters()):
            values = (torch.arange(p.numel(), dtype=torch.float64) * 5 + k) % 7 - 3
            p.copy_((values / 4).reshape(p.shape))
    return net


def batch(step, who, dtype=None):
    dtype = torch.float32 if dtype is None else dtype
    g = torch.Generator().manual_seed(100 * step + who)
    x = torch.randint(-2, 3, (BATCH, SIZES[0]), generator=g)
    target = torch.randint(-2, 3, (BATCH, SIZES[-1]), generator=g)
    return x.to(dtype), target.to(dtype)


def train(net, ddp, rank, steps=STEPS):
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(steps):
        x, target = batch(step, rank, next(net.parameters()).dtype)
        opt.zero_grad()
        (ddp(x) * target).sum().backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def reference(size, mean, steps=STEPS):
    """The same training in float64, in one process, from every rank's batch."""
    net = model(torch.float64)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        for who in range(size):
            x, target = batch(step, who, torch.float64)
            (net(x) * target).sum().backward()
        for p in net.parameters():
            p.grad /= size if mean else 1
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def ddp_over(comm, dtype=None, **options):
    net = model(dtype)
    ddp = DDP(net, process_group=torch_ddp.process_group(comm), bucket_cap_mb=0.0001)
    return net, ddp, torch_ddp.register(ddp, comm, **options)


@pytest.mark.parametrize("mean", [True, False])
def test_ddp_with_the_hook_gives_the_exact_mean_or_sum(mean):
    def rank_fn(comm):
        net, ddp, state = ddp_over(comm, mean=mean)
        return train(net, ddp, comm.rank), state.buckets

    size = 2
    results = collectives.run(rank_fn, size)
    truth = reference(size, mean)
    assert all(torch.equal(t, t.float().double()) for t in truth)  # exact in float32
    for params, buckets in results:
        assert buckets >= 1 + 2 * (STEPS - 1)  # one bucket at first, then several per step
        for got, want in zip(params, truth, strict=True):
            assert torch.equal(got, want.float()), (got - want.float()).abs().max()


def test_fp16_compression_stays_within_float16_rounding():
    def rank_fn(comm):
        net, ddp, _ = ddp_over(comm, compression="fp16")
        return train(net, ddp, comm.rank)

    results = collectives.run(rank_fn, 2)
    truth = reference(2, True)
    for got, other, want in zip(*results, truth, strict=True):
        assert torch.equal(got, other)  # the same bits on every rank
        scale = want.abs().max().item()
        assert (got.double() - want).abs().max().item() <= 2e-3 * scale


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_a_half_precision_model_is_reduced_in_float32(name):
    dtype = getattr(torch, name)

    def rank_fn(comm):
        net, ddp, _ = ddp_over(comm, dtype)
        x, target = batch(0, comm.rank, dtype)
        (ddp(x) * target).sum().backward()
        return [p.grad.clone() for p in net.parameters()]

    results = collectives.run(rank_fn, 2)
    net = model(dtype)  # each rank's own gradient, summed in float64, then halved
    local = []
    for who in range(2):
        net.zero_grad()
        x, target = batch(0, who, dtype)
        (net(x) * target).sum().backward()
        local.append([p.grad.double() for p in net.parameters()])
    for got, mine, theirs in zip(results[0], *local, strict=True):
        assert got.dtype is dtype
        assert torch.equal(got, ((mine + theirs) / 2).to(dtype))


def test_a_float16_mean_whose_sum_passes_float16s_range_stays_finite():
    """Each rank's bias gradient is 40,000 (float16 holds it; the sum, 80,000, it cannot):
    the mean is 40,000, as DDP's own hook (which divides first) gives, not infinity."""
    def rank_fn(comm):
        net = torch.nn.Linear(1, 1).to(torch.float16)
        ddp = DDP(net, process_group=torch_ddp.process_group(comm))
        torch_ddp.register(ddp, comm)
        x = torch.zeros(1, 1, dtype=torch.float16)
        (ddp(x) * 40000.0).sum().backward()
        return net.bias.grad.clone()

    for got in collectives.run(rank_fn, 2):
        assert got.dtype is torch.float16 and got.item() == 40000.0, got


@pytest.mark.parametrize("size", [2, 4])
def test_the_mean_is_ddps_at_the_edges_of_the_float32_range(size):
    """Bias gradients of 3e38 on every rank (their sum passes float32's range) and of the
    smallest subnormal: the mean is DDP's own, each rank's share first (3e38 itself, and
    1.4e-45 / size rounded as DDP rounds it: 0), not a sum then a division (inf; 1.4e-45)."""
    tiny = float(np.finfo(np.float32).smallest_subnormal)

    def rank_fn(comm):
        net = torch.nn.Linear(1, 2)
        ddp = DDP(net, process_group=torch_ddp.process_group(comm))
        torch_ddp.register(ddp, comm)
        (ddp(torch.zeros(1, 1)) * torch.tensor([3e38, tiny])).sum().backward()
        return net.bias.grad.clone()

    share = torch.tensor([3e38, tiny], dtype=torch.float32) / size  # (DDP's: then summed)
    want = sum([share] * size, torch.zeros(2))
    for got in collectives.run(rank_fn, size):
        assert torch.equal(got, want) and torch.isfinite(got).all(), (got, want)


def test_the_mean_is_ddps_own_bit_for_bit_where_one_over_size_is_inexact():
    """DDP without a hook multiplies each rank's share by 1/size, then sums; so does the hook.
    At 3 ranks a division by 3 differed from it in the last bit (33 of these 100); only rank
    0's gradient is not zero, so every sum is exact and only the scaling can differ."""
    def rank_fn(comm):
        def gradient(hooked):
            layer = torch.nn.Linear(100, 1, bias=False)
            with torch.no_grad():
                layer.weight.zero_()
            ddp = DDP(layer, process_group=torch_ddp.process_group(comm))
            if hooked:
                torch_ddp.register(ddp, comm)
            ddp(torch.arange(1.0, 101.0)[None] * (comm.rank == 0)).sum().backward()
            return layer.weight.grad.clone()

        return gradient(False), gradient(True)

    for builtin, hooked in collectives.run(rank_fn, 3):
        assert torch.equal(hooked, builtin), (hooked != builtin).sum()
        assert torch.equal(builtin, torch.arange(1.0, 101.0)[None] * (1 / 3))  # (DDP's way)


def test_register_refuses_a_communicator_that_is_not_ddps_group():
    # (a hook over a split of one rank each trained every rank alone: weights drifted apart)
    def rank_fn(comm):
        ddp = DDP(torch.nn.Linear(2, 1), process_group=torch_ddp.process_group(comm))
        alone = comm.split(comm.rank)
        try:
            with pytest.raises(ValueError, match=r"comm is rank 0 of 1 where DDP's process "
                                                 r"group is rank \d of 2"):
                torch_ddp.register(ddp, alone)
        finally:
            alone.free()

    collectives.run(rank_fn, 2)


def test_register_refuses_a_communicator_of_other_ranks_with_ddps_rank_and_size():
    # DDP over {0, 1} and {2, 3}, the hook over {0, 3} and {2, 1}: every rank's rank and size
    # are DDP's, but the hook would average rank 0 with rank 3, silently
    def rank_fn(comm):
        ddp_ranks = comm.split(comm.rank // 2)
        other = comm.split(int(comm.rank in (0, 3)), key=[0, 1, 0, 1][comm.rank])
        try:
            assert (other.rank, other.size) == (ddp_ranks.rank, ddp_ranks.size)
            ddp = DDP(torch.nn.Linear(2, 1), process_group=torch_ddp.process_group(ddp_ranks))
            with pytest.raises(ValueError, match="holds other processes than DDP's"):
                torch_ddp.register(ddp, other)
            torch_ddp.register(ddp, ddp_ranks.dup())  # (the same ranks: taken)
        finally:
            other.free()

    collectives.run(rank_fn, 4)


def test_the_hook_works_with_a_gloo_group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        def rank_fn(comm):
            net = model()
            ddp = DDP(net)  # the default (gloo) group builds it; the hook carries the grads
            ddp.register_comm_hook(torch_ddp.CommHookState(comm), torch_ddp.allreduce_hook)
            return train(net, ddp, 0)

        params = collectives.run(rank_fn, 1)[0]
    finally:
        dist.destroy_process_group()
    for got, want in zip(params, reference(1, True), strict=True):
        assert torch.equal(got, want.float())


def test_a_float16_model_beside_a_bfloat16_one_fails_the_step_on_every_rank():
    # (gloo builds DDP from either, as their bits are of one size, and the hook carried both
    # buckets as float32: each rank's gradients were averaged with the other's, quietly)
    from torch_group_kit import gloo_group

    store = dist.HashStore()

    def rank_fn(comm):
        net = model(torch.bfloat16 if comm.rank == 0 else torch.float16)
        ddp = DDP(net, process_group=gloo_group(store, comm.rank, comm.size))
        state = torch_ddp.register(ddp, comm, timeout=5.0)
        x, target = batch(0, comm.rank, next(net.parameters()).dtype)
        with pytest.raises(RuntimeError) as raised:
            (ddp(x) * target).sum().backward()
        return str(raised.value), state.last_error, comm.all_reduce(np.ones(2)).tolist()

    for text, error, after in collectives.run(rank_fn, 2, timeout=10):
        assert isinstance(error, collectives.CollectiveMismatchError), text
        assert "a torch.bfloat16 bucket" in text and "a torch.float16 bucket" in text, text
        assert after == [2.0, 2.0]


def _failing_step(ddp, state, rank):
    x, target = batch(0, rank)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        (ddp(x) * target).sum().backward()
    return time.monotonic() - start, str(raised.value), state.last_error


def test_an_error_in_one_ranks_hook_reaches_ddp_on_every_rank():
    finished = threading.Barrier(2, timeout=20)

    def rank_fn(comm):
        net, ddp, state = ddp_over(comm, timeout=5.0)
        train(net, ddp, comm.rank)  # signatures agreed, buckets rebuilt
        if comm.rank == 1:
            state.algorithm = "no such algorithm"
        outcome = _failing_step(ddp, state, comm.rank)
        finished.wait()  # (a rank whose thread has ended answers no peer's question)
        return outcome

    (took0, text0, error0), (took1, text1, error1) = collectives.run(rank_fn, 2, timeout=10)
    assert isinstance(error1, ValueError) and "no such algorithm" in text1
    assert isinstance(error0, collectives.PeerFailedError) and "PeerFailedError" in text0
    assert max(took0, took1) < 2.0, (text0, text1)  # told, not timed out


@pytest.mark.parametrize("bad", [{"algorithm": "no such algorithm"}, {"timeout": -1}])
def test_a_bad_hook_argument_in_the_first_step_leaves_the_communicator_usable(bad):
    """Nothing moved in the first step (every bucket's signature is new): every rank's step
    fails, and the next call works. (Each bucket's refusal said it came alone beside its
    peers' several, and the communicator broke.)"""
    def rank_fn(comm):
        net, ddp, state = ddp_over(comm, timeout=5.0)
        if comm.rank == 1:
            for name, value in bad.items():
                setattr(state, name, value)
        outcome = _failing_step(ddp, state, comm.rank)
        return outcome, comm.all_reduce(np.ones(2)).tolist()

    for (took, text, error), after in collectives.run(rank_fn, 2, timeout=10):
        assert isinstance(error, (ValueError, collectives.PeerFailedError)), text
        assert after == [2.0, 2.0] and took < 2.0, text


def test_hooks_that_disagree_on_the_mean_fail_the_step_on_every_rank():
    # (one rank divided its buckets and its peer did not: the gradients were neither the
    # mean nor the sum, silently). The step fails alike; the next, once they agree, trains
    def rank_fn(comm):
        net, ddp, state = ddp_over(comm, mean=comm.rank == 0)
        outcome = _failing_step(ddp, state, comm.rank)
        state.mean = True
        return outcome, train(net, ddp, comm.rank, steps=1)

    for (took, text, error), params in collectives.run(rank_fn, 2, timeout=10):
        assert isinstance(error, collectives.CollectiveMismatchError), text
        assert ("disagree on mean or on the bucket's dtype (rank 0: DDP's hook, mean=True, a "
                "torch.float32 bucket, rank 1: DDP's hook, mean=False, a torch.float32 "
                "bucket)") in text and took < 2.0
        assert all(torch.isfinite(p).all() for p in params)


def test_a_mean_changed_on_one_rank_after_the_first_steps_fails_naming_mean():
    # (only that rank asked again, with an all-gather, beside its peers' all-reduce: the error
    # said the ranks called different collectives)
    def rank_fn(comm):
        net, ddp, state = ddp_over(comm)
        train(net, ddp, comm.rank)
        state.mean = comm.rank == 0
        return _failing_step(ddp, state, comm.rank)

    for took, text, error in collectives.run(rank_fn, 2, timeout=10):
        assert isinstance(error, collectives.CollectiveMismatchError), text
        assert "hooks disagree on mean" in text and took < 2.0, text


def test_ranks_whose_ddp_buckets_differ_fail_the_step_at_once_on_every_rank():
    """Rank 0 cuts the model into three buckets (its own ``bucket_cap_mb``), rank 1 into one
    (``find_unused_parameters`` keeps them, and makes DDP all-reduce its map of used
    parameters after them, through the process group). The buckets' calls meet calls of
    other shapes: a mismatch on both ranks, at once (rank 0's third bucket once waited its
    whole timeout for a call rank 1, alive and idle, would never make). A DDP step's buckets
    are issued together in a number the hook cannot know, so the mismatch breaks the
    communicator; rank 0 may hear that instead ("different numbers of calls"). Both reach
    ``backward()`` as PyTorch carries a Work's error: a RuntimeError with the message."""
    finished = threading.Barrier(2, timeout=30)

    def rank_fn(comm):
        cut = {"bucket_cap_mb": 0.0001} if comm.rank == 0 else {}
        ddp = DDP(model(), process_group=torch_ddp.process_group(comm),
                  find_unused_parameters=True, **cut)
        torch_ddp.register(ddp, comm, timeout=20.0)
        x, target = batch(0, comm.rank)
        try:
            (ddp(x) * target).sum().backward()
            error = None
        except Exception as exc:  # noqa: BLE001 - judged below
            error = exc
        finished.wait()  # (alive and idle, as a process that caught its error)
        return error

    error0, error1 = collectives.run(rank_fn, 2, timeout=30)
    assert "CollectiveMismatchError" in f"{type(error1).__name__}: {error1}", error1
    assert "CollectiveMismatchError" in f"{type(error0).__name__}: {error0}" or (
        "different numbers of calls (rank 0: several, rank 1: 1" in str(error0)), error0


def test_a_peer_that_never_comes_times_out_in_ddp_instead_of_hanging():
    done = threading.Event()

    def rank_fn(comm):
        net, ddp, state = ddp_over(comm, timeout=0.5)
        train(net, ddp, comm.rank)
        if comm.rank == 1:  # skips the step; waits for rank 0 to give up
            done.wait(20)
            return None
        try:
            return _failing_step(ddp, state, 0)
        finally:
            done.set()

    took, text, error = collectives.run(rank_fn, 2, timeout=10)[0]
    assert isinstance(error, collectives.CollectiveTimeoutError), error
    assert "CollectiveTimeoutError" in text
    assert took < 3.0


@pytest.mark.parametrize("find_unused", [False, True])
def test_after_a_timeout_the_next_ddp_step_says_the_communicator_broke(find_unused):
    # (with find_unused_parameters, DDP all-reduces its map of used parameters through the
    # process group from inside the backward pass: the group's call raised there, and DDP's
    # reducer, broken by it, failed the next step with PyTorch's internal assert)
    done = threading.Event()

    def rank_fn(comm):
        net = model()
        ddp = DDP(net, process_group=torch_ddp.process_group(comm), bucket_cap_mb=0.0001,
                  find_unused_parameters=find_unused)
        torch_ddp.register(ddp, comm, timeout=0.5)
        train(net, ddp, comm.rank, steps=1)
        if comm.rank == 1:  # skips the next steps; waits for rank 0 to give up
            done.wait(20)
            return None
        try:
            texts = []
            for step in (1, 2):
                x, target = batch(step, 0)
                with pytest.raises(RuntimeError) as raised:  # (a CollectiveError is one)
                    (ddp(x) * target).sum().backward()
                texts.append(f"{type(raised.value).__name__}: {raised.value}")
            return texts
        finally:
            done.set()

    # (without find_unused_parameters the step waits first in DDP's broadcast of its rebuilt
    # buckets, under the communicator's timeout)
    timed_out, after = collectives.run(rank_fn, 2, timeout=2)[0]
    assert "CollectiveTimeoutError" in timed_out, timed_out
    assert "CommunicatorBrokenError" in after and "INTERNAL ASSERT" not in after, after


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(comm=object()), TypeError, "Communicator"),
    (dict(mean="yes"), TypeError, "mean"),
    (dict(compression="fp8"), ValueError, "compression"),
    (dict(timeout=-1), ValueError, "timeout"),
    (dict(timeout=True), TypeError, "timeout"),  # (taken as 1 s)
    (dict(timeout=10 ** 400), ValueError, "timeout"),  # (failed at the step's wait)
    (dict(algorithm="nope"), ValueError, "algorithm='nope'"),  # (failed at the first step)
])
def test_bad_state_arguments_are_named(kwargs, error, words):
    def rank_fn(comm):
        options = {"comm": comm, **kwargs}
        with pytest.raises(error, match=words):
            torch_ddp.CommHookState(options.pop("comm"), **options)

    collectives.run(rank_fn, 1)


@pytest.mark.parametrize("bad, error, words", [
    (dict(compression="fp8"), ValueError, "compression='fp8'"),
    (dict(algorithm="nope"), ValueError, "algorithm='nope'"),
    (dict(timeout=-1), ValueError, "timeout=-1"),
    (dict(mean="yes"), TypeError, "mean must be"),
    (None, TypeError, "ddp must be"),  # (the model itself, not wrapped)
])
def test_a_bad_register_argument_on_one_rank_reaches_its_peers_at_once(bad, error, words):
    """Its peers waited in register's check of the ranks until their timeout (or paired that
    check with the bad rank's next call: a mismatch); they raise ``PeerFailedError`` naming
    it, and the next call works on every rank."""
    def rank_fn(comm):
        net = model()
        ddp = DDP(net, process_group=torch_ddp.process_group(comm))
        if comm.rank == 0:
            with pytest.raises(error, match=words):
                torch_ddp.register(net if bad is None else ddp, comm, **(bad or {}))
        else:
            with pytest.raises(collectives.PeerFailedError, match=f"rank 0 .*{words}"):
                torch_ddp.register(ddp, comm)
        return comm.all_reduce(np.ones(2)).tolist()

    assert collectives.run(rank_fn, 2, timeout=20) == [[2.0, 2.0]] * 2


def test_register_wants_a_ddp_model_and_the_hook_meets_ddps_contract():
    import inspect

    def rank_fn(comm):
        with pytest.raises(TypeError, match="DistributedDataParallel"):
            torch_ddp.register(torch.nn.Linear(2, 2), comm)

    collectives.run(rank_fn, 1)
    signature = inspect.signature(torch_ddp.allreduce_hook)
    assert list(signature.parameters)[1] == "bucket"
    assert signature.parameters["bucket"].annotation is dist.GradBucket
    assert signature.return_annotation == torch.futures.Future[torch.Tensor]


@pytest.mark.slow
@pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the mpich wheel's mpiexec beside this "
                    "Python: pip install -e '.[mpi]'")
def test_two_mpi_ranks_match_ddp_over_gloo_and_fail_cleanly(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable,
                           str(ROOT / "tests" / "mpi_scenarios" / "torch_ddp.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "SUMMARY torch_ddp PASS" in out, out[-6000:]
    for error in ("PeerFailedError", "CollectiveMismatchError", "CollectiveTimeoutError"):
        assert f"rank 0 {error}" in out, out[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the mpich wheel's mpiexec beside this "
                    "Python: pip install -e '.[mpi]'")
def test_doc_examples_run_as_written(tmp_path):
    """docs/torch.md's Python blocks (marked skip for tests/test_docs.py, which may run where
    PyTorch is missing): the one on MPI ranks under ``mpiexec -n 2``, the other (thread
    ranks) in this process, as a script."""
    page = (ROOT / "docs" / "torch.md").read_text()
    blocks = re.findall(r"^```python[ \t]*\n(.*?)^```[ \t]*$", page, re.S | re.M)
    assert len(blocks) == 2 and "collectives.init()" in blocks[0]
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    proc = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert proc.stdout.count("loss ") == 1, proc.stdout  # rank 0 alone prints
    exec(compile(blocks[1], "docs/torch.md (thread ranks)", "exec"), {"__name__": "__main__"})


def test_the_hooks_state_pickles_and_takes_a_communicator_again():
    # (the state held the communicator: pickling it, and so torch.save(ddp) or
    # copy.deepcopy(ddp) over a default gloo group with this hook, raised "cannot pickle
    # '_thread.lock' object"; DDP over the library's own group cannot pickle, PyTorch's rule)
    def rank_fn(comm):
        net, ddp, state = ddp_over(comm, mean=False, timeout=5.0)
        train(net, ddp, comm.rank, steps=1)
        torch.save(state, io.BytesIO())
        assert copy.deepcopy(state).comm is None
        restored = pickle.loads(pickle.dumps(state))
        assert restored.comm is None and restored.mean is False and restored.timeout == 5.0
        net2 = model()
        ddp2 = DDP(net2, process_group=torch_ddp.process_group(comm), bucket_cap_mb=0.0001)
        ddp2.register_comm_hook(restored, torch_ddp.allreduce_hook)
        x, target = batch(1, comm.rank)
        with pytest.raises(RuntimeError, match="has no communicator.*set state.comm"):
            (ddp2(x) * target).sum().backward()
        comm.barrier()
        restored.comm = comm  # (a new DDP object: the failed step broke nothing else)
        net3 = model()
        ddp3 = DDP(net3, process_group=torch_ddp.process_group(comm), bucket_cap_mb=0.0001)
        ddp3.register_comm_hook(restored, torch_ddp.allreduce_hook)
        return train(net3, ddp3, comm.rank, steps=2)

    first, second = collectives.run(rank_fn, 2, timeout=20)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
