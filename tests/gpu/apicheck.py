"""Real CuPy's argument rules, checked on the NumPy stand-in for CuPy.

The stand-in takes any Python object where CuPy 14's Cython signatures take C types, so a
stream object passed for a handle, a NumPy array for a pointer, or kernel arguments of mixed
dtypes pass there and fail on a GPU. :func:`strict` wraps the stand-in's functions with the
rules of CuPy 14.2 (its docstring signatures): ``runtime.memcpyAsync(intptr_t dst, intptr_t
src, size_t size, int kind, intptr_t stream)``, ``memcpyPeerAsync(intptr_t dst, int
dstDevice, intptr_t src, int srcDevice, size_t size, intptr_t stream)``, every
``NcclCommunicator`` collective and point-to-point call (``intptr_t`` buffers and stream,
``size_t`` count, ``int`` type, op, root and peer), ``Event.record(stream=None)`` (a stream
object, not a handle), ``Stream.wait_event(event)`` (an event), and ``ElementwiseKernel``,
whose arguments of one type placeholder (``T``) must share one dtype.
"""

from __future__ import annotations

import numbers
from contextlib import contextmanager

import numpy as np

_INTS = {  # (owner path, function): argument names, all C integers
    ("runtime", "memcpyAsync"): ("dst", "src", "size", "kind", "stream"),
    ("runtime", "memcpyPeerAsync"): ("dst", "dstDevice", "src", "srcDevice", "size", "stream"),
    ("comm", "allReduce"): ("sendbuf", "recvbuf", "count", "datatype", "op", "stream"),
    ("comm", "reduce"): ("sendbuf", "recvbuf", "count", "datatype", "op", "root", "stream"),
    ("comm", "broadcast"): ("sendbuff", "recvbuff", "count", "datatype", "root", "stream"),
    ("comm", "allGather"): ("sendbuf", "recvbuf", "count", "datatype", "stream"),
    ("comm", "reduceScatter"): ("sendbuf", "recvbuf", "recvcount", "datatype", "op", "stream"),
    ("comm", "send"): ("sendbuf", "count", "datatype", "peer", "stream"),
    ("comm", "recv"): ("recvbuf", "count", "datatype", "peer", "stream"),
}


def _c_int(value) -> bool:
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool)


def _params(text: str) -> list[tuple[str, str]]:
    return [tuple(p.split()) for p in (s.strip() for s in text.split(",")) if p]


@contextmanager
def strict():
    """Inside the block, the stand-in refuses what CuPy 14.2 refuses; yields the list of
    problems found (each one a string naming the call)."""
    import cupy
    from cupy import cuda
    from cupy.cuda import nccl, runtime

    problems: list[str] = []
    owners = {"runtime": runtime, "comm": nccl.NcclCommunicator}
    saved = [(owners[o], name, getattr(owners[o], name)) for o, name in _INTS]
    saved += [(cuda.Event, "record", cuda.Event.record),
              (cuda.Stream, "wait_event", cuda.Stream.wait_event),
              (cupy.ElementwiseKernel, "__call__", cupy.ElementwiseKernel.__call__)]

    def integers(name, names, original, method):
        def check(*args):
            given = args[1:] if method else args
            problems.extend(f"{name}: {arg}={value!r} is not an integer"
                            for arg, value in zip(names, given) if not _c_int(value))
            return original(*args)
        return check

    for (owner, name), names in _INTS.items():
        setattr(owners[owner], name, integers(name, names, getattr(owners[owner], name),
                                              owner == "comm"))
    record, wait, launch = (cuda.Event.record, cuda.Stream.wait_event,
                            cupy.ElementwiseKernel.__call__)

    def on_record(event, stream=None):
        if stream is not None and not isinstance(stream, cuda.Stream):
            problems.append(f"Event.record: {stream!r} is not a Stream")
        return record(event, stream)

    def on_wait(stream, event):
        if not isinstance(event, cuda.Event):
            problems.append(f"Stream.wait_event: {event!r} is not an Event")
        return wait(stream, event)

    def on_launch(kernel, *args, **kw):
        params = _params(kernel.in_params) + _params(kernel.out_params)
        types: dict[str, np.dtype] = {}
        for (ctype, name), arg in zip(params, args):
            if isinstance(arg, cupy.ndarray) and len(ctype) == 1 and ctype.isupper():
                first = types.setdefault(ctype, arg.dtype)
                if first != arg.dtype:
                    problems.append(f"{kernel.name}: {name} is {arg.dtype}, {ctype} is {first}")
        return launch(kernel, *args, **kw)

    cuda.Event.record, cuda.Stream.wait_event = on_record, on_wait
    cupy.ElementwiseKernel.__call__ = on_launch
    try:
        yield problems
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
