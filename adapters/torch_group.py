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
    _usable(tensor, argument)
    tensor = tensor.detach()  # (as gloo's: a collective works on the data, outside autograd;
    if tensor.dtype in UPCAST and moved:  # DLPack refused a tensor that requires grad)
        tensor = tensor.view(torch.int16)
    return np.from_dlpack(tensor)


def _usable(tensor: torch.Tensor, argument: str) -> None:
    """What the group's NumPy views cannot carry: a tensor off the CPU, or a lazily negated
    or conjugated view (``x.conj().imag``), whose memory holds other values than it shows."""
    if tensor.device.type != "cpu":
        raise TypeError(f"{argument}: the collectives process group carries CPU tensors, not "
                        f"tensors on {tensor.device}; use a gloo or NCCL group for the model")
    if tensor.is_neg() or tensor.is_conj():
        raise TypeError(f"{argument} is a lazily negated or conjugated view (its memory holds "
                        "other values than it shows); pass tensor.resolve_neg().resolve_conj()")


def _one(tensors: Any, what: str) -> torch.Tensor:
    """The one tensor of a call: PyTorch's list of several is its multi-device form."""
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    if len(tensors) != 1:
        raise ValueError(f"{what} got {len(tensors)} tensors; the collectives process group "
                         "takes one per call (a list of several is PyTorch's multi-device "
                         "form): call it once per tensor")
    _usable(tensors[0], f"{what} tensor")
    return tensors[0]


def _averaged(op: ReduceOp, tensor: torch.Tensor, what: str) -> None:
    if op is ReduceOp.MEAN and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"{what} tensor is {tensor.dtype}: ReduceOp.AVG of integer or bool "
                        "tensors has no result of their dtype (gloo refuses it too); reduce a "
                        "floating-point copy, or SUM and divide")


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
        if out.requires_grad and out.is_leaf:  # (as gloo: autograd forbids writing into it)
            raise RuntimeError(f"allgather output {i}[{rank}] is a leaf tensor that requires "
                               "grad, which cannot be written in place; pass outputs made "
                               "without requires_grad (or under torch.no_grad())")


# (typed as Any: the C++ base's stubs overload its methods for callers, not for subclasses)
_ProcessGroupBase: Any = dist.ProcessGroup


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

    def _checked(self, what: str, check: Any) -> Any:
        """``check()``'s value; a bad argument it raises is refused through the call the
        peers make at this point, before any data moves, so that they hear of it at once."""
        try:
            return check()
        except (TypeError, ValueError, NotImplementedError) as error:
            self.comm.calls.refuse(what, error)

    @torch.compiler.disable
    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        def check():
            op, tensor = _reduce_op(opts), _one(tensors, "allreduce")
            _averaged(op, tensor, "allreduce")
            return op, tensor

        with self.lock:
            op, tensor = self._checked("allreduce", check)
            wide, logical = _carried(tensor, op)
            result = self.comm.all_reduce(_host(wide, "allreduce tensor"), logical)
            # (bfloat16 and float16 went as float32: cast back, as torch does)
            tensor.detach().copy_(torch.from_numpy(np.asarray(result)))
        return _finished_work([tensor])

    @torch.compiler.disable
    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        def check():
            if getattr(opts, "rootTensor", 0):
                raise ValueError(f"broadcast options name rootTensor={opts.rootTensor}; the "
                                 "collectives process group takes one tensor per call")
            return _one(tensors, "broadcast"), _root(opts)

        with self.lock:
            tensor, root = self._checked("broadcast", check)
            view = _host(tensor, "broadcast tensor", moved=True)
            view[...] = self.comm.broadcast(view, root=root)
        return _finished_work([tensor])

    @torch.compiler.disable
    def allgather(self, outputs: list, inputs: Any, opts: Any = None) -> Any:
        def check():
            if len(outputs) != 1:
                raise ValueError(f"allgather got {len(outputs)} output lists; the collectives "
                                 "process group takes one input and one list per call")
            return _one(inputs, "allgather")

        with self.lock:
            tensor = self._checked("allgather", check)
            gathered = self.comm.all_gather(_host(tensor, "allgather tensor", moved=True)[None])
            # (checked after the call, as the library checks out=: a bad list on one rank
            # must not leave its peers waiting for it)
            _check_gather_outputs(outputs[0], tensor, self.comm.size, 0)
            for rank, out in enumerate(outputs[0]):
                _host(out, "allgather output", moved=True)[...] = gathered[rank]
        return _finished_work(outputs)

    @torch.compiler.disable
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          opts: Any = None) -> Any:
        """``dist.all_gather_into_tensor``: every rank's input, in rank order, in ``output``."""
        def check():
            _usable(output, "all_gather output")
            tensor = _one(input, "all_gather")
            _sized(output, tensor, self.comm.size * tensor.numel(), "all_gather output")
            return tensor

        with self.lock:
            tensor = self._checked("all_gather_single", check)
            gathered = self.comm.all_gather(_host(tensor, "all_gather tensor", moved=True).reshape(-1))
            _write(output, gathered)
        return _finished_work([output])

    @torch.compiler.disable
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                              opts: Any = None) -> Any:
        """``dist.reduce_scatter_tensor``: block ``rank`` of the reduction of every rank's
        input (cut into as many equal blocks as ranks) in ``output``."""
        def check():
            op, tensor = _reduce_op(opts), _one(input, "reduce_scatter")
            _usable(output, "reduce_scatter output")
            _sized(tensor, output, self.comm.size * output.numel(), "reduce_scatter input")
            _averaged(op, tensor, "reduce_scatter")
            return op, tensor

        with self.lock:
            op, tensor = self._checked("reduce_scatter_single", check)
            wide, logical = _carried(tensor, op)
            rows = _host(wide, "reduce_scatter tensor").reshape(self.comm.size, -1)
            block = self.comm.reduce_scatter(rows, logical)
            output.detach().copy_(torch.from_numpy(np.asarray(block)).reshape(output.shape))
        return _finished_work([output])

    @torch.compiler.disable
    def barrier(self, opts: Any = None) -> Any:
        with self.lock:
            self.comm.barrier()
        return _finished_work(None)


def _carried(tensor: torch.Tensor, op: ReduceOp) -> tuple[torch.Tensor, ReduceOp]:
    """What a reduction carries, and with which op: bfloat16 and float16 as float32 (cast back
    after, as torch does), booleans' SUM and PRODUCT as OR and AND (as gloo reduces them)."""
    wide = tensor.float() if tensor.dtype in UPCAST else tensor
    return wide, (_LOGICAL.get(op, op) if tensor.dtype == torch.bool else op)


def _sized(tensor: torch.Tensor, other: torch.Tensor, numel: int, argument: str) -> None:
    if tensor.numel() != numel or tensor.dtype != other.dtype:
        raise ValueError(f"{argument} is {tensor.dtype}{list(tensor.shape)}; it must hold "
                         f"{numel} elements of {other.dtype} (the ranks' blocks, in order)")


def _write(tensor: torch.Tensor, bits: np.ndarray) -> None:
    """``tensor`` filled with ``bits`` (its elements, as ``_host(moved=True)`` reads them)."""
    source = torch.from_numpy(np.ascontiguousarray(bits)).view(tensor.dtype)
    tensor.detach().copy_(source.reshape(tensor.shape))


# what the group does not run, and the communicator's call that does it
_INSTEAD = {
    "reduce": "reduce", "gather": "gather", "scatter": "scatter", "send": "send",
    "recv": "recv", "recv_anysource": "recv", "alltoall": "all_to_all",
    "alltoall_base": "all_to_all", "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "_allgather_base": "all_gather",
    "allgather_coalesced": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "allreduce_coalesced": "batch_all_reduce", "reduce_scatter_tensor_coalesced":
    "reduce_scatter", "all_gather_single_coalesced": "all_gather",
    "reduce_scatter_single_coalesced": "reduce_scatter", "monitored_barrier": "barrier",
}


def _not_run(name: str, instead: str) -> Any:
    def method(self: _CollectivesGroup, *args: Any, **kwargs: Any) -> Any:
        self._checked(name, lambda: _refused(name, instead))

    method.__name__ = name
    return torch.compiler.disable(method)


def _refused(name: str, instead: str) -> None:
    raise NotImplementedError(
        f"the collectives process group does not run {name} (it runs allreduce, broadcast, "
        f"allgather, all_gather_into_tensor, reduce_scatter_tensor and barrier); call the "
        f"communicator's {instead}() on the tensors, or use a gloo group for it")


for _name, _instead in _INSTEAD.items():
    setattr(_CollectivesGroup, _name, _not_run(_name, _instead))


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
