"""NCCL in one process: one communicator per GPU, every per-GPU call inside one NCCL group.

Communicators come from ``NcclCommunicator.initAll(devices)``, once per tuple of devices
(creating them costs far more than a call). Each collective issues one NCCL call per device,
on that device's current stream, between ``groupStart()`` and ``groupEnd()``: results are
ready for later work on each device's stream, and nothing waits on the host.

Every participant needs its own GPU: NCCL refuses two ranks of one communicator on one GPU,
so ``distinct_devices`` raises, naming the shared device, before anything is enqueued.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from collectives.ops import ReduceOp

from . import kernels, nccl_reductions
from .probe import nccl_module

_comms: dict[tuple[int, ...], list] = {}
_lock = threading.Lock()


def distinct_devices(values: Sequence, argument: str = "values",
                     indices: Sequence[int] | None = None) -> tuple[int, ...]:
    """The GPU of each array; ValueError naming the first GPU that holds two of them (as
    ``argument[i]``, ``i`` from ``indices`` where ``values`` are some of the argument's)."""
    seen: dict[int, int] = {}
    names = list(range(len(values))) if indices is None else list(indices)
    for i, v in enumerate(values):
        device = v.device.id
        if device in seen:
            raise ValueError(
                f"{argument}[{names[seen[device]]}] and {argument}[{names[i]}] are both on GPU "
                f"{device}: "
                "NCCL needs a GPU of its own for every participant (it refuses two ranks on "
                "one GPU); use algorithm='auto' or one of the library's algorithms ('ring', "
                "'rechd', 'tree', 'shuffle') for logical devices sharing a GPU")
        seen[device] = i
    return tuple(seen)


def communicators(devices: tuple[int, ...]) -> list:
    """NCCL communicators over ``devices`` (index i: devices[i]), created once per order of
    devices (NCCL's rank order is the order of the blocks an all-gather or reduce-scatter
    gives, so ``(0, 1)`` and ``(1, 0)`` are two cliques); ``free_communicators`` frees
    them."""
    with _lock:
        comms = _comms.get(devices)
        if comms is None:
            comms = _comms[devices] = nccl_module().NcclCommunicator.initAll(list(devices))
        return comms


def free_communicators() -> int:
    """Destroy every NCCL clique made so far (once the devices' current streams are done
    with them); the next call makes its own again. Returns how many were freed."""
    import cupy

    with _lock:
        cliques = list(_comms.items())
        _comms.clear()
    for devices, comms in cliques:
        for device, comm in zip(devices, comms):
            with cupy.cuda.Device(device):
                cupy.cuda.get_current_stream().synchronize()
                comm.destroy()
    return len(cliques)


def _stream(device: int) -> int:
    """The handle of ``device``'s current stream (0 for its legacy stream: NCCL makes each
    communicator's device current while it launches, so 0 names that device's stream)."""
    import cupy

    return cupy.cuda.get_current_stream(device).ptr


class _Group:
    """``with _Group(nccl, comms):`` brackets per-device calls in groupStart/groupEnd (one
    communicator's call needs no group: it launches as it is issued)."""

    def __init__(self, nccl, comms: Sequence):
        self.nccl = nccl if len(comms) > 1 else None

    def __enter__(self):
        if self.nccl is not None:
            self.nccl.groupStart()
        return self

    def __exit__(self, *exc):
        if self.nccl is not None:
            self.nccl.groupEnd()


def _view(x, dtype: np.dtype):
    return x.reshape(-1).view(dtype)


def _keys(arrays, buffers: Sequence, dtype: np.dtype, op: ReduceOp, forward: bool) -> None:
    """Floats to order-preserving integer keys in place (``forward``), or back."""
    import cupy

    to_key, from_key = kernels.key_kernels(np.dtype(dtype), op.wire_op)
    kernel = to_key if forward else from_key
    key = np.dtype(np.int32 if np.dtype(dtype).itemsize == 4 else np.int64)
    for b in buffers:
        if b.size:
            with cupy.cuda.Device(b.device.id):
                kernel(_view(b, key))


def supports(dtype: np.dtype, op: ReduceOp | None) -> bool:
    """Whether NCCL runs this reduction (op None: a move of bytes, always)."""
    if op is None:
        return True
    return nccl_reductions.reduction(nccl_module(), dtype, op) is not None


def all_reduce(arrays, values: Sequence, work: Sequence, op: ReduceOp) -> None:
    """``work[i] = op over values`` (wire op; ``work[i]`` may be ``values[i]``)."""
    nccl = nccl_module()
    devices = distinct_devices(values)
    dtype = np.dtype(values[0].dtype)
    plan = nccl_reductions.reduction(nccl, dtype, op)
    assert plan is not None  # callers run NCCL only where supports() said it reduces this
    comms = communicators(devices)
    if plan.keys:  # keys are made in the work buffers: the inputs stay untouched
        for v, w in zip(values, work):
            if w.data.ptr != v.data.ptr:
                arrays.copy(w.reshape(-1), v.reshape(-1))
        _keys(arrays, work, dtype, op, True)
        sources = work
    else:
        sources = values
    count = values[0].size * plan.scale
    with _Group(nccl, comms):
        for comm, d, s, w in zip(comms, devices, sources, work):
            comm.allReduce(s.data.ptr, w.data.ptr, count, plan.nccl_type, plan.nccl_op,
                           _stream(d))
    if plan.keys:
        _keys(arrays, work, dtype, op, False)


def reduce(arrays, values: Sequence, total, root: int, op: ReduceOp) -> None:
    """``total`` (on values[root]'s GPU) = op over values."""
    nccl = nccl_module()
    devices = distinct_devices(values)
    dtype = np.dtype(values[0].dtype)
    plan = nccl_reductions.reduction(nccl, dtype, op)
    assert plan is not None  # callers run NCCL only where supports() said it reduces this
    comms = communicators(devices)
    sources: list[Any] = list(values)
    if plan.keys:  # keyed copies: the inputs stay untouched
        sources = [total if p == root else arrays.empty(v.shape, v.dtype, like=v)
                   for p, v in enumerate(values)]
        for s, v in zip(sources, values):
            if s.data.ptr != v.data.ptr:
                arrays.copy(s.reshape(-1), v.reshape(-1))
        _keys(arrays, sources, dtype, op, True)
    count = values[0].size * plan.scale
    with _Group(nccl, comms):
        for p, (comm, d, s) in enumerate(zip(comms, devices, sources)):
            recv = total if p == root else s  # only the root's receive buffer is written
            comm.reduce(s.data.ptr, recv.data.ptr, count, plan.nccl_type, plan.nccl_op, root,
                        _stream(d))
    if plan.keys:
        _keys(arrays, [total], dtype, op, False)


def broadcast(outputs: Sequence, root: int) -> None:
    """``outputs[root]`` (already filled) to every output, as bytes."""
    nccl = nccl_module()
    devices = distinct_devices(outputs, "out")
    comms = communicators(devices)
    nbytes = outputs[0].nbytes
    with _Group(nccl, comms):
        for comm, d, o in zip(comms, devices, outputs):
            ptr = o.data.ptr
            comm.broadcast(ptr, ptr, nbytes, nccl_reductions.byte_type(nccl), root, _stream(d))


def all_gather(values: Sequence, stacked: Sequence) -> None:
    """``stacked[i]`` = every value's bytes in order (rank-major)."""
    nccl = nccl_module()
    devices = distinct_devices(values)
    comms = communicators(devices)
    nbytes = values[0].nbytes
    with _Group(nccl, comms):
        for comm, d, v, s in zip(comms, devices, values, stacked):
            comm.allGather(v.data.ptr, s.data.ptr, nbytes, nccl_reductions.byte_type(nccl),
                           _stream(d))


def reduce_scatter(arrays, values: Sequence, blocks: Sequence, op: ReduceOp) -> None:
    """``blocks[i]`` = op over block i of every value (equal blocks)."""
    nccl = nccl_module()
    devices = distinct_devices(values)
    dtype = np.dtype(values[0].dtype)
    plan = nccl_reductions.reduction(nccl, dtype, op)
    assert plan is not None  # callers run NCCL only where supports() said it reduces this
    comms = communicators(devices)
    sources: list[Any] = list(values)
    if plan.keys:
        sources = [arrays.empty(v.shape, v.dtype, like=v) for v in values]
        for s, v in zip(sources, values):
            arrays.copy(s.reshape(-1), v.reshape(-1))
        _keys(arrays, sources, dtype, op, True)
    count = blocks[0].size * plan.scale
    with _Group(nccl, comms):
        for comm, d, s, b in zip(comms, devices, sources, blocks):
            comm.reduceScatter(s.data.ptr, b.data.ptr, count, plan.nccl_type, plan.nccl_op,
                               _stream(d))
    if plan.keys:
        _keys(arrays, blocks, dtype, op, False)
