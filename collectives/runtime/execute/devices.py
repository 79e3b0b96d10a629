"""The multi-device executor's entry point and what it needs from a backend."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ...algorithms.schedule import Schedule
from ...arrays import ArrayBackend
from ...ops import ReduceOp
from ...timeline import record_devices, recorder
from . import rounds, tiles


class DeviceBackend(Protocol):
    """A backend that holds every participant's buffer in one process (logical CPU devices,
    GPUs). It owns the arrays and says how schedules run over them."""

    arrays: ArrayBackend
    cost_model: Any  # a collectives.algorithms.select.CostModel
    strategy: str  # "tiles" or "rounds"
    # True where the devices share memory, so results may be views of one buffer
    # (``shared_result=True`` in the multi-device API); declared here with its default
    shares_memory: bool = False

    def own(self, name: str) -> Callable[..., Any] | None:
        """The backend's own version of the multi-device function ``name`` (the GPU backend's
        NCCL calls), or None where the library's runs it (the default)."""
        ...

    def map_parallel(self, fn: Callable[[int, int], None], length: int, itemsize: int) -> None:
        """Call ``fn(a, b)`` over tiles covering ``[0, length)`` (the tiles strategy)."""
        ...

    def begin_call(self) -> None:
        """Before a collective's first step (e.g. forget the previous call's ordering)."""
        ...

    def end_call(self) -> None:
        """After its last step (e.g. make every device's stream wait for the others)."""
        ...

    def begin_round(self, index: int) -> None:
        """Before the steps of round ``index`` (the rounds strategy): e.g. wait on events."""
        ...

    def end_round(self, index: int) -> None:
        """After them: e.g. record events, end a group of calls."""
        ...


def run_multi_device(schedule: Schedule, inputs: Sequence, work: Sequence, op: ReduceOp,
                     backend: DeviceBackend, *, granule: int = 1,
                     input_offsets: Sequence[int] | None = None,
                     accumulation_fn: Callable | None = None, strategy: str | None = None) -> None:
    """Run ``schedule`` on flat ``work`` buffers, first filling them from flat ``inputs``.

    ``input_offsets[p]`` is where participant p's input lands in its work buffer (all-gather
    puts it at block p); by default inputs fill the whole buffer. ``inputs[p]`` may be None
    (a broadcast's non-roots bring nothing). ``inputs[p] is work[p]`` means in place.
    ``accumulation_fn(list) -> array`` replaces the op's kernel for reduce steps.
    """
    runner = rounds if (strategy or backend.strategy) == "rounds" else tiles
    if recorder.ON:
        backend = record_devices.device_backend(schedule, work, backend)
    backend.begin_call()
    runner.run(schedule, inputs, work, op, backend, granule=granule,
               input_offsets=input_offsets, accumulation_fn=accumulation_fn)
    backend.end_call()
