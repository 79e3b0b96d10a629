"""PyTorch CPU tensors through every collective, for real: the same calls on the same inputs
as NumPy arrays and as tensors must give bitwise the same results, as tensors, and leave the
inputs as they were (``mpi_scenarios/torch_body.py``).

Thread ranks (``collectives.run``) on 1 to 3 ranks for float32, float64, int32, int64,
float16 and bfloat16 (NumPy has no bfloat16: a tensor crosses as its bits, viewed as
``ml_dtypes.bfloat16``); one ``mpiexec`` launch (``mpi_scenarios/torch_tensors.py``) runs the
same checks on MPI ranks.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import collectives

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="PyTorch is not installed (pip install -e '.[torch]')")
SCENARIOS = Path(__file__).parent / "mpi_scenarios"
sys.path.insert(0, str(SCENARIOS))
DTYPES = ["float32", "float64", "int32", "int64", "float16", "bfloat16"]  # torch_body.DTYPES
torch: Any = None
torch_body: Any = None


@pytest.fixture(autouse=True, scope="module")
def _torch() -> None:
    """PyTorch, imported when this module's first test runs, not when pytest collects it (every
    xdist worker collects every module; importing PyTorch costs seconds of CPU)."""
    global torch, torch_body
    import torch as module
    import torch_body as body

    torch, torch_body = module, body
    assert body.DTYPES == DTYPES, "torch_body.DTYPES changed: change DTYPES here alike"


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_collective_gives_tensors_bitwise_equal_to_numpy(n, dtype_name):
    dtype = torch_body.numpy_dtype(dtype_name)
    if dtype is None:
        pytest.skip("bfloat16 needs ml_dtypes (pip install ml_dtypes)")
    inputs = torch_body.inputs_of(n, dtype)
    tensors = [{name: torch_body.as_tensor(v[r]) for name, v in inputs.items()} for r in range(n)]
    before = [{name: t.clone() for name, t in mine.items()} for mine in tensors]
    got = collectives.run(lambda comm: torch_body.run_both(comm, inputs, tensors[comm.rank]), n)
    for r, (by_numpy, by_torch) in enumerate(got):
        wrong = torch_body.compare(by_numpy, by_torch, inputs, tensors[r], before[r], n, r)
        assert not wrong, f"rank {r} of {n}:\n" + "\n".join(wrong)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_a_tensor_that_requires_grad_is_refused_with_the_fix(dtype_name):
    """A bfloat16 tensor crosses as an int16 view, which never requires grad: still refused."""
    dtype = getattr(torch, dtype_name)

    def body(comm):
        with pytest.raises(TypeError, match=r"^x requires grad; pass x\.detach\(\)$"):
            comm.all_reduce(torch.ones(3, dtype=dtype, requires_grad=True))
        return comm.all_reduce(torch.ones(3, dtype=dtype, requires_grad=True).detach())

    for got in collectives.run(body, 2):
        assert got.dtype is dtype and got.tolist() == [2.0, 2.0, 2.0]


def test_a_lazy_conjugate_or_negation_is_refused_in_place_with_its_own_fix():
    # (a prepared call said "pass x.detach()", which keeps the conjugate bit)
    x = (torch.ones(3, dtype=torch.complex64) * 1j).conj()
    out = torch.zeros(3, dtype=torch.complex64)

    def body(comm):
        with pytest.raises(TypeError, match=r"pass x\.resolve_conj\(\)$"):
            comm.all_reduce_init(x.detach(), out=out)
        with pytest.raises(TypeError, match=r"pass out\.resolve_neg\(\)$"):
            comm.all_reduce_init(out, out=torch._neg_view(out))
        return comm.all_reduce_init(x.resolve_conj(), out=out).start().wait().tolist()

    assert collectives.run(body, 1) == [[-1j, -1j, -1j]]


UNREADABLE = {  # tensors in place of one of n complex elements, which pass a list's cheap
    # checks and fail where they are packed or read
    "conjugate": lambda n: torch.ones(n, dtype=torch.complex64).conj(),
    "sparse": lambda n: torch.ones(n, dtype=torch.complex64).to_sparse(),
    "nested": lambda n: torch.nested.nested_tensor([torch.ones(n // 2, dtype=torch.complex64)] * 2),
    "quantized": lambda n: torch.quantize_per_tensor(torch.ones(n), 0.1, 0, torch.quint8),
}


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")  # (deprecated, still made)
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # (a prototype)
@pytest.mark.parametrize("kind", ["batch", "batch-async", "fused", "buckets"])
@pytest.mark.parametrize("bad", list(UNREADABLE))
@pytest.mark.parametrize("at", [0, 1])
def test_a_tensor_the_library_cannot_read_on_one_rank_fails_every_rank_at_once(kind, bad, at):
    """Rank 1's tensor ``at`` cannot be handed over: it raises a TypeError naming it, its peer
    a PeerFailedError naming rank 1, both at once (the peer waited out its timeout where the
    tensor failed in packing or DLPack, after the call had gone out), and the next call works
    (a blocking batch refused as many calls as an asynchronous one issues, and the
    communicator broke). A lazy conjugate is refused in a fused batch too (PyTorch's packing
    resolved it, where every other call kind refuses it)."""
    import time

    def body(comm):
        good = [torch.ones(4, dtype=torch.complex64), torch.ones(3, dtype=torch.complex64)]
        xs = list(good)
        if comm.rank == 1:
            xs[at] = UNREADABLE[bad](len(good[at]))
        start = time.monotonic()
        try:
            if kind == "buckets":
                buckets = comm.buckets(good, bucket_bytes=0)
                for k, x in enumerate(xs):
                    buckets.ready(k, x)
                buckets.wait()
            else:
                got = comm.batch_all_reduce(xs, bucket_bytes=64 << 20 if kind == "fused" else 0,
                                            async_op=kind == "batch-async")
                if kind == "batch-async":
                    got.wait()
        except Exception as exc:  # noqa: BLE001 - judged below
            outcome = type(exc).__name__, str(exc), time.monotonic() - start
        else:
            outcome = "returned", "", time.monotonic() - start
        return outcome, comm.all_reduce(torch.ones(2)).tolist()

    ((kind0, said0, took0), next0), ((kind1, said1, took1), next1) = collectives.run(
        body, 2, timeout=10)
    assert next0 == next1 == [2.0, 2.0]
    name = f"tensor {at}" if kind == "buckets" else f"xs[{at}]"
    assert kind1 == "TypeError" and said1.startswith(name), said1
    assert kind0 == "PeerFailedError" and "rank 1" in said0 and name in said0, said0
    assert max(took0, took1) < 2.0, (took0, took1)


def test_a_nested_tensor_in_a_numpy_list_on_one_rank_is_refused_on_every_rank():
    # (the list's check asked hasattr(x, "shape"), which let a nested tensor's RuntimeError
    # out, past the refusal: the peer waited out its timeout)
    import time
    import warnings

    def body(comm):
        xs = [np.zeros(4, np.float32), np.zeros(2, np.float32)]
        if comm.rank == 0:
            with warnings.catch_warnings():  # (PyTorch's nested tensors are a prototype)
                warnings.simplefilter("ignore")
                xs[1] = torch.nested.nested_tensor([torch.zeros(1), torch.zeros(1)])
        start = time.monotonic()
        with pytest.raises((TypeError, collectives.PeerFailedError)) as raised:
            comm.batch_all_reduce(xs)
        return (type(raised.value).__name__, str(raised.value), time.monotonic() - start,
                comm.all_reduce(np.ones(2)).tolist())

    (kind0, said0, took0, next0), (kind1, said1, took1, next1) = collectives.run(
        body, 2, timeout=10)
    assert kind0 == "TypeError" and said0.startswith("xs[1] is a torch.Tensor"), said0
    assert kind1 == "PeerFailedError" and "rank 0" in said1, said1
    assert max(took0, took1) < 2.0 and next0 == next1 == [2.0, 2.0]


def test_an_asynchronous_tensor_calls_handle_takes_done_callbacks():
    # (its handle, which gives tensors back, had no add_done_callback)
    def body(comm):
        heard = []
        handle = comm.all_reduce(torch.ones(3), async_op=True)
        handle.add_done_callback(lambda h: heard.append(h.wait().tolist()))
        got = handle.wait()
        return type(got).__name__, heard

    for kind, heard in collectives.run(body, 2):
        assert kind == "Tensor" and heard == [[2.0, 2.0, 2.0]]


@pytest.mark.parametrize("async_op", [False, True])
def test_a_numpy_out_for_a_tensor_is_what_comes_back(async_op):
    # (the result came back as a tensor over ``out``'s memory, not ``out`` itself)
    import numpy as np

    def body(comm):
        out = np.zeros(3, np.float32)
        got = comm.all_reduce(torch.ones(3), out=out, async_op=async_op)
        got = got.wait() if async_op else got
        return got is out, out.tolist()

    assert collectives.run(body, 2) == [(True, [2.0, 2.0, 2.0])] * 2


@pytest.mark.parametrize("first", ["numpy", "torch"])
@pytest.mark.parametrize("call", ["all_reduce", "batch_all_reduce", "all_gather"])
def test_a_multi_device_list_that_mixes_numpy_and_tensors_is_refused_by_name(first, call):
    # (NumPy first: NumPy's "Cannot interpret 'torch.float32' as a data type", naming no
    # argument; a tensor first: accepted, and the NumPy array came back as a tensor)
    import numpy as np

    kinds = [np.ones(3, np.float32), torch.ones(3)]
    values = kinds if first == "numpy" else kinds[::-1]
    other = "torch.Tensor" if first == "numpy" else "numpy.ndarray"
    if call == "batch_all_reduce":  # one tensor on two devices; two tensors on one device
        for batch in ([values], [[v] for v in values]):
            with pytest.raises(TypeError, match=rf"values?(_lists)?\[[01]\]\[[01]\] is a "
                                                rf"{other} but .* the same kind"):
                collectives.batch_all_reduce(batch)
        return
    with pytest.raises(TypeError, match=rf"values\[1\] is a {other} but .* the same kind"):
        getattr(collectives, call)(values)


def test_buckets_take_a_models_parameters_as_their_layout():
    # (``like`` gives shapes and dtypes only: parameters, which require grad, were refused;
    # what ``ready`` is given is read, and a tensor that requires grad still is)
    def body(comm):
        params = list(torch.nn.Linear(4, 3).parameters())
        buckets = comm.buckets(params)
        with pytest.raises(TypeError, match="requires grad"):
            buckets.ready(0, params[0])
        for k, p in enumerate(params):
            buckets.ready(k, torch.full_like(p, comm.rank + 1.0).detach())
        return [t.tolist() for t in buckets.wait()]

    for got in collectives.run(body, 2):
        assert got == [[[3.0] * 4] * 3, [3.0] * 3]


def test_the_hot_paths_take_by_pointer_only_what_the_edge_would_take():
    """The MPI hot path (``host_address``) and NCCL's (``by_pointer``, CUDA tensors) read
    and write a tensor by address only where the edge would take it as it is: never one that
    requires grad, a lazy conjugate or negation, or a strided view."""
    from collectives.adapters.torch_arrays import TorchArrays

    z = torch.ones(4, dtype=torch.complex64)
    cases = {"plain": torch.ones(4), "requires grad": torch.ones(4, requires_grad=True),
             "strided": torch.ones(8)[::2], "conjugate": z.conj(),
             "negative": torch._neg_view(torch.ones(4)),  # (contiguous, lazily negated)
             "detached": torch.ones(4, requires_grad=True).detach()}
    taken = {name for name, x in cases.items() if TorchArrays.by_pointer(x)}
    assert taken == {"plain", "detached"}
    assert taken == {name for name, x in cases.items() if TorchArrays.host_address(x) is not None}


@pytest.mark.slow  # an MPI launch
def test_tensors_on_mpi_ranks():
    """Every dtype's checks above, on three MPI ranks, in one launch."""
    beside = Path(sys.executable).parent / "mpiexec"  # (a venv's MPICH wheel), else PATH's
    mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec")
    if importlib.util.find_spec("mpi4py") is None or mpiexec is None:
        pytest.skip("needs mpi4py and an mpiexec (pip install -e '.[mpi]' installs both)")
    env = {**os.environ, "PYTHONPATH": str(SCENARIOS.parent.parent), "OMP_NUM_THREADS": "1"}
    env.pop("COLLECTIVES_RANKS_PER_NODE", None)  # (one node: what the launch is)
    proc = subprocess.run([mpiexec, "-n", "3", sys.executable, str(SCENARIOS / "torch_tensors.py")],
                          capture_output=True, text=True, timeout=180, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-6000:]}"
    assert "SUMMARY torch_tensors PASS" in out, out[-6000:]


def test_shared_result_is_refused_for_tensors_which_cannot_be_read_only():
    # (the read-only views of one buffer came back as writable tensors over it: one device's
    # in-place step changed every device's result)
    values = [torch.arange(4.0) + d for d in range(3)]
    with pytest.raises(ValueError, match="shared_result=True .* torch.Tensor arrays cannot be"):
        collectives.all_reduce(values, shared_result=True)
    separate = collectives.all_reduce(values)
    separate[0].div_(3)
    assert separate[1].tolist() == [3.0, 6.0, 9.0, 12.0]
