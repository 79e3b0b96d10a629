"""PyTorch CPU tensors through every collective, as one function of a communicator: the same
body runs on thread ranks (``tests/test_torch.py``) and on MPI ranks (``torch_tensors.py``
under ``mpiexec``).

``calls`` makes every call of the Communicator once on NumPy arrays and once on tensors of the
same values; ``compare`` then checks, on one rank, that each tensor result is a tensor whose
bits equal the NumPy path's, that the NumPy path's equal the float64 reference (the inputs
are ``exact_inputs``: small integers, whose sums are exact in any order), and that no input
changed. NumPy has no bfloat16: a bfloat16 tensor is compared as its bits, viewed as
``ml_dtypes.bfloat16``.
"""

from __future__ import annotations

import numpy as np
import torch

from collectives.ops import BFLOAT16
from collectives.tools.reference import exact_inputs, expected_outputs, reference

DTYPES = ["float32", "float64", "int32", "int64", "float16", "bfloat16"]
OPS = ["sum", "mean", "max", "min", "prod"]
COUNT = 10  # elements of the reduced inputs
BATCH = ["sum", "rows", "table"]  # the inputs a batch (and the buckets) reduce, in order


def numpy_dtype(name: str) -> np.dtype | None:
    """The NumPy dtype of ``name`` (None: bfloat16 without ml_dtypes)."""
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor of ``a``'s values and dtype, in memory of its own."""
    if BFLOAT16 is not None and a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def as_array(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as NumPy, bfloat16 as ``ml_dtypes.bfloat16``."""
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return (got.dtype == want.dtype and got.shape == want.shape
            and got.tobytes() == want.tobytes())


def inputs_of(n: int, dtype: np.dtype) -> dict[str, list[np.ndarray]]:
    """Every rank's exact inputs, by name: one per op, ``rows`` (2 per rank, for
    reduce_scatter and all_to_all) and ``table`` (one row per rank, for scatter)."""
    made = {op: exact_inputs(n, COUNT, dtype, op, seed=3) for op in OPS}
    made["rows"] = exact_inputs(n, 2 * n * 3, dtype, "sum", seed=5, shape=(2 * n, 3))
    made["table"] = exact_inputs(n, n * 4, dtype, "sum", seed=7, shape=(n, 4))
    return made


def calls(comm, x: dict, bucket_bytes: int) -> dict:
    """Every collective of the Communicator on this rank's arrays ``x`` (NumPy arrays or
    tensors, as ``inputs_of`` names them), by name; non-roots' rooted results are None."""
    r, n = comm.rank, comm.size
    got = {f"all_reduce {op}": comm.all_reduce(x[op], op) for op in OPS}
    for k in range(3):  # repeated: a signature's later calls take the hot path where it has one
        got[f"all_reduce again {k}"] = comm.all_reduce(x["sum"])
    got["reduce"] = comm.reduce(x["sum"], "sum", root=n - 1)
    # (non-roots pass an array of the root's shape, whose type the result takes)
    got["broadcast"] = comm.broadcast(x["sum"], 0)
    got["all_gather"] = comm.all_gather(x["sum"])
    got["reduce_scatter"] = comm.reduce_scatter(x["rows"])
    got["gather"] = comm.gather(x["sum"], root=n - 1)
    zeros = torch.zeros_like if isinstance(x["sum"], torch.Tensor) else np.zeros_like
    row = zeros(x["table"][0])  # (out= tells non-roots the row's type, shape and dtype)
    done = comm.scatter(x["table"] if r == 0 else None, 0, out=row)
    got["scatter"] = row if done is row else ("not out", done)
    got["all_to_all"] = comm.all_to_all(x["rows"])
    got["async all_reduce"] = comm.all_reduce(x["sum"], "sum", async_op=True).wait()
    out = zeros(x["sum"])
    done = comm.all_reduce(x["sum"], "sum", out=out)
    got["out= all_reduce"] = out if done is out else ("not out", done)
    mine = zeros(x["sum"])
    mine[...] = x["sum"]  # (a copy of the input, reduced in place: out= itself)
    done = comm.all_reduce(mine, "sum", out=mine)
    got["in place all_reduce"] = mine if done is mine else ("not in place", done)
    batch = [x[name] for name in BATCH]
    for k, t in enumerate(comm.batch_all_reduce(batch)):
        got[f"batch {k}"] = t
    for k, t in enumerate(comm.batch_all_reduce(batch, async_op=True).wait()):
        got[f"async batch {k}"] = t
    buckets = comm.buckets(batch, bucket_bytes=bucket_bytes)
    for step in range(2):  # marked ready last to first, twice (the buckets are reused)
        for k in reversed(range(len(batch))):
            buckets.ready(k, batch[k])
        for k, t in enumerate(buckets.wait()):
            got[f"buckets step {step} {k}"] = t
    got.update(prepared(comm, x))
    if n > 1:  # a message to the next rank, received from the previous one into out
        sent = comm.isend(x["sum"], (r + 1) % n)
        into = zeros(x["sum"])
        done = comm.recv(into, (r - 1) % n)
        sent.wait()
        got["p2p recv"] = into if done is into else ("not out", done)
    return got


def zeros_of(like, shape):
    if isinstance(like, torch.Tensor):
        return torch.zeros(shape, dtype=like.dtype)
    return np.zeros(shape, like.dtype)


def prepared(comm, x: dict) -> dict:
    """The prepared calls, each bound once and started twice: ``wait()`` hands back the array
    it was bound to (the caller's tensor, where it was given tensors)."""
    r, n = comm.rank, comm.size
    rows = x["rows"].shape[0]
    lo, hi = r * rows // n, (r + 1) * rows // n
    mine = zeros_of(x["sum"], tuple(x["sum"].shape))
    mine[...] = x["sum"]  # (a copy of the input: in place, and broadcast's buffer)
    copy = zeros_of(x["sum"], tuple(x["sum"].shape))
    copy[...] = x["sum"]
    outs = {"all_reduce": zeros_of(x["sum"], x["sum"].shape), "in place all_reduce": mine,
            "reduce": zeros_of(x["sum"], x["sum"].shape) if r == n - 1 else None,
            "broadcast": copy,
            "all_gather": zeros_of(x["sum"], (n * x["sum"].shape[0], *x["sum"].shape[1:])),
            "reduce_scatter": zeros_of(x["rows"], (hi - lo, *x["rows"].shape[1:]))}
    bound = {
        "all_reduce": comm.all_reduce_init(x["sum"], out=outs["all_reduce"]),
        "in place all_reduce": comm.all_reduce_init(mine, out=mine),
        "reduce": comm.reduce_init(x["sum"], root=n - 1, out=outs["reduce"]),
        "broadcast": comm.broadcast_init(copy, 0),
        "all_gather": comm.all_gather_init(x["sum"], out=outs["all_gather"]),
        "reduce_scatter": comm.reduce_scatter_init(x["rows"], out=outs["reduce_scatter"]),
    }
    got = {}
    for name, call in bound.items():
        for _ in range(2):
            if name == "in place all_reduce":  # (the input again: the last run reduced it)
                mine[...] = x["sum"]
            result = call.start().wait()
        # (the very array it was bound to, the caller's tensor where it was given tensors)
        got[f"prepared {name}"] = result if result is outs[name] else ("not bound", result)
    return got


def fused_bytes(n: int, dtype: np.dtype) -> int:
    """A bucket size that fuses the batch's first two tensors and leaves the third alone."""
    return (COUNT + 6 * n) * dtype.itemsize


def expected(name: str, inputs: dict, n: int, rank: int) -> np.ndarray | None:
    """The float64 reference's result of ``calls``' entry ``name`` on ``rank``."""
    if name.startswith("all_reduce ") and name.split()[1] in OPS:
        op = name.split()[1]
        return reference(inputs[op], op)
    if name.startswith(("batch", "async batch", "buckets")):
        return reference(inputs[BATCH[int(name.split()[-1])]], "sum")
    if name.startswith(("all_reduce again", "async all_reduce", "out= all_reduce",
                        "in place all_reduce", "prepared all_reduce",
                        "prepared in place all_reduce")):
        return reference(inputs["sum"], "sum")
    if name == "p2p recv":
        return inputs["sum"][(rank - 1) % n]
    name = name.removeprefix("prepared ")
    source = {"reduce_scatter": "rows", "all_to_all": "rows", "scatter": "table"}.get(name, "sum")
    root = n - 1 if name in ("reduce", "gather") else 0
    return expected_outputs(name, inputs[source], "sum", root=root)[rank]


def compare(by_numpy: dict, by_torch: dict, inputs: dict, tensors: dict, before: dict,
            n: int, rank: int) -> list[str]:
    """What is wrong on ``rank`` (empty: nothing): ``by_numpy`` and ``by_torch`` are its
    results of ``calls``, ``tensors`` its tensor inputs after the calls, ``before`` copies of
    them made before."""
    wrong = []
    if by_torch.keys() != by_numpy.keys():
        wrong.append(f"calls differ: {sorted(by_torch.keys() ^ by_numpy.keys())}")
    for name, want in by_numpy.items():
        got, truth = by_torch.get(name), expected(name, inputs, n, rank)
        if truth is None:
            if got is not None or want is not None:
                wrong.append(f"{name}: expected None, got {got!r} and {want!r}")
        elif not isinstance(got, torch.Tensor):
            wrong.append(f"{name}: a {type(got).__name__} came back, not a tensor")
        elif not same_bits(as_array(got), want):
            wrong.append(f"{name}: tensor {as_array(got)} differs from NumPy's {want}")
        elif not same_bits(want, np.asarray(truth)):
            wrong.append(f"{name}: NumPy's {want} differs from the reference {truth}")
    for name, t in tensors.items():
        if not torch.equal(t, before[name]):
            wrong.append(f"input {name} was modified")
    return wrong


def run_both(comm, inputs: dict, tensors: dict) -> tuple[dict, dict]:
    """This rank's results of ``calls`` on NumPy arrays, then on ``tensors`` (its own)."""
    bucket = fused_bytes(comm.size, np.dtype(inputs["sum"][0].dtype))
    mine = {name: v[comm.rank].copy() for name, v in inputs.items()}
    return calls(comm, mine, bucket), calls(comm, tensors, bucket)
