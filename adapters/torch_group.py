"""A ``torch.distributed`` process group over a `collectives` `Communicator`
(``process_group(comm)``), for ``DistributedDataParallel(model, process_group=...)``: what DDP
sends besides its gradients (construction: an all-gather and a broadcast; each forward: the
buffers' broadcast; ``find_unused_parameters``: an all-reduce), as blocking calls of the
communicator. No ``init_process_group``, gloo, store or address is needed, and it works on
thread ranks. Built on PyTorch's support for process groups written in Python, through a
private helper of ``torch.distributed`` (``_create_work_from_future``).
"""

import threading
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from collectives.ops import ReduceOp

__all__ = ["UPCAST", "process_group"]

# reduced in float32 and copied back: bfloat16, which NumPy cannot view, and float16, whose
# sum may pass its range where the mean does not (DDP's own hook divides first)
UPCAST = (torch.bfloat16, torch.float16)

_OPS = {dist.ReduceOp.SUM: ReduceOp.SUM, dist.ReduceOp.AVG: ReduceOp.MEAN,
        dist.ReduceOp.MAX: ReduceOp.MAX, dist.ReduceOp.MIN: ReduceOp.MIN,
        dist.ReduceOp.PRODUCT: ReduceOp.PROD}


_LOGICAL = {ReduceOp.SUM: ReduceOp.MAX, ReduceOp.PROD: ReduceOp.MIN}


def _finished_work(value: Any) -> Any:
    """A finished ``torch.distributed`` Work holding ``value``, through PyTorch's helper for
    process groups written in Python (private; torch's own tests of such groups use it)."""
    make = getattr(torch._C._distributed_c10d, "_create_work_from_future", None)
    if make is None:
        raise RuntimeError(f"torch {torch.__version__} has no _create_work_from_future: the "
                           f"collectives process group needs it; use a gloo group instead")
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(value)
    return make(future)


def _host(tensor: torch.Tensor, argument: str, *, moved: bool = False) -> np.ndarray:
    """A NumPy view of a CPU tensor; ``moved``: its bits only (bfloat16 as int16, which is
    right for copies such as broadcast, wrong for arithmetic)."""
    if tensor.device.type != "cpu":
        raise TypeError(f"{argument}: the collectives process group carries CPU tensors, not "
                        f"tensors on {tensor.device}; use a gloo or NCCL group for the model")
    tensor = tensor.detach()  # (as gloo's: a collective works on the data, outside autograd;
    if tensor.dtype in UPCAST and moved:  # DLPack refused a tensor that requires grad)
        tensor = tensor.view(torch.int16)
    return np.from_dlpack(tensor)


def _check_gather_outputs(into: list, tensor: torch.Tensor, size: int, i: int) -> None:
    """An all-gather's output list: one tensor per rank, each of the input's shape and dtype
    (NumPy's broadcasting would otherwise fill a wider one, and a short list lose ranks)."""
    if len(into) != size:
        raise ValueError(f"allgather output list {i} holds {len(into)} tensors; pass {size}, "
                         "one per rank")
    for rank, out in enumerate(into):
        if out.shape != tensor.shape or out.dtype != tensor.dtype:
            raise ValueError(f"allgather output {i}[{rank}] is {out.dtype}{list(out.shape)}; "
                             f"pass tensors like the input, {tensor.dtype}{list(tensor.shape)}")


# (typed as Any: the C++ base's stubs overload its methods for callers, not for subclasses)
_ProcessGroupBase: Any = dist.ProcessGroup


def _tensors(tensors: Any) -> list:
    """The tensor list of a call, as PyTorch's groups take it: a list, or one tensor."""
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _reduce_op(opts: Any) -> ReduceOp:
    """The op of an allreduce's options, given as PyTorch's groups take them: AllreduceOptions,
    a ReduceOp, or nothing (SUM)."""
    if opts is None:
        return ReduceOp.SUM
    given = getattr(opts, "reduceOp", opts)
    given = getattr(given, "op", given)  # (ReduceOp wraps a RedOpType)
    op = _OPS.get(given)
    if op is None:
        raise ValueError(f"reduce op {given} has no collectives equivalent; use one of "
                         f"{', '.join(str(o) for o in _OPS)}")
    return op


def _root(opts: Any) -> int:
    """The root of a broadcast's options: BroadcastOptions, a rank, or nothing (rank 0)."""
    return 0 if opts is None else opts if isinstance(opts, int) else opts.rootRank


class _CollectivesGroup(_ProcessGroupBase):
    """The calls DDP makes on its process group outside the hook (construction: allgather and
    broadcast; each forward: buffer broadcasts; ``find_unused_parameters``: an all-reduce),
    run as blocking calls of the communicator. Guarded by a lock: DDP may call it from an
    autograd thread while the user's thread does.

    Each call takes the forms PyTorch's own groups take (options, a ReduceOp or a root rank
    instead of options, or none; one tensor or a list), and is left out of ``torch.compile``'s
    graphs: DDP's reducer calls it from a compiled model's forward (its bucket rebuild), and
    a communicator's call cannot be traced."""

    def __init__(self, comm: Any):
        super().__init__(comm.rank, comm.size)
        self.comm, self.lock = comm, threading.Lock()

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "collectives"

    @torch.compiler.disable
    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        tensors, op = _tensors(tensors), _reduce_op(opts)
        with self.lock:
            for i, tensor in enumerate(tensors):
                if op is ReduceOp.MEAN and not (tensor.is_floating_point() or tensor.is_complex()):
                    # (gloo refuses too: the mean cannot go back into the tensor; refused
                    # through the call the peers make, so that they hear of it at once)
                    self.comm.calls.refuse("allreduce", TypeError(
                        f"allreduce tensor {i} is {tensor.dtype}: ReduceOp.AVG of integer or "
                        "bool tensors has no result of their dtype; reduce a floating-point "
                        "copy, or SUM and divide"))
                wide = tensor.float() if tensor.dtype in UPCAST else tensor
                # (booleans as gloo reduces them: SUM is OR, PRODUCT is AND)
                logical = _LOGICAL.get(op, op) if tensor.dtype == torch.bool else op
                result = self.comm.all_reduce(_host(wide, f"allreduce tensor {i}"), logical)
                # (bfloat16 and float16 went as float32: cast back, as torch does)
                tensor.detach().copy_(torch.from_numpy(np.asarray(result)))
        return _finished_work(tensors)

    @torch.compiler.disable
    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        tensors, root = _tensors(tensors), _root(opts)
        with self.lock:
            for i, tensor in enumerate(tensors):
                view = _host(tensor, f"broadcast tensor {i}", moved=True)
                view[...] = self.comm.broadcast(view, root=root)
        return _finished_work(tensors)

    @torch.compiler.disable
    def allgather(self, outputs: list, inputs: Any, opts: Any = None) -> Any:
        with self.lock:
            for i, (into, tensor) in enumerate(zip(outputs, _tensors(inputs), strict=True)):
                gathered = self.comm.all_gather(_host(tensor, f"allgather tensor {i}", moved=True)[None])
                # (checked after the call, as the library checks out=: a bad list on one rank
                # must not leave its peers waiting for it)
                _check_gather_outputs(into, tensor, self.comm.size, i)
                for rank, out in enumerate(into):
                    _host(out, f"allgather output {i}", moved=True)[...] = gathered[rank]
        return _finished_work(outputs)

    @torch.compiler.disable
    def barrier(self, opts: Any = None) -> Any:
        with self.lock:
            self.comm.barrier()
        return _finished_work(None)


def process_group(comm: Any) -> dist.ProcessGroup:
    """A ``torch.distributed`` process group over ``comm``'s ranks, for
    ``DistributedDataParallel(model, process_group=process_group(comm))``: no
    ``init_process_group``, gloo, store or address needed, and it works on thread ranks.

    It carries CPU tensors with blocking calls (allreduce, broadcast, allgather, barrier):
    what DDP needs besides its gradients, which `allreduce_hook` carries. Built on PyTorch's
    Python process-group support (a private helper of ``torch.distributed``)."""
    if not callable(getattr(comm, "broadcast", None)) or not hasattr(comm, "rank"):
        raise TypeError(f"comm must be a collectives Communicator, not {type(comm).__name__}")
    return _CollectivesGroup(comm)
