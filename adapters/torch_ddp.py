"""PyTorch DistributedDataParallel over the library: a communication hook, and a process group.

DDP hands its gradients to a *communication hook* one bucket at a time, during the backward
pass, as soon as a bucket's last gradient is ready; the hook returns a ``torch.futures.Future``
that DDP waits on at the end of the backward pass. `allreduce_hook` all-reduces each CPU
bucket through a `collectives` `Communicator` (thread ranks from ``collectives.run``, MPI ranks
from ``collectives.init()``) without waiting: the call runs while backward goes on, and the
future is completed from the call's done callback (``Work.add_done_callback``), on the thread
that finishes it (CUDA buckets: below)::

    state = CommHookState(comm, mean=True, compression=None)
    ddp.register_comm_hook(state, allreduce_hook)

DDP with a hook does not divide by the world size itself; ``mean=True`` makes the hook give
DDP's mean, in DDP's own order (each rank's bucket times 1/size, then the sum), ``mean=False``
the sum.
``compression="fp16"``/``"bf16"`` carries float32/float64 buckets in that narrower float, as
DDP's ``fp16_compress_hook`` (for a mean each contribution is scaled by 1/size before it is
narrowed).

A failure (a peer that does not arrive within ``timeout``, ranks that disagree, a broken
communicator) reaches DDP as the future's exception on every rank, never as an exception the
hook raises (one raised by a hook leaves the DDP object unusable). PyTorch turns it into a
``RuntimeError`` carrying the message; the original exception stays on ``state.last_error``.
(For CUDA buckets only what the call finds before it has enqueued its work; see below.)

DDP still needs a ``torch.distributed`` process group to be built (it checks the parameters'
shapes, broadcasts rank 0's parameters and, each forward, its buffers). `process_group(comm)`
gives one over the same communicator, for CPU tensors, so no gloo group, store or address is
needed; a gloo group works as well (an NCCL group for CUDA models).

CUDA buckets (the NCCL transport; not yet run on a GPU) are all-reduced by a blocking call,
which that transport enqueues on the communicator's own stream after making it wait for the
caller's current stream; the caller's stream then waits for the communicator's, so backward's
later kernels run after the bucket's all-reduce (no overlap on the GPU). The future is a
CUDA-aware one, completed once the call is enqueued. What goes wrong after that (a peer that
never comes, found by the watchdog at ``timeout``, or the communicator's own where it is
None; calls that differ; an error NCCL reports) breaks the communicator and comes as
``CommunicatorBrokenError`` at a later bucket's call, through that bucket's future.
"""

import functools
import os
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from collectives import Communicator
from collectives.compression import requested, wire_dtype
from collectives.ops import ReduceOp
from collectives.runtime.agreement import ISSUED_SEVERAL
from collectives.runtime.calls import BatchTag, resolve_algorithm
from collectives.runtime.refusals import refused_to_peers
from collectives.runtime.validate import check_timeout

from .torch_group import UPCAST as _UPCAST
from .torch_group import process_group

__all__ = ["CommHookState", "allreduce_hook", "process_group", "register"]

_COMPRESSIBLE = (torch.float32, torch.float64)  # what wire compression narrows


class CommHookState:
    """What `allreduce_hook` needs: the communicator and how to reduce.

    Parameters
    ----------
    comm
        The `Communicator` every rank of the DDP job holds (its rank and size are DDP's).
    mean
        True: each gradient becomes the mean over the ranks, as DDP gives it without a hook
        (each rank's share times 1/size, then the sum); False: the sum.
    compression
        ``"fp16"`` or ``"bf16"``: float32/float64 buckets travel in that float (others as
        they are); None: as they are.
    algorithm
        The all-reduce algorithm (``"auto"``, ``"ring"``, ...; see `Communicator.all_reduce`).
    timeout
        Seconds a bucket's all-reduce may wait for its peers (None: the communicator's). For
        a CUDA bucket it bounds the waits on the host (the first step's agreement) and, through
        the transport's watchdog, its work on the GPU.

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
        if not isinstance(comm, Communicator):
            raise TypeError(f"comm must be a collectives Communicator (collectives.init(), or the "
                            f"one collectives.run passes), not {type(comm).__name__}")
        if not isinstance(mean, bool):
            raise TypeError(f"mean must be True (DDP's mean) or False (the sum), not {mean!r}")
        # (the mean as DDP takes it: each rank's bucket times 1/size, then the sum; never
        # past the dtype's range where DDP's is not)
        self.op = ReduceOp.SUM
        wire_dtype(compression, ReduceOp.MEAN if mean else ReduceOp.SUM, np.float32,
                   "compression")  # a bad one raises here
        timeout = check_timeout(timeout)
        resolve_algorithm(algorithm, 1, 0, comm.calls.native_names)  # (not at the first step)
        self.comm: Any = comm  # (its calls take the hook's own arguments, checked here)
        self.mean, self.algorithm, self.timeout = mean, algorithm, timeout
        self.compression = compression if requested(compression) else None
        self.buckets = 0
        self.pending: list = []  # this step's calls in flight (see _drain)
        self.last_error: BaseException | None = None
        self.step_failed = False  # whether a bucket of this step has failed yet

    def __repr__(self) -> str:
        where = "no communicator" if self.comm is None else \
            f"rank {self.comm.rank} of {self.comm.size}"
        return (f"CommHookState({where}, mean={self.mean}, compression={self.compression!r}, "
                f"buckets={self.buckets})")

    def __getstate__(self) -> dict:
        """What a pickle keeps (``torch.save(ddp)``, ``copy.deepcopy(ddp)``: DDP keeps its
        hook's state): how to reduce, not the communicator (live connections to the peers,
        as PyTorch's PowerSGD state leaves out its process group) nor this step's calls.
        Restored, set ``state.comm`` before the next step."""
        kept = dict(self.__dict__)
        kept.update(comm=None, pending=[], last_error=None, step_failed=False)
        return kept

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


def allreduce_hook(state: CommHookState,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's communication hook: all-reduce ``bucket`` through ``state.comm``, asynchronously.

    Register it with ``ddp.register_comm_hook(state, allreduce_hook)`` (see `register`).

    Returns
    -------
    torch.futures.Future
        Completed with the reduced bucket (the bucket's own buffer, reduced in place) once the
        all-reduce has finished, or with its exception where it failed; a CUDA bucket's once
        the all-reduce is enqueued (a CUDA-aware future: its consumers wait on the device).
    """
    buffer = bucket.buffer()
    if state.comm is None:  # (restored from a pickle; raised here, it would break DDP)
        refused: torch.futures.Future = torch.futures.Future()
        refused.set_exception(RuntimeError(
            "the hook's CommHookState has no communicator (it was restored from a pickle, "
            "which leaves it out): set state.comm to this rank's Communicator first"))
        return refused
    state.buckets += 1
    if bucket.index() == 0:  # buckets start in index order: a new step
        state.step_failed = False
    if state.mean:  # (DDP's own: this rank's share first, times 1/size, in the bucket's
        buffer.mul_(1.0 / state.comm.size)  # dtype; a division differs in the last bit)
    if buffer.device.type != "cpu":
        return _on_device(state, buffer)
    future = torch.futures.Future()
    try:
        # the bucket's own memory, reduced in place (bfloat16, float16: a float32 copy)
        wire = buffer.float() if buffer.dtype in _UPCAST else buffer
        view = np.from_dlpack(wire)
        compression = state.compression if buffer.dtype in _COMPRESSIBLE else None
        with state.comm.calls.part_of(_tag(state.mean, buffer.dtype)):
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


# Every bucket's all-reduce carries the hook's ``mean`` and the bucket's dtype in its
# signature: the library agrees each all-reduce's own arguments, but the division before it
# is the hook's, and a rank dividing beside one that does not would give gradients that are
# neither the mean nor the sum; and a float16 or bfloat16 bucket travels as float32, which
# hides its dtype (a float16 model's gradients were averaged with a float32 one's, quietly).
# Ranks that differ fail the call on every rank, at its agreement (before data moves) or, for
# a signature agreed before (``mean`` changed on one rank later), by its check value.
# A step's buckets are all issued before any is waited on, in a number DDP decides
# (``ISSUED_SEVERAL``): where a peer's call at that point is another kind (its buckets cut
# otherwise: another ``bucket_cap_mb``), the mismatch breaks the communicator at once; this
# rank's later buckets waited out their timeout for calls no peer would make.
@functools.cache
def _tag(mean: bool, dtype: torch.dtype) -> BatchTag:
    return BatchTag(f"DDP's hook, mean={mean}, a {dtype} bucket", ISSUED_SEVERAL, differs=(
        "the ranks' DDP hooks disagree on mean or on the bucket's dtype ({by_rank}); pass the "
        "same mean to every rank's CommHookState (or register), and give every rank's model "
        "the same dtypes"))


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
    """A CUDA bucket: a blocking all-reduce (the NCCL transport enqueues it on the
    communicator's stream, after the caller's current stream, and returns with the caller's
    stream waiting for it), and a CUDA-aware future completed at once, so DDP's consumers
    wait on the device, not the host."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[buffer.device])
    try:
        compression = state.compression if buffer.dtype in _COMPRESSIBLE else None
        with state.comm.calls.part_of(_tag(state.mean, buffer.dtype)):
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
    the arguments are `CommHookState`'s. A bad one on one rank is refused through ``comm``:
    its peers, checking that ``comm`` holds DDP's ranks, raise ``PeerFailedError`` at once."""
    # (its peers wait in _check_same_ranks' gather; a comm that is none is refused below)
    with refused_to_peers(comm, "register") if isinstance(comm, Communicator) else nullcontext():
        if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            raise TypeError(f"ddp must be a torch.nn.parallel.DistributedDataParallel, not "
                            f"{type(ddp).__name__}; wrap the model first")
        state = CommHookState(comm, mean=mean, compression=compression, algorithm=algorithm,
                              timeout=timeout)
    _check_same_ranks(ddp, comm)
    ddp.register_comm_hook(state, allreduce_hook)
    return state


def _check_same_ranks(ddp: torch.nn.parallel.DistributedDataParallel, comm: Any) -> None:
    """Raise unless ``comm`` holds DDP's ranks in DDP's order: a hook over other ranks
    trains each group apart, silently. Every rank draws a random token and gathers every
    rank's over both, DDP's process group and ``comm`` (each completes among its own ranks,
    every one of which registers): the lists are equal only where both hold the same
    processes in the same order (rank and size alone pass a split of other ranks)."""
    group = ddp.process_group
    device = next(iter(ddp.module.parameters()), torch.empty(0)).device
    token = torch.tensor([int.from_bytes(os.urandom(7), "little")], dtype=torch.int64,
                         device=device)
    # (as objects: an NCCL communicator's arrays are CuPy's, and it refused a NumPy token)
    ours = [int(t) for t in comm.all_gather_object(int(token))]
    gathered = [torch.empty_like(token) for _ in range(group.size())]
    group.allgather([gathered], [token]).wait()
    if [int(t) for t in gathered] == ours:
        return
    where = (f"comm is rank {comm.rank} of {comm.size} where DDP's process group is rank "
             f"{group.rank()} of {group.size()}" if (group.size(), group.rank()) != (
                 comm.size, comm.rank) else
             f"comm (rank {comm.rank} of {comm.size}) holds other processes than DDP's "
             "process group, or holds them in another order")
    raise ValueError(f"{where}: the hook must reduce over DDP's ranks; pass the communicator "
                     "DDP's group was made from (the one collectives.init() returns, or its "
                     "split that DDP runs over)")
