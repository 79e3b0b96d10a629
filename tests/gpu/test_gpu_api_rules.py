"""Every CuPy and NCCL call of the multi-device backend passes the argument types real CuPy 14
takes (``apicheck``: handles and pointers as integers, stream and event objects where CuPy wants
objects, one dtype per kernel type placeholder), checked on the NumPy stand-in for CuPy, which
takes anything: a mistake of that kind passes there and fails on the first GPU call. Skipped,
saying why, where CuPy is real or missing (a GPU run is its own check)."""

from __future__ import annotations

import numpy as np
import pytest
from gpukit import STAND_IN, gpu_count, host, on_devices

import collectives
from collectives.tools.reference import exact_inputs

pytestmark = pytest.mark.skipif(not STAND_IN, reason="needs the NumPy stand-in for CuPy on the "
                                "import path (on a GPU, CuPy itself refuses wrong arguments)")

KINDS = [(np.float32, "sum"), (np.float64, "max"), (np.float16, "min"), (np.int64, "prod"),
         (np.complex64, "mean"), (np.bool_, "max"), (np.int32, "mean")]


def _layouts() -> list[list[int]]:
    return [[0, 0, 0]] + ([[0, 1], [1, 0, 1, 0]] if gpu_count() >= 2 else [])


def test_the_check_sees_wrong_arguments():
    import cupy
    from apicheck import strict
    from collectives.backends.cupy import kernels

    from collectives.ops import ReduceOp

    with strict() as problems:
        a, b = cupy.zeros(8, np.float32), cupy.empty(8, np.float32)
        stream = cupy.cuda.Stream(non_blocking=True)
        rt = cupy.cuda.runtime
        rt.memcpyAsync(b.data.ptr, a.data.ptr, 32, rt.memcpyDeviceToDevice, stream)  # not .ptr
        cupy.cuda.Event().record(stream.ptr)  # a handle, not the stream
        kernels.combine_kernel(ReduceOp.SUM, 1, False)(cupy.zeros(8, np.float64), b)
        assert len(problems) == 3, problems
        rt.memcpyAsync(b.data.ptr, a.data.ptr, 32, rt.memcpyDeviceToDevice, stream.ptr)
        assert len(problems) == 3, problems


@pytest.mark.parametrize("own_streams", [True, False], ids=["own streams", "shared streams"])
def test_every_call_takes_real_cupy_argument_types(own_streams):
    from apicheck import strict
    from collectives.backends import cupy as gpu

    with strict() as problems, gpu.logical_streams(own_streams):
        for devices in _layouts():
            n = len(devices)
            distinct = len(set(devices)) == n
            for dtype, op in KINDS:
                values = exact_inputs(n, 37 * n, dtype, op)
                for algorithm in ["ring", "rechd", "one_device"] + ["nccl"] * distinct:
                    arrays = on_devices(values, devices)
                    got = gpu.all_reduce(arrays, op, algorithm)
                    want = collectives.all_reduce(values, op, "ring")
                    assert all(np.allclose(w, host(g)) for w, g in zip(want, got))
                    gpu.reduce(arrays, op, 0, algorithm)
                    gpu.reduce_scatter(arrays, op, algorithm)
                    gpu.all_gather(arrays, 0, algorithm, async_op=True).wait(timeout=60)
                    gpu.broadcast(arrays[0], devices if distinct else n,
                                  algorithm if algorithm != "rechd" else "tree")
            ones = on_devices(exact_inputs(1, 64, np.float64, "max"), [0])
            for fn in (gpu.all_reduce, gpu.reduce_scatter):
                fn(ones, "max", "nccl")  # a one-device clique, with float keys
    assert not problems, problems[:5]
