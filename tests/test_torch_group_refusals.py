"""What the ``torch.distributed`` process group over a communicator
(``collectives.adapters.torch_ddp.process_group``) refuses, for real (real torch CPU tensors on
thread ranks, beside gloo where gloo runs here): an integer average, lazily negated views,
lists of several tensors, ops with no equivalent, the calls it does not run, outputs that
require grad; each before any data moves, on the refusing rank at once and, through the call
its peers make, on theirs.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest
from torch_group_kit import on_collectives, on_gloo

import collectives

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="needs PyTorch: pip install torch (the CPU build)")
torch: Any = None
dist: Any = None


@pytest.fixture(autouse=True, scope="module")
def _torch() -> None:
    """PyTorch, imported when this module's first test runs, not when pytest collects it."""
    global torch, dist
    import torch as module
    import torch.distributed

    torch, dist = module, torch.distributed


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8", "bool"])
def test_an_integer_average_is_refused_on_every_rank_as_gloo_refuses_it(dtype):
    # (it was truncated back into the integer tensor: [5, -3, 7] for the means [5.5, -3.5,
    # 7.5], and 2**62 + 1, 2**62 + 3 gave -2**62 after the sum wrapped)
    def job(group, rank):
        t = torch.tensor([5, 3, 1], dtype=getattr(torch, dtype)) + rank
        before = t.clone()
        with pytest.raises((TypeError, RuntimeError)) as raised:  # (gloo: RuntimeError)
            dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group)
        return torch.equal(t, before), str(raised.value)

    on_gloo(job)
    for unchanged, message in on_collectives(job):  # (gloo's tensor holds the sum by then)
        assert unchanged and "allreduce tensor" in message and "AVG" in message


def test_a_lazily_negated_or_conjugated_view_is_refused_on_every_rank():
    # (NumPy read its memory as it lies: the sum of x.conj().imag came back negated, and a
    # broadcast into a negated view landed negated; gloo leaves such a tensor unchanged;
    # PyTorch itself refuses a conjugated complex one)
    def job(group, rank):
        z = torch.tensor([1 + 2j, 3 - 1j]) * (rank + 1)
        errors = []
        for call in (lambda: dist.all_reduce(z.conj().imag, group=group),
                     lambda: dist.broadcast(torch.zeros(2)._neg_view(), group=group, group_src=0)):
            with pytest.raises(TypeError, match="resolve_neg") as raised:
                call()
            errors.append(str(raised.value))
        return errors, z.tolist()

    for rank, (errors, z) in enumerate(on_collectives(job)):
        assert len(errors) == 2 and "negated or conjugated view" in errors[0]
        assert z == [(1 + 2j) * (rank + 1), (3 - 1j) * (rank + 1)]  # (nothing written)


def test_calls_the_group_does_not_run_name_the_communicators_call_on_every_rank():
    # (PyTorch's "No backend type associated with device type cpu", which names neither)
    def job(group, rank):
        errors = {}
        for name, call in {
            "reduce": lambda: dist.reduce(torch.ones(2), group_dst=0, group=group),
            "all_to_all": lambda: dist.all_to_all_single(torch.zeros(2), torch.ones(2),
                                                         group=group),
            "batch_all_reduce": lambda: dist.all_reduce_coalesced([torch.ones(2)], group=group),
            "all_reduce": lambda: group.allreduce([torch.ones(2), torch.ones(2)]).wait(),
        }.items():
            with pytest.raises((NotImplementedError, ValueError)) as raised:
                call()
            errors[name] = str(raised.value)
        return errors

    for errors in on_collectives(job):
        for instead, message in errors.items():
            assert f"{instead}()" in message or "once per tensor" in message, message


# A call one rank's group refuses, and the error it raises there; its peer makes a good call.
REFUSED = {
    "an integer average": (lambda group: dist.all_reduce(
        torch.tensor([5, 3, 1]), op=dist.ReduceOp.AVG, group=group), "TypeError"),
    "an op with no equivalent": (lambda group: dist.all_reduce(
        torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND, group=group), "ValueError"),
    "a call the group does not run": (lambda group: dist.reduce(
        torch.ones(2), group_dst=0, group=group), "NotImplementedError"),
    # (DLPack's "Unsupported dtype in DLTensor", naming nothing)
    "a dtype NumPy does not have": (lambda group: dist.all_reduce(
        torch.ones(2, dtype=torch.float8_e4m3fn), group=group), "TypeError"),
    # (a sparse or nested tensor raised PyTorch's BufferError or RuntimeError on its rank
    # alone, as the group read it after its checks: the peers waited out their timeout)
    "a sparse tensor": (lambda group: dist.all_reduce(
        torch.ones(2).to_sparse(), group=group), "TypeError"),
    "a nested tensor": (lambda group: dist.all_reduce(
        _nested(), group=group), "TypeError"),
    "a sparse tensor to broadcast": (lambda group: dist.broadcast(
        torch.ones(2).to_sparse(), group=group, group_src=0), "TypeError"),
    "a sparse tensor to gather": (lambda group: dist.all_gather(
        [torch.zeros(2), torch.zeros(2)], torch.ones(2).to_sparse(), group=group), "TypeError"),
    "a sparse tensor to gather into one": (lambda group: dist.all_gather_into_tensor(
        torch.zeros(4), torch.ones(2).to_sparse(), group=group), "TypeError"),
    "a sparse tensor to scatter": (lambda group: dist.reduce_scatter_tensor(
        torch.zeros(1), torch.ones(2).to_sparse(), group=group), "TypeError"),
    # (an expanded tensor's write-back raised on its rank alone, after the data had moved;
    # a broadcast into one kept one of the values)
    "an expanded tensor": (lambda group: dist.all_reduce(
        torch.ones(1).expand(2), group=group), "ValueError"),
    "an expanded tensor to broadcast into": (lambda group: dist.broadcast(
        torch.ones(1).expand(2), group=group, group_src=0), "ValueError"),
    # (rows that overlap took the ranks' write-backs in different orders: results differed)
    "an overlapping view": (lambda group: dist.all_reduce(
        torch.arange(4.0).as_strided((3, 2), (1, 1)), group=group), "ValueError"),
}


def _nested():
    import warnings

    with warnings.catch_warnings():  # (PyTorch's nested tensors are a prototype)
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.ones(1), torch.ones(1)])


def test_point_to_point_calls_are_refused_at_once_by_the_rank_alone():
    # (refused through a call every rank makes: the sender and receiver waited for a third
    # rank's next collective, which then failed, blaming them)
    import time

    def job(group, rank):
        start = time.monotonic()
        if rank == 2:
            return "ok", dist.all_reduce(torch.ones(2), group=group) is None, 0.0
        with pytest.raises(NotImplementedError, match="send|recv") as raised:
            if rank == 0:
                dist.send(torch.ones(2), group_dst=1, group=group)
            else:
                dist.recv(torch.ones(2), group_src=0, group=group)
        took = time.monotonic() - start
        dist.all_reduce(torch.ones(2), group=group)  # (the ranks go on together)
        return type(raised.value).__name__, True, took

    got = on_collectives(job, 3, timeout=20)
    assert [kind for kind, _, _ in got] == ["NotImplementedError"] * 2 + ["ok"], got
    assert all(took < 1 for _, _, took in got), got


@pytest.mark.parametrize("case", list(REFUSED))
def test_one_ranks_refused_call_fails_its_peers_at_once(case):
    # (refused on that rank alone, before its call: its peer waited out its whole timeout)
    import time

    refused, error = REFUSED[case]

    def job(group, rank):
        start = time.monotonic()
        with pytest.raises((TypeError, ValueError, NotImplementedError,
                            collectives.PeerFailedError)) as raised:
            if rank == 0:
                refused(group)
            else:
                dist.all_reduce(torch.ones(2), group=group)
        took = time.monotonic() - start
        if rank == 0:
            time.sleep(3)  # (alive: a rank that returned would have told its peers anyway)
        return type(raised.value).__name__, took

    got = on_collectives(job, 2, timeout=20)
    assert [kind for kind, _ in got] == [error, "PeerFailedError"], got
    assert all(took < 2 for _, took in got), got


def test_an_allgather_into_outputs_that_require_grad_is_refused_as_gloo_refuses_it():
    # (the tensor forms wrote into such an output silently)
    def job(group, rank):
        outputs = [torch.zeros(2, requires_grad=True) for _ in range(2)]
        messages = []
        for call in (lambda: dist.all_gather(outputs, torch.ones(2), group=group),
                     lambda: dist.all_gather_into_tensor(torch.zeros(4, requires_grad=True),
                                                         torch.ones(2), group=group),
                     lambda: dist.reduce_scatter_tensor(torch.zeros(1, requires_grad=True),
                                                        torch.ones(2), group=group)):
            with pytest.raises(RuntimeError) as raised:  # (gloo's words differ by form)
                call()
            messages.append(str(raised.value))
        return messages

    on_gloo(job)
    for messages in on_collectives(job):
        assert all("requires grad" in m for m in messages), messages


def test_an_allgather_into_a_nested_output_names_it():
    # (its shape, read first, raised PyTorch's "NestedTensorImpl doesn't support sizes")
    def job(group, rank):
        outputs = [_nested(), torch.zeros(2)]
        with pytest.raises(TypeError) as raised:
            dist.all_gather(outputs, torch.ones(2), group=group)
        return str(raised.value)

    for message in on_collectives(job):
        assert message.startswith("allgather output[0] is a nested tensor"), message


def test_dtypes_numpy_does_not_have_are_refused_naming_the_dtype_on_every_rank():
    # (every call raised DLPack's "Unsupported dtype in DLTensor")
    def job(group, rank):
        messages = []
        for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            t = torch.zeros(2, dtype=dtype)
            for call in (lambda t=t: dist.all_reduce(t, group=group),
                         lambda t=t: dist.broadcast(t, group=group, group_src=0),
                         lambda t=t: dist.all_gather([torch.zeros_like(t)] * 2, t, group=group)):
                with pytest.raises(TypeError) as raised:
                    call()
                messages.append(str(raised.value))
        return messages

    for messages in on_collectives(job):
        assert len(messages) == 6 and all("tensor is torch." in m and "tensor.float()" in m
                                          for m in messages), messages


DTYPE_PAIRS = [("float32", "float16"), ("float16", "bfloat16"), ("bfloat16", "int16")]
GROUP_CALLS = {
    "allreduce": lambda t, group: dist.all_reduce(t, group=group),
    "broadcast": lambda t, group: dist.broadcast(t, group=group, group_src=0),
    "allgather": lambda t, group: dist.all_gather([torch.empty_like(t)] * 2, t, group=group),
    "all_gather_into_tensor": lambda t, group: dist.all_gather_into_tensor(
        torch.empty(2 * t.numel(), dtype=t.dtype), t, group=group),
    "reduce_scatter_tensor": lambda t, group: dist.reduce_scatter_tensor(
        torch.empty(t.numel() // 2, dtype=t.dtype), t, group=group),
}


@pytest.mark.parametrize("call", list(GROUP_CALLS))
@pytest.mark.parametrize("dtypes", DTYPE_PAIRS, ids="-".join)
def test_ranks_whose_tensors_differ_in_dtype_fail_on_every_rank(dtypes, call):
    # (float16 and bfloat16 moved as their bits and were reduced as float32: a float16 tensor
    # broadcast into a bfloat16 one arrived as nonsense (1.5 as 0.125), a float16 tensor was
    # summed with a float32 one; none raised, and DDP trained on)
    def job(group, rank):
        t = torch.full((4,), 1.5, dtype=getattr(torch, dtypes[rank]))
        before = t.clone()
        with pytest.raises(collectives.CollectiveMismatchError) as raised:
            GROUP_CALLS[call](t, group)
        return torch.equal(t, before), str(raised.value), group.comm.all_reduce(
            np.ones(2)).tolist()

    for unchanged, message, after in on_collectives(job):
        assert unchanged and "different dtype" in message, message
        assert all(name in message for name in dtypes), message
        assert after == [2.0, 2.0]  # (the communicator stays usable)
