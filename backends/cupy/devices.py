"""GPUs (or logical devices sharing one) in one process: the multi-device backend for CuPy.

Schedules run with the core's *rounds* strategy: each step is one copy or one fused n-ary
combine over a whole range, enqueued on the stream of the buffer it writes. Nothing waits on
the host; streams are ordered with events instead:

* each GPU's work goes on that device's current stream (in the calling thread). Under
  :func:`logical_streams`, every further buffer a call writes on a GPU (each logical device
  sharing it) gets a stream of its own, which first waits for the current stream;
* within a round, steps never read what another step writes, so every stream runs its steps
  at once;
* at the end of every round every stream of the call is joined: one waits for an event of
  each that worked since the last join, records one, and every other one waits for that. The
  next round reads finished data and overwrites nothing another stream still reads; after
  the last round the same join means the results are ready for work on each device's current
  stream, and no stream still reads them;
* a step whose stream, or its source's, has not taken part in a join of the call yet (the
  first round, which reads the call's first copies; a stream first met later) waits for an
  event of the source's stream where it first reads it.

Logical devices on one GPU share its current stream by default, so for them the joins cost
nothing. The order of operations is the schedule's, exactly as on the NumPy backend, so
results are bitwise equal to it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from collectives.algorithms.select import CostModel
from collectives.timeline import recorder

from .arrays import CupyArrays, _cupy
from .timing import DeviceCall

# This backend's own multi-device functions by name, registered by the modules that define
# them (which import this one: the backend never imports its functions, so no circle).
OWN_FUNCTIONS: dict[str, Callable] = {}


def own_function(fn: Callable) -> Callable:
    """Register ``fn`` as what the backend runs for the multi-device function of its name."""
    OWN_FUNCTIONS[fn.__name__] = fn
    return fn


class _Lane:
    """A stream of one device that a call writes on: ``stream`` None is the device's current
    stream in the calling thread."""

    __slots__ = ("device", "pending", "stream")

    def __init__(self, device: int, stream: Any = None):
        self.device, self.stream, self.pending = device, stream, False

    def handle(self):
        return self.stream if self.stream is not None else _cupy().cuda.get_current_stream()


class _CallState(threading.local):
    """What the call this thread runs has met: its streams, and whether a join is due."""

    def __init__(self) -> None:
        self.active = False  # between begin_call and end_call
        self.logical = False  # under logical_streams(): a stream per buffer written on a GPU
        self.roots: dict[int, tuple[Any, _Lane]] = {}  # id(allocation) -> (it, its lane)
        self.lanes: list[_Lane] = []  # every lane of the call
        self.current: dict[int, _Lane] = {}  # device -> the lane of its current stream
        self.written: set[int] = set()  # devices whose current stream a written buffer took
        self.spare: dict[int, int] = {}  # device -> pool streams handed out in this call
        self.pool: dict[int, list] = {}  # device -> this thread's own streams, made once
        self.joined: set[int] = set()  # id(lane): lanes the last join ordered
        self.waited: set[tuple[int, int]] = set()  # (reader, source) waits since then
        self.pending = False
        self.fresh = True  # a call is being set up: its first round meets streams afresh
        self.last_round = -1
        self.times: DeviceCall | None = None  # its CUDA events, while the timeline records


def _root(x: Any) -> Any:
    """The array that owns ``x``'s memory (views name it as their base)."""
    while getattr(x, "base", None) is not None:
        x = x.base
    return x


class CupyDevices:
    """Multi-device backend for ``cupy.ndarray`` (strategy "rounds").

    ``peer``: read other GPUs' memory directly where the hardware allows it (default), or
    always stage through a copy on the destination device (for comparisons).
    """

    strategy = "rounds"
    shares_memory = False
    # Each step is a kernel launch or a copy from Python (~10 us); bytes move at device
    # memory speed (logical devices) or over the links between GPUs.
    cost_model = CostModel(latency=20e-6, seconds_per_byte=1 / 100e9,
                           reduce_seconds_per_byte=1 / 500e9, message_overhead=10e-6)

    def __init__(self) -> None:
        self._state = _CallState()
        self.arrays = CupyArrays(on_enqueue=self._enqueue)

    @contextmanager
    def logical_streams(self, enabled: bool = True):
        """Calls of this thread inside the block give every logical device (every buffer a
        call writes on a GPU, past the first) a stream of its own, so their steps may run
        concurrently; results are still ready on each device's current stream."""
        state = self._state
        before, state.logical = state.logical, bool(enabled)
        try:
            yield self
        finally:
            state.logical = before

    def streams_in_last_call(self) -> int:
        """How many streams the calling thread's last call wrote on (one per device, more
        under :meth:`logical_streams`)."""
        return len({id(lane) for lane in self._state.lanes if lane.device in
                    self._state.written or lane.stream is not None})

    # --- stream ordering ----------------------------------------------------------------

    def _lane_of(self, x: Any, write: bool) -> _Lane:
        state = self._state
        root = _root(x)
        known = state.roots.get(id(root))
        if known is not None:
            return known[1]
        device = root.device.id
        current = state.current.get(device)
        if current is None:
            current = state.current[device] = _Lane(device)
            state.lanes.append(current)
        lane = current
        if write and state.logical and device in state.written:
            lane = _Lane(device, self._spare_stream(device))
            state.lanes.append(lane)
            self._wait(lane, self._record(current))  # the caller's work, and allocations
        elif write:
            state.written.add(device)
        state.roots[id(root)] = (root, lane)  # (kept alive: its id stays its own)
        return lane

    def _spare_stream(self, device: int):
        state = self._state
        k = state.spare.get(device, 0)
        state.spare[device] = k + 1
        pool = state.pool.setdefault(device, [])
        if k == len(pool):
            cp = _cupy()
            with cp.cuda.Device(device):
                pool.append(cp.cuda.Stream(non_blocking=True))
        return pool[k]

    def _enqueue(self, dst: Any, srcs: Sequence[Any]):
        """Order an operation that writes ``dst`` after what it reads; its stream (None: the
        destination device's current one)."""
        state = self._state
        if not state.active:
            return None  # outside a call's steps: the current streams, as CuPy's own calls
        target = self._lane_of(dst, True)
        joined, waited = state.joined, state.waited
        for src in srcs:
            source = self._lane_of(src, False)
            if source is target or (id(target) in joined and id(source) in joined):
                continue  # one stream, or both ordered by the last join
            if (id(target), id(source)) not in waited:
                # First read of this stream since the last join that ordered both: wait for
                # what it holds now (the caller's input, the call's first copies), no more.
                self._wait(target, self._record(source))
                waited.add((id(target), id(source)))
        target.pending = state.pending = True
        if state.times is not None:
            state.times.first(target.device)
        return target.stream

    def _record(self, lane: _Lane):
        cp = _cupy()
        with cp.cuda.Device(lane.device):
            event = cp.cuda.Event(block=False, disable_timing=True)
            event.record(lane.handle())
        return event

    def _wait(self, lane: _Lane, event) -> None:
        with _cupy().cuda.Device(lane.device):
            lane.handle().wait_event(event)

    def join(self) -> None:
        """Every stream of the call waits for every other one's work so far."""
        state = self._state
        if not state.pending:
            return
        state.pending = False
        lanes = state.lanes
        if len(lanes) > 1:
            hub = lanes[0]
            for lane in lanes[1:]:
                if lane.pending:
                    self._wait(hub, self._record(lane))
            done = self._record(hub)
            for lane in lanes[1:]:
                self._wait(lane, done)
        for lane in lanes:
            lane.pending = False
        state.joined = {id(lane) for lane in lanes}
        state.waited.clear()

    def own(self, name: str):
        """This backend's own multi-device function ``name`` (NCCL, async handles), which
        ``collectives.all_reduce`` and friends hand CuPy arrays to (see :func:`own_function`)."""
        return OWN_FUNCTIONS.get(name)

    def begin_call(self) -> None:
        """A call begins: it meets its buffers' streams afresh."""
        state = self._state
        state.fresh = state.active = True
        state.roots.clear()
        state.lanes.clear()
        state.current.clear()
        state.written.clear()
        state.spare.clear()
        state.joined.clear()
        state.waited.clear()
        state.pending = False
        # while the timeline records: CUDA events on each device's current stream (work on
        # the extra streams of logical_streams() shows once the end of the call joins them)
        state.times = DeviceCall(self.arrays.stream) if recorder.ON else None

    def end_call(self) -> None:
        """A call ends with every stream it met waiting for the others' work of it (the
        devices' current streams among them)."""
        state = self._state
        state.pending = state.pending or any(lane.pending for lane in state.lanes)
        self.join()
        state.active = False
        state.roots.clear()
        if state.times is not None:
            state.times.end()
            state.times = None

    def begin_round(self, index: int) -> None:
        state = self._state
        if state.fresh or index <= state.last_round:
            # The first round of a call: no join has ordered its streams yet (its first
            # copies are on them), so each read waits for its source's stream.
            state.joined.clear()
            state.waited.clear()
            state.fresh = False
        else:
            self.join()
        state.last_round = index

    def end_round(self, index: int) -> None:
        self.join()
        if self._state.times is not None:
            self._state.times.mark(index)

    def map_parallel(self, fn: Callable[[int, int], None], length: int, itemsize: int) -> None:
        """The tiles strategy's hook: one tile, the whole range (GPUs run rounds)."""
        fn(0, length)


@lru_cache(maxsize=1)
def devices() -> CupyDevices:
    """The shared CuPy multi-device backend (raises where no GPU is visible)."""
    from .probe import require_gpu

    require_gpu()
    return CupyDevices()


def logical_streams(enabled: bool = True):
    """``with logical_streams(): ...``: calls of this thread give each logical device sharing
    a GPU a stream of its own (see :meth:`CupyDevices.logical_streams`)."""
    return devices().logical_streams(enabled)
