"""PyTorch DistributedDataParallel over the library: a communication hook, and a process group.

DDP hands its gradients to a *communication hook* one bucket at a time, during the backward
pass, as soon as a bucket's last gradient is ready; the hook returns a ``torch.futures.Future``
that DDP waits on at the end of the backward pass. `allreduce_hook` all-reduces each bucket
through a `collectives` `Communicator` (thread ranks from ``collectives.run``, MPI ranks from
``collectives.init()``) without waiting: the call runs while backward goes on, and the future
is completed from the call's done callback (``Work.add_done_callback``), on the thread that
finishes it::

    state = CommHookState(comm, mean=True, compression=None)
    ddp.register_comm_hook(state, allreduce_hook)

DDP with a hook does not divide by the world size itself; ``mean=True`` makes the hook give
DDP's mean, in DDP's own order (each rank's bucket divided by the number of ranks, then the
sum), ``mean=False`` the sum.
``compression="fp16"``/``"bf16"`` carries float32/float64 buckets in that narrower float, as
DDP's ``fp16_compress_hook`` (for a mean each contribution is divided before it is narrowed).

A failure (a peer that does not arrive within ``timeout``, ranks that disagree, a broken
communicator) reaches DDP as the future's exception on every rank, never as an exception the
hook raises (one raised by a hook leaves the DDP object unusable). PyTorch turns it into a
``RuntimeError`` carrying the message; the original exception stays on ``state.last_error``.

DDP still needs a ``torch.distributed`` process group to be built (it checks the parameters'
shapes, broadcasts rank 0's parameters and, each forward, its buffers). `process_group(comm)`
gives one over the same communicator, so no gloo group, store or address is needed; a gloo
group works as well.

CUDA buckets (the NCCL transport) are all-reduced by a blocking call, which that transport
only enqueues on the caller's current stream; the future is a CUDA-aware one completed on it.
"""

import threading
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from collectives.compression import requested, wire_dtype
from collectives.ops import ReduceOp

__all__ = ["CommHookState", "allreduce_hook", "process_group", "register"]

_COMPRESSIBLE = (torch.float32, torch.float64)  # what wire compression narrows
# reduced in float32 and copied back: bfloat16, which NumPy cannot view, and float16, whose
# sum may pass its range where the mean does not (DDP's own hook divides first)
_UPCAST = (torch.bfloat16, torch.float16)


class CommHookState:
    """What `allreduce_hook` needs: the communicator and how to reduce.

    Parameters
    ----------
    comm
        The `Communicator` every rank of the DDP job holds (its rank and size are DDP's).
    mean
        True: each gradient becomes the mean over the ranks (what DDP gives without a hook);
        False: the sum.
    compression
        ``"fp16"`` or ``"bf16"``: float32/float64 buckets travel in that float (others as
        they are); None: as they are.
    algorithm
        The all-reduce algorithm (``"auto"``, ``"ring"``, ...; see `Communicator.all_reduce`).
    timeout
        Seconds a bucket's all-reduce may wait for its peers (None: the communicator's).

    Attributes
    ----------
    buckets
        How many buckets the hook has started.
    last_error
        The first exception of the latest step that failed (DDP raises its message, as a
        ``RuntimeError``; this is the exception itself), or None.
    """

    def __init__(self, comm: Any, *, mean: bool = True, compression: str | None = None,
                 algorithm: Any = "auto", timeout: float | None = None):
        if not callable(getattr(comm, "all_reduce", None)) or not hasattr(comm, "size"):
            raise TypeError(f"comm must be a collectives Communicator (collectives.init(), or the "
                            f"one collectives.run passes), not {type(comm).__name__}")
        if not isinstance(mean, bool):
            raise TypeError(f"mean must be True (DDP's mean) or False (the sum), not {mean!r}")
        # (the mean as DDP's own hook takes it: each rank's bucket divided by the number of
        # ranks, then the sum; never past the dtype's range where DDP's is not)
        self.op = ReduceOp.SUM
        wire_dtype(compression, ReduceOp.MEAN if mean else ReduceOp.SUM, np.float32,
                   "compression")  # a bad one raises here
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"timeout must be a positive number of seconds or None, not {timeout!r}")
        self.comm, self.mean, self.algorithm, self.timeout = comm, mean, algorithm, timeout
        self.compression = compression if requested(compression) else None
        self.buckets = 0
        self.pending: list = []  # this step's calls in flight (see _drain)
        self.last_error: BaseException | None = None
        self.step_failed = False  # whether a bucket of this step has failed yet

    def __repr__(self) -> str:
        return (f"CommHookState(rank {self.comm.rank} of {self.comm.size}, mean={self.mean}, "
                f"compression={self.compression!r}, buckets={self.buckets})")


def allreduce_hook(state: CommHookState,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's communication hook: all-reduce ``bucket`` through ``state.comm``, asynchronously.

    Register it with ``ddp.register_comm_hook(state, allreduce_hook)`` (see `register`).

    Returns
    -------
    torch.futures.Future
        Completed with the reduced bucket (the bucket's own buffer, reduced in place) once the
        all-reduce has finished, or with its exception where it failed.
    """
    buffer = bucket.buffer()
    state.buckets += 1
    if bucket.index() == 0:  # buckets start in index order: a new step
        state.step_failed = False
    if state.mean:  # (DDP's order: this rank's share first, in the bucket's dtype)
        buffer.div_(state.comm.size)
    if buffer.device.type != "cpu":
        return _on_device(state, buffer)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    try:
        # the bucket's own memory, reduced in place (bfloat16, float16: a float32 copy)
        wire = buffer.float() if buffer.dtype in _UPCAST else buffer
        view = np.from_dlpack(wire)
        compression = state.compression if buffer.dtype in _COMPRESSIBLE else None
        handle = state.comm.all_reduce(view, state.op, state.algorithm, out=view,
                                       timeout=state.timeout, compression=compression,
                                       async_op=True)
    except Exception as exc:  # noqa: BLE001 - DDP must get it through the future
        _fail(state, future, exc)
        if bucket.is_last():
            _drain(state)  # (the earlier buckets' calls still need their wait)
        return future

    def finished(done: Any) -> None:
        # on the thread that finishes the call: no communicator calls here
        try:
            done.wait()
            if wire is not buffer:
                buffer.copy_(wire)
        except Exception as exc:  # noqa: BLE001 - the future carries it to DDP
            _fail(state, future, exc)
            return
        future.set_result(buffer)

    handle.add_done_callback(finished)
    state.pending.append(handle)
    if bucket.is_last():
        _drain(state)
    return future


def _drain(state: CommHookState) -> None:
    """Wait for the step's all-reduces, in the last bucket's hook (buckets start in order, so
    backward has no work left; DDP waits on them right after). A wait is what applies a
    call's timeout and finds ranks that disagree: without one, a call whose peer never comes
    would never finish, and DDP would wait on its future forever."""
    pending, state.pending = state.pending, []
    for handle in pending:
        try:
            handle.wait()
        except Exception:  # noqa: BLE001, S110 - its callback has handed it to the future
            pass


def _fail(state: CommHookState, future: torch.futures.Future, exc: BaseException) -> None:
    if not state.step_failed:  # the first is the cause; the later buckets' follow from it
        state.last_error, state.step_failed = exc, True
    # PyTorch keeps the message, not the type: name the type in it
    future.set_exception(RuntimeError(f"{type(exc).__name__}: {exc}"))


def _on_device(state: CommHookState, buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A CUDA bucket: a blocking all-reduce (the NCCL transport enqueues it on the current
    stream and returns), and a future completed on that stream, so DDP's consumers wait on
    the device, not the host."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[buffer.device])
    try:
        compression = state.compression if buffer.dtype in _COMPRESSIBLE else None
        state.comm.all_reduce(buffer, state.op, state.algorithm, out=buffer,
                              timeout=state.timeout, compression=compression)
    except Exception as exc:  # noqa: BLE001 - DDP must get it through the future
        _fail(state, future, exc)
        return future
    future.set_result(buffer)
    return future


def register(ddp: torch.nn.parallel.DistributedDataParallel, comm: Any, *, mean: bool = True,
             compression: str | None = None, algorithm: Any = "auto",
             timeout: float | None = None) -> CommHookState:
    """Register `allreduce_hook` on ``ddp`` (before its first backward) and return its state;
    the arguments are `CommHookState`'s."""
    if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"ddp must be a torch.nn.parallel.DistributedDataParallel, not "
                        f"{type(ddp).__name__}; wrap the model first")
    state = CommHookState(comm, mean=mean, compression=compression, algorithm=algorithm,
                          timeout=timeout)
    ddp.register_comm_hook(state, allreduce_hook)
    return state


# --- a process group over the communicator ---------------------------------------------------

_OPS = {dist.ReduceOp.SUM: ReduceOp.SUM, dist.ReduceOp.AVG: ReduceOp.MEAN,
        dist.ReduceOp.MAX: ReduceOp.MAX, dist.ReduceOp.MIN: ReduceOp.MIN,
        dist.ReduceOp.PRODUCT: ReduceOp.PROD}


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
    if tensor.dtype in _UPCAST and moved:
        tensor = tensor.view(torch.int16)
    return np.from_dlpack(tensor)


# (typed as Any: the C++ base's stubs overload its methods for callers, not for subclasses)
_ProcessGroupBase: Any = dist.ProcessGroup


class _CollectivesGroup(_ProcessGroupBase):
    """The calls DDP makes on its process group outside the hook (construction: allgather and
    broadcast; each forward: buffer broadcasts; ``find_unused_parameters``: an all-reduce),
    run as blocking calls of the communicator. Guarded by a lock: DDP may call it from an
    autograd thread while the user's thread does."""

    def __init__(self, comm: Any):
        super().__init__(comm.rank, comm.size)
        self.comm, self.lock = comm, threading.Lock()

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "collectives"

    def allreduce(self, tensors: list, opts: Any) -> Any:
        op = _OPS.get(opts.reduceOp.op)
        if op is None:
            raise ValueError(f"reduce op {opts.reduceOp.op} has no collectives equivalent; use "
                             f"one of {', '.join(str(o) for o in _OPS)}")
        with self.lock:
            for i, tensor in enumerate(tensors):
                wide = tensor.float() if tensor.dtype in _UPCAST else tensor
                result = self.comm.all_reduce(_host(wide, f"allreduce tensor {i}"), op)
                # (integer MEAN gives float64, bfloat16 went as float32: cast back, as torch does)
                tensor.copy_(torch.from_numpy(np.asarray(result)))
        return _finished_work(tensors)

    def broadcast(self, tensors: list, opts: Any) -> Any:
        with self.lock:
            for i, tensor in enumerate(tensors):
                view = _host(tensor, f"broadcast tensor {i}", moved=True)
                view[...] = self.comm.broadcast(view, root=opts.rootRank)
        return _finished_work(tensors)

    def allgather(self, outputs: list, inputs: list, opts: Any) -> Any:
        with self.lock:
            for i, (into, tensor) in enumerate(zip(outputs, inputs, strict=True)):
                gathered = self.comm.all_gather(_host(tensor, f"allgather tensor {i}", moved=True)[None])
                for rank, out in enumerate(into):
                    _host(out, f"allgather output {i}", moved=True)[...] = gathered[rank]
        return _finished_work(outputs)

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
