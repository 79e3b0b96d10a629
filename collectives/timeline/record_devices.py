"""Multi-device calls on the timeline, and marks of the frameworks above the library.

A multi-device call runs every device's part in one process, so each device gets a row of
its own (participant ``DEVICE_PID + d``) and the calling thread a track on each: the call
(``device_call``), inside it the plan (``begin_call`` to ``end_call``), and with the
*rounds* strategy each round on the devices that take part in it, with what each receives
and sends (``device_backend`` wraps the backend's hooks; the *tiles* strategy runs every
round on one tile at a time, so it shows the plan alone). A GPU backend adds its devices'
own times from CUDA events (``backends/cupy``). ``marked`` puts a framework's unit of
work (TensorFlow's ``batch_reduce``) around the calls it makes.

Only called while ``recorder.ON`` is true.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from . import record_calls
from . import recorder as rec


def device_pids(n: int, tid: int) -> list[int]:
    pids = [rec.DEVICE_PID + d for d in range(n)]
    for d, pid in enumerate(pids):
        rec.name_process(pid, f"device {d}")
        rec.name_track(pid, tid, f"calls of thread {tid}")
    return pids


@functools.lru_cache(maxsize=64)
def _parameters(function: Callable) -> inspect.Signature:
    return inspect.signature(function)


def _signature(function: Callable, values: Any, args: tuple, kwargs: dict) -> tuple[int, dict]:
    """(devices, args) of a multi-device call, read off its arguments (by name, however they
    were passed)."""
    name = function.__name__
    try:
        given = _parameters(function).bind_partial(values, *args, **kwargs).arguments
    except TypeError:  # (the call itself will say what is wrong with them)
        given = {}
    first = values
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if name in ("broadcast", "scatter"):
        devices = given.get("devices", 1)
        n = int(devices) if isinstance(devices, (int, np.integer)) else len(devices)
    elif name == "batch_all_reduce":
        n = len(values[0]) if values and isinstance(values[0], (list, tuple)) else 1
    else:
        n = len(values) if isinstance(values, (list, tuple)) else 1
    out: dict = {"collective": name, "devices": n}
    if hasattr(first, "shape") and hasattr(first, "dtype"):
        out.update(shape=list(first.shape), dtype=str(first.dtype),
                   bytes=int(getattr(first, "nbytes", 0)))
    if name == "batch_all_reduce":
        out["tensors"] = len(values)
    for argument in ("op", "algorithm", "root"):
        if isinstance(given.get(argument), (str, int)):
            out[argument] = given[argument]
    return n, out


def device_call(function: Callable, values: Any, args: tuple, kwargs: dict,
                run: Callable[[], Any]) -> Any:
    """``run()`` (the multi-device function ``function`` called on ``values``) as a span on
    every device's row."""
    name = function.__name__
    n, signature = _signature(function, values, args, kwargs)
    tid = rec.thread_index()
    pids = device_pids(n, tid)
    ts = rec.now()
    for pid in pids:
        rec.begin(pid, tid, name, "call", ts, signature)
    error = None
    try:
        return run()
    except BaseException as exc:
        error = {"error": f"{type(exc).__name__}: {exc}"}
        raise
    finally:
        ts = rec.now()
        for pid in pids:
            rec.end(pid, tid, ts, error)


def device_backend(schedule: Any, work: Any, backend: Any) -> Any:
    """``backend`` with its call and round hooks on the timeline."""
    return _Traced(schedule, work, backend)


class _Traced:
    """A device backend whose hooks also record the plan and its rounds, per device."""

    def __init__(self, schedule: Any, work: Any, backend: Any):
        self._backend, self._schedule = backend, schedule
        self._tid = rec.thread_index()
        self._pids = device_pids(len(work), self._tid)
        first = work[0] if len(work) else None
        self._nbytes = len(first) * first.dtype.itemsize if first is not None else 0
        self._open: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def begin_call(self) -> None:
        schedule = self._schedule
        args = {"algorithm": schedule.name, "collective": schedule.collective.value,
                "bytes": self._nbytes, "strategy": self._backend.strategy}
        ts = rec.now()
        for pid in self._pids:
            rec.begin(pid, self._tid, f"{schedule.name} plan", "stage", ts, args)
        self._backend.begin_call()

    def end_call(self) -> None:
        self._backend.end_call()
        ts = rec.now()
        for pid in self._pids:
            rec.end(pid, self._tid, ts)

    def begin_round(self, index: int) -> None:
        self._backend.begin_round(index)
        schedule, nbytes = self._schedule, self._nbytes
        steps: dict[int, dict] = {}
        for dst, srcs, lo, hi, reduce in schedule.rounds[index]:
            width = (hi - lo) * nbytes // schedule.den
            mine = steps.setdefault(dst, {"round": index, "sends": [], "recvs": []})
            mine["recvs"].append([list(srcs), width, "reduce" if reduce else "copy"])
            for src in srcs:
                if src != dst:
                    steps.setdefault(src, {"round": index, "sends": [], "recvs": []})[
                        "sends"].append([dst, width])
        ts = rec.now()
        self._open = [p for p in sorted(steps) if p < len(self._pids)]
        for p in self._open:
            rec.begin(self._pids[p], self._tid, f"round {index}", "round", ts, steps[p])

    def end_round(self, index: int) -> None:
        self._backend.end_round(index)
        ts = rec.now()
        for p in self._open:
            rec.end(self._pids[p], self._tid, ts)
        self._open = []


def marked(fn: Callable, name: str, comm: Any, describe: Callable[..., dict]) -> Callable:
    """``fn`` whose every call (while recording) is a span ``name`` whose args are
    ``describe(*its arguments)``: on the communicator's track, or without one on this
    process's host row."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not rec.ON:
            return fn(*args, **kwargs)
        if comm is not None:
            where = record_calls.track(comm)
            pid, tid = where.pid, where.tid
        else:
            where, pid, tid = None, rec.HOST_PID, rec.thread_index()
            rec.name_process(pid, "host")
            rec.name_track(pid, tid, f"thread {tid}")
        rec.begin(pid, tid, name, "batch", max(rec.now(), where.end if where else 0),
                  describe(*args, **kwargs))
        try:
            return fn(*args, **kwargs)
        finally:
            ts = rec.now()
            rec.end(pid, tid, ts)
            if where is not None:
                where.end = ts

    return run
