"""A ``torch.distributed`` process group over a `collectives` `Communicator`
(``process_group(comm)``), for ``DistributedDataParallel(model, process_group=...)``: what DDP
sends besides its gradients (construction: an all-gather and a broadcast; each forward: the
buffers' broadcast; ``find_unused_parameters``: an all-reduce), as blocking calls of the
communicator. No ``init_process_group``, gloo, store or address is needed, and it works on
thread ranks. Built on PyTorch's support for process groups written in Python.
"""

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .torch_group_args import (
    UPCAST,
    averaged,
    carried,
    check_gather_outputs,
    host_view,
    one_tensor,
    reduce_op,
    reduced_as,
    root_of,
    sized,
    unaliased,
    writable,
    write_bits,
)

__all__ = ["UPCAST", "process_group"]


class _Finished(dist.Work):
    """The Work of a call the group ran to its end before returning (its calls block): done,
    holding ``value``. Its ``wait`` takes a ``timeout`` as gloo's does (the Work PyTorch's
    private helper makes from a future raised "not implemented" for one)."""

    def __init__(self, value: Any):
        super().__init__()
        self.value = value
        self.future: torch.futures.Future = torch.futures.Future()
        self.future.set_result(value)

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self.future

    def result(self) -> Any:
        return self.value


class _Failed(dist.Work):
    """The Work of a call that failed: its ``wait()`` raises the error, as its future does."""

    def __init__(self, error: Exception):
        super().__init__()
        self.error = error
        self.future: torch.futures.Future = torch.futures.Future()
        self.future.set_exception(error)

    def wait(self, timeout: Any = None) -> bool:
        raise self.error

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return False

    def exception(self) -> Exception:
        return self.error

    def get_future(self) -> torch.futures.Future:
        return self.future


def _group_call(method: Callable) -> Callable:
    """A call of the group: left out of ``torch.compile``'s graphs, and failing through its
    Work (``wait()`` raises), never by raising itself, as gloo's calls fail. DDP makes some
    of its calls (``find_unused_parameters``' all-reduce) from inside its reducer's backward:
    an error raised there left the reducer broken for good, and the next step failed with
    PyTorch's internal assert instead of the communicator's error. ``dist.all_reduce(t)``
    without ``async_op`` waits, and so raises as before."""
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 - raised at the Work's wait()
            return _Failed(error)
    return torch.compiler.disable(call)


# (typed as Any: the C++ base's stubs overload its methods for callers, not for subclasses)
_ProcessGroupBase: Any = dist.ProcessGroup


class _CollectivesGroup(_ProcessGroupBase):
    """The calls DDP makes on its process group outside the hook (construction: allgather and
    broadcast; each forward: buffer broadcasts; ``find_unused_parameters``: an all-reduce),
    run as blocking calls of the communicator. Guarded by a lock: DDP may call it from an
    autograd thread while the user's thread does.

    Each call takes the forms PyTorch's own groups take (options, a ReduceOp or a root rank
    instead of options, or none; one tensor or a list), fails through its Work, and is left
    out of ``torch.compile``'s graphs: DDP's reducer calls it from a compiled model's forward
    (its bucket rebuild), and a communicator's call cannot be traced (``_group_call``)."""

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
        except (TypeError, ValueError, RuntimeError, NotImplementedError, BufferError) as error:
            self.comm.calls.refuse(what, error)

    @_group_call
    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        def check():
            op, tensor = reduce_op(opts), one_tensor(tensors, "allreduce")
            averaged(op, tensor, "allreduce")
            unaliased(tensor, "allreduce tensor")
            wide, logical = carried(tensor, op)
            return tensor, host_view(wide, "allreduce tensor"), logical

        with self.lock:
            tensor, view, logical = self._checked("allreduce", check)
            with self.comm.calls.part_of(reduced_as("allreduce", tensor.dtype)):
                result = self.comm.all_reduce(view, logical)
            # (bfloat16 and float16 went as float32: cast back, as torch does)
            tensor.detach().copy_(torch.from_numpy(np.asarray(result)))
        return _Finished([tensor])

    @_group_call
    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        def check():
            if getattr(opts, "rootTensor", 0):
                raise ValueError(f"broadcast options name rootTensor={opts.rootTensor}; the "
                                 "collectives process group takes one tensor per call")
            tensor = one_tensor(tensors, "broadcast")
            unaliased(tensor, "broadcast tensor")
            return tensor, host_view(tensor, "broadcast tensor"), root_of(opts)

        with self.lock:
            tensor, view, root = self._checked("broadcast", check)
            view[...] = self.comm.broadcast(view, root=root)
        return _Finished([tensor])

    @_group_call
    def allgather(self, outputs: list, inputs: Any, opts: Any = None) -> Any:
        def check():
            if len(outputs) != 1:
                raise ValueError(f"allgather got {len(outputs)} output lists; the collectives "
                                 "process group takes one input and one list per call")
            tensor = one_tensor(inputs, "allgather")
            return tensor, host_view(tensor, "allgather tensor")

        with self.lock:
            tensor, view = self._checked("allgather", check)
            gathered = self.comm.all_gather(view[None])
            # (checked after the call, as the library checks out=: a bad list on one rank
            # must not leave its peers waiting for it)
            check_gather_outputs(outputs[0], tensor, self.comm.size)
            for rank, out in enumerate(outputs[0]):
                host_view(out, "allgather output")[...] = gathered[rank]
        return _Finished(outputs[0])  # (the future holds the list, as gloo's does)

    @_group_call
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          opts: Any = None) -> Any:
        """``dist.all_gather_into_tensor``: every rank's input, in rank order, in ``output``."""
        def check():
            writable(output, "all_gather output")
            tensor = one_tensor(input, "all_gather")
            sized(output, tensor, self.comm.size * tensor.numel(), "all_gather output")
            return host_view(tensor, "all_gather tensor")

        with self.lock:
            view = self._checked("all_gather_single", check)
            gathered = self.comm.all_gather(view.reshape(-1))
            write_bits(output, gathered)
        # (its future holds every rank's block, shaped as the input, as gloo's does)
        return _Finished(list(output.detach().reshape(self.comm.size, *input.shape).unbind(0)))

    @_group_call
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                              opts: Any = None) -> Any:
        """``dist.reduce_scatter_tensor``: block ``rank`` of the reduction of every rank's
        input (cut into as many equal blocks as ranks) in ``output``."""
        def check():
            op, tensor = reduce_op(opts), one_tensor(input, "reduce_scatter")
            writable(output, "reduce_scatter output")
            sized(tensor, output, self.comm.size * output.numel(), "reduce_scatter input")
            averaged(op, tensor, "reduce_scatter")
            wide, logical = carried(tensor, op)
            return tensor, host_view(wide, "reduce_scatter tensor"), logical

        with self.lock:
            tensor, view, logical = self._checked("reduce_scatter_single", check)
            rows = view.reshape(self.comm.size, -1)
            with self.comm.calls.part_of(reduced_as("reduce_scatter", tensor.dtype)):
                block = self.comm.reduce_scatter(rows, logical)
            output.detach().copy_(torch.from_numpy(np.asarray(block)).reshape(output.shape))
        return _Finished([output])

    @_group_call
    def barrier(self, opts: Any = None) -> Any:
        with self.lock:
            self.comm.barrier()
        return _Finished([])  # (as gloo's)


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
        if name in _POINT_TO_POINT:  # (two ranks' business: refused here alone, at once,
            _refused(name, instead)   # not through a call every rank makes)
        self._checked(name, lambda: _refused(name, instead))

    method.__name__ = name
    return torch.compiler.disable(method)


_POINT_TO_POINT = frozenset({"send", "recv", "recv_anysource"})


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
    Python process-group support."""
    if not callable(getattr(comm, "broadcast", None)) or not hasattr(comm, "rank"):
        raise TypeError(f"comm must be a collectives Communicator, not {type(comm).__name__}")
    return _CollectivesGroup(comm)
