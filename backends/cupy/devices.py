"""GPUs (or logical devices sharing one) in one process: the multi-device backend for CuPy.

Schedules run with the core's *rounds* strategy: each step is one copy or one fused n-ary
combine over a whole range, enqueued on the destination device's stream. Nothing waits on
the host; streams are ordered with events instead:

* within a round, steps never read what another step writes, so every device's stream runs
  its steps at once;
* at the end of every round, each device that took part records an event and every other
  one waits for it (a join), so the next round reads finished data and overwrites nothing
  another device is still reading; after the last round the same join means the results are
  ready for work on each device's current stream, and no stream still reads them;
* a device met for the first time in a call, as the source of a step, is waited for where
  it is first read (its pending work is the caller's input). A call begins where the core
  flattens its inputs (``arrays.flat``), which it does for every call before any round.

Logical devices on one GPU share that GPU's stream, so for them the joins cost nothing. The
order of operations is the schedule's, exactly as on the NumPy backend, so results are
bitwise equal to it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import lru_cache

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


class _CallState(threading.local):
    """The devices of the call this thread is running, and whether a join is due."""

    def __init__(self) -> None:
        self.known: dict[int, None] = {}  # an ordered set of CUDA device ids
        self.pending = False
        self.fresh = True  # a call is being set up: its first round meets devices afresh
        self.last_round = -1
        self.times: DeviceCall | None = None  # its CUDA events, while the timeline records


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

    # --- stream ordering ----------------------------------------------------------------

    def _enqueue(self, dst: int, srcs: Sequence[int]) -> None:
        state = self._state
        known = state.known
        for src in srcs:
            if src != dst and src not in known:
                # First read of this device in the call: wait for what its stream holds now
                # (the caller's work on its input), and no more.
                self._wait(dst, self._record(src))
                known[src] = None
        known.setdefault(dst, None)
        state.pending = True
        if state.times is not None:
            state.times.first(dst)

    def _record(self, device: int):
        cp = _cupy()
        with cp.cuda.Device(device):
            event = cp.cuda.Event(block=False, disable_timing=True)
            event.record(self.arrays.stream(device))
        return event

    def _wait(self, device: int, event) -> None:
        with _cupy().cuda.Device(device):
            self.arrays.stream(device).wait_event(event)

    def join(self) -> None:
        """Every device of the call waits for every other one's work so far."""
        state = self._state
        if not state.pending:
            return
        state.pending = False
        devices = list(state.known)
        if len(devices) < 2:
            return
        events = {d: self._record(d) for d in devices}
        for d in devices:
            for e in devices:
                if e != d:
                    self._wait(d, events[e])

    def own(self, name: str):
        """This backend's own multi-device function ``name`` (NCCL, async handles), which
        ``collectives.all_reduce`` and friends hand CuPy arrays to (see :func:`own_function`)."""
        return OWN_FUNCTIONS.get(name)

    def begin_call(self) -> None:
        """A call begins: its first round meets its devices afresh."""
        self._state.fresh = True
        self._state.times = DeviceCall(self.arrays.stream) if recorder.ON else None

    def end_call(self) -> None:
        """A call ends with every device waiting for the others' work of it."""
        self.join()
        if self._state.times is not None:
            self._state.times.end()
            self._state.times = None

    def begin_round(self, index: int) -> None:
        state = self._state
        if state.fresh or index <= state.last_round:
            # The first round of a call: its devices are met afresh, each waited for where it
            # is first read. The previous call ended with a join, so nothing of it is left to
            # order; what the caller did since is on the devices' streams.
            state.known.clear()
            state.pending = state.fresh = False
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
