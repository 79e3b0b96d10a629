"""The timeline of multi-device calls over CuPy arrays: every device's rounds as the plan has
them, and, where CuPy times CUDA events, each GPU's own rounds on a row of its own, in order.
Skipped, with the reason, where CuPy or a GPU is missing."""

from __future__ import annotations

import time

import numpy as np
from gpukit import host, needs_gpu, on_devices

from collectives import algorithms
from collectives import timeline as tl
from collectives.algorithms.schedule import Collective
from collectives.timeline import recorder
from collectives.timeline import trace_files as traces

pytestmark = needs_gpu


def test_device_rounds_on_the_timeline(tmp_path):
    import cupy
    from collectives.backends import cupy as gpu
    from collectives.backends.cupy import timing

    devices = [0] * 4  # logical devices sharing one GPU, as the devices tests run them
    values = on_devices([np.full(1000, d, np.float32) for d in range(4)], devices)
    tl.start(tmp_path / "t")
    try:
        results = gpu.all_reduce(values, "sum", "ring")
        cupy.cuda.Device(0).synchronize()
        timed = hasattr(cupy.cuda, "get_elapsed_time")  # CuPy's own; not every stand-in's
        deadline = time.monotonic() + 10
        while timed and timing.PENDING and time.monotonic() < deadline:
            tl.flush()
            time.sleep(0.01)
    finally:
        tl.stop()
    assert all((host(r) == 6).all() for r in results)
    events = traces.merge(tmp_path / "t")["traceEvents"]
    assert traces.problems(events) == []
    every = traces.spans(events)
    schedule = algorithms.schedule(Collective.ALL_REDUCE, "ring", 4)
    for d in range(4):
        rounds = [s for s in every if s.pid == recorder.DEVICE_PID + d and s.cat == "round"]
        want = [i for i, rnd in enumerate(schedule.rounds)
                if any(dst == d or d in srcs for dst, srcs, *_ in rnd)]
        assert [r.args["round"] for r in rounds] == want
    if timed:
        for gpu_id in sorted(set(devices)):
            mine = [s for s in every if s.pid == timing.GPU_ROWS + gpu_id]
            assert [s.args["round"] for s in mine] == list(range(len(schedule.rounds)))
            assert all(a.end <= b.start + 1e-3 for a, b in zip(mine, mine[1:]))
