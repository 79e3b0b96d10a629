"""PyTorch CPU tensors through every collective on MPI ranks (``py``): for each
dtype, every call on NumPy arrays and on tensors of the same values, compared on every rank:
tensors come back, bitwise NumPy's results, which equal the float64 reference (so every rank
holds the same bits), and the inputs are untouched; then the hot path by address
(``hot_path_by_address``), a tensor that cannot be read on one rank
(``unreadable_on_one_rank``), and a tensor on shared memory (``Communicator.shared_empty``).

Run as ``.venv/bin/mpiexec -n 3 .venv/bin/python tests/mpi_scenarios/torch_tensors.py``.
"""

from __future__ import annotations

import warnings

import torch
from _common import Report
from collectives.backends import mpi
from collectives.backends.mpi.kind_path import KindBound
from torch_body import DTYPES, as_tensor, compare, inputs_of, numpy_dtype, run_both

warnings.filterwarnings("ignore", "The PyTorch API of nested tensors")  # (a prototype)
report = Report("torch_tensors")
comm = mpi.init(timeout=60)
n, rank = comm.size, comm.rank
for name in DTYPES:
    dtype = numpy_dtype(name)
    if dtype is None:  # (bfloat16 without ml_dtypes)
        continue
    inputs = inputs_of(n, dtype)
    tensors = {key: as_tensor(v[rank]) for key, v in inputs.items()}
    before = {key: t.clone() for key, t in tensors.items()}
    by_numpy, by_torch = run_both(comm, inputs, tensors)
    wrong = compare(by_numpy, by_torch, inputs, tensors, before, n, rank)
    report.check(not wrong, f"{name}: " + "; ".join(wrong[:5]))


def hot_path_by_address() -> list[str]:
    """A repeated small all-reduce of one signature on tensors runs the MPI hot path on the
    tensors' addresses (``backends/mpi/kind_path.py``), compiled where it is built: NumPy's
    bits, the inputs untouched, ``out=`` (another tensor, the input itself) honoured; a MEAN
    takes the engine's way; a tensor that requires grad is still refused, naming the fix."""
    wrong = []
    x = torch.arange(1000, dtype=torch.float32) * (rank + 1)
    before = x.clone()
    want = comm.all_reduce(x.numpy().copy())  # NumPy's call of the same signature
    for i in range(6):
        got = comm.all_reduce(x)
        if not (isinstance(got, torch.Tensor) and got.numpy().tobytes() == want.tobytes()):
            wrong.append(f"call {i}: {got!r}")
        # (from the third call on: the first agrees the signature, the second binds the kind)
        bound = comm.calls.last_hot.bound if comm.calls.last_hot is not None else None
        if i >= 2 and not isinstance(bound, KindBound):
            wrong.append(f"call {i} did not take the hot path by address: {bound!r}")
    out = torch.empty_like(x)
    if comm.all_reduce(x, out=out) is not out or out.numpy().tobytes() != want.tobytes():
        wrong.append("out= another tensor")
    y = x.clone()
    if comm.all_reduce(y, out=y) is not y or y.numpy().tobytes() != want.tobytes():
        wrong.append("out= the input itself")
    mean = comm.all_reduce(x, "mean")
    if mean.numpy().tobytes() != comm.all_reduce(x.numpy().copy(), "mean").tobytes():
        wrong.append("mean")
    try:
        comm.all_reduce(x.clone().requires_grad_(True))
        wrong.append("a tensor that requires grad was reduced")
    except TypeError as exc:
        if "detach()" not in str(exc):
            wrong.append(f"requires grad: {exc}")
    if comm.all_reduce(x).numpy().tobytes() != want.tobytes():
        wrong.append("the call after the refused one")
    if not torch.equal(x, before):
        wrong.append("the input changed")
    return wrong


wrong = hot_path_by_address()
report.check(not wrong, "hot path by address: " + "; ".join(wrong[:5]))

UNREADABLE = {"nested": lambda: torch.nested.nested_tensor([torch.ones(3)] * 4),  # (strided:
              "jagged": lambda: torch.nested.nested_tensor([torch.ones(3)] * 4,  # its shape
                                                           layout=torch.jagged),  # raises)
              "sparse": lambda: torch.ones(4, 3).to_sparse(),
              # (the hot path's signature: a meta or zero tensor's address is 0, which the
              # hot path read, and the process crashed; an mkldnn tensor's raised inside the
              # call, which broke the communicator)
              "meta": lambda: torch.ones(1000, device="meta"),
              "zero": lambda: torch._efficientzerotensor(1000),
              "mkldnn": lambda: torch.ones(1000).to_mkldnn()}


def unreadable_on_one_rank() -> list[str]:
    """A tensor the library cannot read (nested, sparse, meta, zero, mkldnn) on rank 1, in a
    call of a new signature right after a hot-path call of another: rank 1 raises a TypeError
    naming ``x``, its peers a PeerFailedError naming rank 1, and the next call works (a nested
    tensor's RuntimeError, raised as the hot path's check read its shape, escaped on rank 1
    alone: its peers were never told, and its next call paired with their call)."""
    wrong = []
    for kind, bad in UNREADABLE.items():
        comm.all_reduce(torch.ones(1000))  # (the hot path is the last call's)
        try:
            comm.all_reduce(bad() if rank == 1 else torch.ones(4, 3))
            wrong.append(f"{kind}: returned")
        except Exception as exc:  # noqa: BLE001 - judged here
            want = ("TypeError", "x ") if rank == 1 else ("PeerFailedError", "rank 1")
            if type(exc).__name__ != want[0] or want[1] not in str(exc):
                wrong.append(f"{kind}: {type(exc).__name__}: {exc}")
        if comm.all_reduce(torch.ones(2)).tolist() != [float(n)] * 2:
            wrong.append(f"{kind}: the next call")
    return wrong


wrong = unreadable_on_one_rank()
report.check(not wrong, "a tensor that cannot be read on one rank: " + "; ".join(wrong[:5]))

# a tensor on shared memory (shared_empty): auto runs the shared-memory all-reduce through it
shared = torch.from_numpy(comm.shared_empty(1 << 16, "float32"))  # (256 KiB: auto's threshold)
shared.fill_(rank + 1)
comm.transport.native.last = None
got = comm.all_reduce(shared, out=shared)
report.check(got is shared and bool((shared == n * (n + 1) / 2).all()), "shared tensor: wrong sum")
report.check(comm.transport.native.last == "shm",
             f"shared tensor: ran {comm.transport.native.last}, not the shared-memory all-reduce")
comm.free()
report.finish(f"dtypes={len(DTYPES)}")
