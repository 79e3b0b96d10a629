"""What the collectives process group (``torch_group``) takes, checked: PyTorch's call forms
(options, a ReduceOp or a root instead of options, one tensor), tensors as NumPy views of
their memory, and the results written back.
"""

import functools
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from collectives.extras import install_line
from collectives.ops import BFLOAT16, ReduceOp
from collectives.runtime.calls import BatchTag

# reduced in float32 and copied back: bfloat16, which NumPy has no arithmetic of its own for,
# and float16, whose sum may pass its range where the mean does not (DDP's own hook divides
# first)
UPCAST = (torch.bfloat16, torch.float16)

OPS = {dist.ReduceOp.SUM: ReduceOp.SUM, dist.ReduceOp.AVG: ReduceOp.MEAN,
       dist.ReduceOp.MAX: ReduceOp.MAX, dist.ReduceOp.MIN: ReduceOp.MIN,
       dist.ReduceOp.PRODUCT: ReduceOp.PROD}


LOGICAL = {ReduceOp.SUM: ReduceOp.MAX, ReduceOp.PROD: ReduceOp.MIN}


def host_view(tensor: torch.Tensor, argument: str) -> np.ndarray:
    """A NumPy view of a CPU tensor, in its own dtype (bfloat16 as ``ml_dtypes.bfloat16``), so
    that the ranks' calls agree on it: moved as bits (int16), a float16 tensor paired with a
    bfloat16 one, whose values arrived as nonsense. Reductions pass float32 copies of both
    (``carried``), with the dtype in their tag (``reduced_as``)."""
    usable(tensor, argument)
    tensor = tensor.detach()  # (as gloo's: a collective works on the data, outside autograd;
    if tensor.dtype is not torch.bfloat16:  # DLPack refused a tensor that requires grad)
        return np.from_dlpack(tensor)
    if BFLOAT16 is None:
        raise TypeError(f"{argument} is bfloat16, which the collectives process group moves "
                        f"as ml_dtypes.bfloat16: {install_line('bfloat16')}")
    return tensor.view(torch.int16).numpy().view(BFLOAT16)


def usable(tensor: torch.Tensor, argument: str) -> None:
    """What the group's NumPy views cannot carry: a sparse or nested tensor, a tensor off the
    CPU, of a dtype NumPy has no equivalent of (float8), or a lazily negated or conjugated
    view (``x.conj().imag``), whose memory holds other values than it shows."""
    if not isinstance(tensor, torch.Tensor):  # (the group called directly: dist's calls check)
        raise TypeError(f"{argument} is a {type(tensor).__name__}, not a torch.Tensor; pass "
                        "tensors")
    if tensor.is_nested or tensor.layout != torch.strided:  # (a nested one's shape raises)
        kind = "nested" if tensor.is_nested else str(tensor.layout).removeprefix("torch.")
        raise TypeError(f"{argument} is a {kind} tensor; the collectives process group "
                        "carries dense tensors: pass a dense one (tensor.to_dense())")
    if tensor.device.type != "cpu":
        raise TypeError(f"{argument}: the collectives process group carries CPU tensors, not "
                        f"tensors on {tensor.device}; use a gloo or NCCL group for the model")
    if not viewable(tensor.dtype):  # (DLPack's "Unsupported dtype in DLTensor" named nothing)
        raise TypeError(f"{argument} is {tensor.dtype}, which the collectives process group "
                        "cannot carry (NumPy has no such dtype); pass a copy in one it has "
                        "(tensor.float()), or its bits (tensor.view(torch.uint8)) to move them")
    if tensor.is_neg() or tensor.is_conj():
        raise TypeError(f"{argument} is a lazily negated or conjugated view (its memory holds "
                        "other values than it shows); pass tensor.resolve_neg().resolve_conj()")


@functools.cache
def viewable(dtype: torch.dtype) -> bool:
    """Whether the group carries ``dtype``: NumPy views it, or it is reduced in float32."""
    if dtype in UPCAST:
        return True
    try:
        np.from_dlpack(torch.empty(0, dtype=dtype))
    except (BufferError, RuntimeError, TypeError):
        return False
    return True


def writable(tensor: torch.Tensor, argument: str) -> None:
    """An output the group writes: usable, unaliased, and no leaf that requires grad (gloo
    refuses it: autograd forbids writing into one in place)."""
    usable(tensor, argument)
    unaliased(tensor, argument)
    if tensor.requires_grad and tensor.is_leaf:
        raise RuntimeError(f"{argument} is a leaf tensor that requires grad, which cannot be "
                           "written in place; pass one made without requires_grad (or under "
                           "torch.no_grad())")


def unaliased(tensor: torch.Tensor, argument: str) -> None:
    """A tensor the group writes in place has one element per address: an expanded one
    (stride 0) has several, and its write-back raised on its rank alone, after the data had
    moved (allreduce), or kept one of the values (broadcast); an ``as_strided`` view whose
    rows overlap took ranks' writes in different orders. Every dimension's stride must pass
    the farthest element the smaller-strided ones reach (which holds for every view that does
    not overlap, a stepped slice's too, but for odd interleavings ``as_strided`` can make:
    refused too, naming the fix)."""
    reach = 0  # the offset of the farthest element of the dimensions seen so far
    for stride, size in sorted((s, n) for s, n in zip(tensor.stride(), tensor.shape) if n > 1):
        if stride <= reach:
            raise ValueError(f"{argument} has elements that share memory (an expanded or "
                             "overlapping view), and the group writes each one; pass a tensor "
                             "of its own (tensor.clone()) and copy the result back")
        reach += stride * (size - 1)


def one_tensor(tensors: Any, what: str) -> torch.Tensor:
    """The one tensor of a call: PyTorch's list of several is its multi-device form."""
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    if len(tensors) != 1:
        raise ValueError(f"{what} got {len(tensors)} tensors; the collectives process group "
                         "takes one per call (a list of several is PyTorch's multi-device "
                         "form): call it once per tensor")
    usable(tensors[0], f"{what} tensor")
    return tensors[0]


def averaged(op: ReduceOp, tensor: torch.Tensor, what: str) -> None:
    if op is ReduceOp.MEAN and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"{what} tensor is {tensor.dtype}: ReduceOp.AVG of integer or bool "
                        "tensors has no result of their dtype (gloo refuses it too); reduce a "
                        "floating-point copy, or SUM and divide")


def check_gather_outputs(into: list, tensor: torch.Tensor, size: int) -> None:
    """An all-gather's output list: one tensor per rank, each of the input's shape and dtype
    (NumPy's broadcasting would otherwise fill a wider one, and a short list lose ranks), and
    each one the group can write."""
    if len(into) != size:
        raise ValueError(f"allgather output list holds {len(into)} tensors; pass {size}, one "
                         "per rank")
    for rank, out in enumerate(into):
        writable(out, f"allgather output[{rank}]")  # (first: a nested one's shape raises)
        if out.shape != tensor.shape or out.dtype != tensor.dtype:
            raise ValueError(f"allgather output[{rank}] is {out.dtype}{list(out.shape)}; "
                             f"pass tensors like the input, {tensor.dtype}{list(tensor.shape)}")


def reduce_op(opts: Any) -> ReduceOp:
    """The op of an allreduce's options, given as PyTorch's groups take them: AllreduceOptions,
    a ReduceOp, or nothing (SUM)."""
    if opts is None:
        return ReduceOp.SUM
    given = getattr(opts, "reduceOp", opts)
    given = getattr(given, "op", given)  # (ReduceOp wraps a RedOpType)
    op = OPS.get(given)
    if op is None:
        raise ValueError(f"reduce op {given} has no collectives equivalent; use one of "
                         f"{', '.join(str(o) for o in OPS)}")
    return op


def root_of(opts: Any) -> int:
    """The root of a broadcast's options: BroadcastOptions, a rank, or nothing (rank 0)."""
    return 0 if opts is None else opts if isinstance(opts, int) else opts.rootRank


def carried(tensor: torch.Tensor, op: ReduceOp) -> tuple[torch.Tensor, ReduceOp]:
    """What a reduction carries, and with which op: bfloat16 and float16 as float32 (cast back
    after, as torch does), booleans' SUM and PRODUCT as OR and AND (as gloo reduces them)."""
    wide = tensor.float() if tensor.dtype in UPCAST else tensor
    return wide, (LOGICAL.get(op, op) if tensor.dtype == torch.bool else op)


@functools.cache
def reduced_as(what: str, dtype: torch.dtype) -> BatchTag:
    """The tag a reduction's call carries: the tensor's own dtype, which the float32 it
    travels in hides (a float16 tensor summed with a float32 one, or a bfloat16 one, quietly)."""
    return BatchTag(f"the process group's {what} of {dtype}", differs=(
        f"ranks passed the process group's {what} tensors of different dtypes ({{by_rank}}); "
        "every rank must pass the same dtype"))


def sized(tensor: torch.Tensor, other: torch.Tensor, numel: int, argument: str) -> None:
    if tensor.numel() != numel or tensor.dtype != other.dtype:
        raise ValueError(f"{argument} is {tensor.dtype}{list(tensor.shape)}; it must hold "
                         f"{numel} elements of {other.dtype} (the ranks' blocks, in order)")


def write_bits(tensor: torch.Tensor, bits: np.ndarray) -> None:
    """``tensor`` filled with ``bits`` (its elements, as ``host_view`` reads them)."""
    bits = np.ascontiguousarray(bits)
    bfloat16 = BFLOAT16 is not None and bits.dtype == BFLOAT16  # (dtype == None: float64's)
    source = torch.from_numpy(bits.view(np.int16) if bfloat16 else bits)
    tensor.detach().copy_(source.view(tensor.dtype).reshape(tensor.shape))
