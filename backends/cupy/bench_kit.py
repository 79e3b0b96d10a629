"""``collectives bench --backend cupy``: the benchmark's arrays on GPUs.

Participant ``p`` lives on GPU ``p mod (GPU count)``: with one GPU, every participant is a
logical device on it. Calls go through this backend's functions (so ``-a nccl`` runs NCCL),
and the clock stops only after every GPU has finished (the calls return once enqueued). For
each size the kit also measures the copy ceiling: the time the card takes to copy the
participants' inputs into their outputs, which no out-of-place collective can beat.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any


class CupyBenchKit:
    """The bench's array kit (``collectives.tools.bench.ArrayKit``) for CuPy arrays."""

    def __init__(self, participants: int):
        from .devices import OWN_FUNCTIONS, devices

        self.cupy = devices().arrays.xp  # raises where no GPU is visible
        self.api = SimpleNamespace(**OWN_FUNCTIONS)  # this backend's functions (-a nccl: NCCL)
        count = self.cupy.cuda.runtime.getDeviceCount()
        self.devices = [p % count for p in range(participants)]

    def inputs(self, values: list) -> list:
        cp = self.cupy
        out = []
        for p, v in enumerate(values):
            with cp.cuda.Device(self.devices[p]):
                out.append(cp.asarray(v))
        return out

    def zeros(self, shape, dtype, participant: int):
        cp = self.cupy
        with cp.cuda.Device(self.devices[participant]):
            return cp.zeros(shape, dtype)

    def copyto(self, dst, src) -> None:
        cp = self.cupy
        with cp.cuda.Device(dst.device.id):
            if src.device.id == dst.device.id:
                cp.copyto(dst, src)
            else:
                dst.data.copy_from_device_async(src.data, src.nbytes)

    def host(self, x) -> Any:
        return None if x is None else self.cupy.asnumpy(x)

    def fence(self) -> None:
        cp = self.cupy
        for d in sorted(set(self.devices)):
            with cp.cuda.Device(d):
                cp.cuda.get_current_stream().synchronize()

    def resolve(self, case, algorithm: str) -> str | None:
        """What runs: "nccl" where this backend takes NCCL, else None (the library's choice)."""
        from .call_parts import nccl_request

        request = nccl_request(algorithm, case.count)
        distinct = len(set(self.devices)) == len(self.devices)
        if request == "nccl" or (request == "auto" and distinct and case.n > 1):
            return "nccl"
        return None

    def ceiling(self, case, inputs: list) -> Callable[[], None]:
        """A call that copies each participant's input into an output of its own (raw device
        copies, as the library's copies are): the bench times it as the copy ceiling."""
        from .devices import devices

        arrays = devices().arrays
        outs = [self.zeros(x.shape, x.dtype, p) for p, x in enumerate(inputs)]

        def copy_all() -> None:
            for o, x in zip(outs, inputs):
                arrays.copy(o.reshape(-1), x.reshape(-1))

        return copy_all


def bench_kit(participants: int) -> CupyBenchKit:
    return CupyBenchKit(participants)

