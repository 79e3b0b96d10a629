"""Stream order of the multi-device backend, checked on the NumPy stand-in for CuPy (which
runs everything at once, so only a happens-before check can see a missing wait; on a GPU a
missing wait shows, sometimes, as wrong bits in the other GPU tests). Every collective and
algorithm, logical devices with streams of their own and without, one array per GPU, mixed,
in place: each copy and kernel must be ordered after every conflicting earlier one on another
stream. Skipped, saying why, where CuPy is real or missing."""

from __future__ import annotations

import numpy as np
import pytest
from gpukit import STAND_IN, gpu_count, host, on_devices

import collectives
from collectives import algorithms
from collectives.algorithms.schedule import Collective
from collectives.ops import ReduceOp
from collectives.tools.reference import exact_inputs

pytestmark = pytest.mark.skipif(not STAND_IN, reason="needs the NumPy stand-in for CuPy on the "
                                "import path: it records stream order, which a GPU cannot show")


def layouts() -> list[list[int]]:
    count = gpu_count()
    out = [[0, 0, 0, 0], [0, 0, 0]]
    if count >= 2:
        out += [list(range(min(count, 4))), [p % 2 for p in range(4)], [1, 0]]
    return out


def _call(gpu, collective, values, arrays, devices, op, algorithm):
    n = len(values)
    if collective == "broadcast":
        target = devices if len(set(devices)) == n else n
        return gpu.broadcast(arrays[0], target, algorithm), collectives.broadcast(values[0], n,
                                                                                  algorithm)
    if collective == "all_gather":
        return gpu.all_gather(arrays, 0, algorithm), collectives.all_gather(values, 0, algorithm)
    if collective == "reduce":
        return ([gpu.reduce(arrays, op, 0, algorithm)],
                [collectives.reduce(values, op, 0, algorithm)])
    return (getattr(gpu, collective)(arrays, op, algorithm),
            getattr(collectives, collective)(values, op, algorithm))


@pytest.mark.parametrize("own_streams", [True, False], ids=["own streams", "shared streams"])
def test_every_step_is_ordered_after_what_it_reads_and_overwrites(own_streams):
    from collectives.backends import cupy as gpu
    from streamcheck import recording

    calls = 0
    with recording() as order, gpu.logical_streams(own_streams):
        for devices in layouts():
            n = len(devices)
            for collective in ("all_reduce", "reduce", "reduce_scatter", "all_gather",
                               "broadcast"):
                for algorithm in ("one_device", "ring", "rechd", "tree", "shuffle"):
                    if not algorithms.supports(Collective(collective), algorithm):
                        continue
                    for op in (ReduceOp.SUM, ReduceOp.MEAN):
                        rows = 37 * n if collective == "reduce_scatter" else 37
                        values = exact_inputs(n, rows, np.float32, op)
                        arrays = on_devices(values, devices)
                        got, want = _call(gpu, collective, values, arrays, devices, op,
                                          algorithm)
                        assert all(np.array_equal(w, host(g)) for w, g in zip(want, got))
                        if collective == "all_reduce":  # in place, on the same buffers
                            gpu.all_reduce(arrays, op, algorithm, out=arrays)
                        calls += 1
    assert calls >= 96
    assert not order.violations, f"{len(order.violations)} races, e.g. {order.violations[:3]}"


def test_the_check_sees_a_missing_wait():
    """A copy on one stream of what another stream wrote, with no event between: a race."""
    import cupy
    from streamcheck import recording

    with recording() as order:
        a, b = cupy.zeros(64, np.float32), cupy.empty(64, np.float32)
        first, second = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
        rt = cupy.cuda.runtime
        rt.memcpyAsync(a.data.ptr, b.data.ptr, 256, rt.memcpyDeviceToDevice, first.ptr)
        rt.memcpyAsync(b.data.ptr, a.data.ptr, 256, rt.memcpyDeviceToDevice, second.ptr)
        assert len(order.violations) == 2  # reads a (written), overwrites b (read)
        event = cupy.cuda.Event()
        event.record(second)
        first.wait_event(event)
        rt.memcpyAsync(a.data.ptr, b.data.ptr, 256, rt.memcpyDeviceToDevice, first.ptr)
        assert len(order.violations) == 2  # ordered now
