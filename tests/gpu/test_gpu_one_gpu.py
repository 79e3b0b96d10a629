"""What one GPU can show of the multi-device backend beyond the matrix of test_gpu_devices:

* NCCL's reduce, broadcast, all-gather and reduce-scatter (besides all-reduce) through a
  one-device clique, for every dtype and op, bitwise against the NumPy backend;
* logical devices sharing the GPU, each on a stream of its own (``logical_streams()``), so
  the events and joins that order rounds across streams run (on a shared stream they cost
  nothing and prove nothing): every collective and algorithm, bitwise, and large enough
  (64 MiB) that a missing wait would let a step read unfinished data.

Skipped, with the reason, where CuPy or a GPU is missing."""

from __future__ import annotations

import numpy as np
import pytest
from gpukit import STAND_IN, gpu_count, host, is_bfloat16, needs_gpu, on_devices, same_bits

import collectives
from collectives import algorithms
from collectives.algorithms.schedule import Collective
from collectives.ops import BFLOAT16, ReduceOp, check_dtype
from collectives.tools.reference import exact_inputs, random_inputs

pytestmark = needs_gpu

DTYPES = [np.bool_, np.int8, np.int16, np.uint32, np.int64, np.float16, np.float32,
          np.float64, np.complex64] + ([BFLOAT16] if BFLOAT16 is not None else [])


def gpu():
    from collectives.backends import cupy as backend

    return backend


def pairs(ops=tuple(ReduceOp)):
    for dtype in DTYPES:
        for op in ops:
            try:
                check_dtype(op, np.dtype(dtype))
            except TypeError:
                continue
            if STAND_IN and is_bfloat16(dtype):
                continue  # the stand-in has no NCCL bfloat16 (STAND_IN_GAP)
            yield np.dtype(dtype), op


def test_every_nccl_collective_over_one_device():
    checked = 0
    for dtype, op in pairs():
        values = exact_inputs(1, 1009, dtype, op)
        (x,) = on_devices(values, [0])
        got = host(gpu().reduce([x], op, 0, "nccl"))
        assert same_bits(collectives.reduce(values, op, 0, "ring"), got), ("reduce", dtype, op)
        got = host(gpu().reduce_scatter([x], op, "nccl")[0])
        want = collectives.reduce_scatter(values, op, "ring")[0]
        assert same_bits(want, got), ("reduce_scatter", dtype, op)
        checked += 2
    for dtype, _ in pairs((ReduceOp.SUM,)):
        values = exact_inputs(1, 1009, dtype, ReduceOp.SUM)
        (x,) = on_devices(values, [0])
        (copy,) = gpu().broadcast(x, [0], "nccl")
        assert same_bits(values[0], host(copy)) and copy.data.ptr != x.data.ptr
        (gathered,) = gpu().all_gather([x], 0, "nccl")
        assert same_bits(values[0], host(gathered)), ("all_gather", dtype)
        assert same_bits(values[0], host(x))  # the input untouched
        checked += 2
    assert checked > 60


def _run(collective: str, values: list, op: ReduceOp, algorithm: str):
    """NumPy's results and the GPU's (host copies), on logical devices of GPU 0."""
    n = len(values)
    arrays = on_devices(values, [0] * n)
    if collective == "broadcast":
        return collectives.broadcast(values[0], n, algorithm), gpu().broadcast(arrays[0], n,
                                                                               algorithm)
    if collective == "all_gather":
        return (collectives.all_gather(values, 0, algorithm),
                gpu().all_gather(arrays, 0, algorithm))
    if collective == "reduce":
        return ([collectives.reduce(values, op, 0, algorithm)],
                [gpu().reduce(arrays, op, 0, algorithm)])
    fn = getattr(collectives, collective)
    return fn(values, op, algorithm), getattr(gpu(), collective)(arrays, op, algorithm)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("collective", ["all_reduce", "reduce", "reduce_scatter", "all_gather",
                                        "broadcast"])
def test_logical_devices_with_streams_of_their_own(collective, n):
    kinds = [(np.dtype(np.float32), ReduceOp.SUM), (np.dtype(np.int64), ReduceOp.PROD),
             (np.dtype(np.float16), ReduceOp.MAX), (np.dtype(np.float64), ReduceOp.MEAN)]
    names = [a for a in ("one_device", "ring", "rechd", "tree", "shuffle")
             if algorithms.supports(Collective(collective), a)]
    backend = gpu().devices()
    streams = set()
    with gpu().logical_streams():
        for algorithm in names:
            for dtype, op in kinds:
                rows = 1009 * n if collective == "reduce_scatter" else 1009
                values = exact_inputs(n, rows, dtype, op)
                cpu, got = _run(collective, values, op, algorithm)
                for c, g in zip(cpu, got):
                    assert same_bits(c, host(g)), (collective, algorithm, dtype, op)
                # one stream per logical device whose buffer the call wrote
                streams.add(backend.streams_in_last_call())
    assert max(streams) == n  # (a reduce's one_device writes the root's buffer alone)
    values = exact_inputs(n, 64, np.float32)
    gpu().all_reduce(on_devices(values, [0] * n), "sum", "ring")
    assert backend.streams_in_last_call() == 1  # outside the block: the current stream


@pytest.mark.parametrize("algorithm", ["ring", "rechd", "tree"])
def test_64_mib_on_streams_of_their_own(algorithm):
    """Rounded sums only match NumPy's bits in the schedule's order, and at this size a
    step that ran before its inputs were ready would read stale or half-written data."""
    import cupy

    values = random_inputs(4, (64 << 20) // 4 // 4, np.float32, seed=11)
    want = collectives.all_reduce(values, "sum", algorithm)
    with gpu().logical_streams():
        handle = gpu().all_reduce(on_devices(values, [0] * 4), "sum", algorithm,
                                  async_op=True)
        got = handle.wait(timeout=120)
    assert gpu().devices().streams_in_last_call() == 4
    cupy.cuda.Device(0).synchronize()
    assert all(same_bits(w, host(g)) for w, g in zip(want, got))


@pytest.mark.parametrize("algorithm", ["auto", "ring", "tree"])  # (NCCL: a GPU per device)
def test_outs_that_overlap_one_another_are_refused(algorithm):
    # (as on the NumPy backend: filled one after another, the last written won where they
    # overlapped; a reduce-scatter given one array for every device returned the last block)
    import cupy

    values = on_devices([np.arange(8.0), np.arange(8.0) + 10], [0, 0])
    buffer = cupy.zeros(12)
    with pytest.raises(ValueError, match=r"out\[1\] shares memory with out\[0\]"):
        collectives.all_reduce(values, "sum", algorithm, out=[buffer[0:8], buffer[4:12]])
    one = cupy.zeros(4)
    with pytest.raises(ValueError, match=r"out\[1\] shares memory with out\[0\]"):
        collectives.reduce_scatter(values, "sum", algorithm, out=[one, one])
    assert not host(buffer).any() and not host(one).any()
    shared = cupy.empty(8)  # (one array for every device: each takes the same result)
    results = collectives.all_reduce(values, "sum", algorithm, out=[shared, shared])
    assert results[0] is shared and np.array_equal(host(shared), np.arange(8.0) * 2 + 10)


@pytest.mark.parametrize("algorithm", ["auto", "ring"])
def test_an_integer_mean_sums_in_float64(algorithm):
    # (as on the NumPy backend: two devices' uint8 200s wrapped to 144, a "mean" of 72)
    values = on_devices([np.array([200, 7], np.uint8)] * 2, [0, 0])
    for got in collectives.all_reduce(values, "mean", algorithm):
        assert got.dtype == np.float64 and host(got).tolist() == [200.0, 7.0]
    assert host(collectives.reduce(values, "mean", 0, algorithm)).tolist() == [200.0, 7.0]


def test_compression_and_shared_result_take_cupy_arrays():
    # (every compressed call on CuPy arrays raised "unexpected keyword argument
    # 'shared_result'", and so did shared_result=False)
    numpy_values = [np.arange(6.0, dtype=np.float32) / 3 + k for k in range(2)]
    values = on_devices(numpy_values, [0, 0])
    want = collectives.all_reduce(numpy_values, "sum", compression="fp16")
    for got, w in zip(collectives.all_reduce(values, "sum", compression="fp16"), want):
        assert same_bits(host(got), w)
    batch = collectives.batch_all_reduce([values, values], "mean", compression="fp16")
    assert len(batch) == 2 and all(host(v).dtype == np.float32 for row in batch for v in row)
    assert same_bits(host(collectives.all_reduce(values, shared_result=False)[1]),
                     numpy_values[0] + numpy_values[1])
    with pytest.raises(ValueError, match="shared_result=True needs devices that share memory; CuPy"):
        collectives.all_reduce(values, shared_result=True)


def test_a_compressed_mean_at_float16s_largest_stays_finite_on_cupy_arrays():
    # (65504 / 3 rounds up to 21840, and three of them made inf: the CuPy backend's
    # round_inward takes the rounding below there, as NumPy's does)
    numpy_values = [np.array([65504, -65504, 1.5], np.float32)] * 3
    want = collectives.all_reduce(numpy_values, "mean", compression="fp16")
    got = collectives.all_reduce(on_devices(numpy_values, [0, 0, 0]), "mean", compression="fp16")
    assert np.isfinite(want[0]).all()
    for g, w in zip(got, want):
        assert same_bits(host(g), w)


def test_an_asynchronous_batch_of_cupy_lists_is_the_backends_own_handle():
    # (collectives.batch_all_reduce(..., async_op=True) ran blocking and handed back a
    # finished handle, where all_reduce gives the backend's: its wait() waits for the devices)
    from collectives.backends.cupy.work import DeviceWork

    values = on_devices([np.ones(4, np.float32)] * 2, [0, 0])
    handle = collectives.batch_all_reduce([values], async_op=True)
    assert isinstance(handle, DeviceWork)
    assert [host(v).tolist() for v in handle.wait()[0]] == [[2.0] * 4] * 2


@pytest.mark.parametrize("devices, error, words", [
    ([1.5, 0], TypeError, "holds 1.5"), ([True, 0], TypeError, "holds True"),
    ([0, 64], ValueError, "names GPU 64"), ([], ValueError, "names no device")])
def test_broadcasts_device_ids_are_checked(devices, error, words):
    # (int() took 1.5 as GPU 1 and True as GPU 1; GPU 64 raised CUDA's own error)
    with pytest.raises(error, match=words):
        collectives.broadcast(on_devices([np.ones(3)], [0])[0], devices)


@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs; this machine shows fewer")
def test_a_broadcast_to_a_list_of_gpus_puts_a_copy_on_each():
    # (through collectives.broadcast, the backend's own function: a list was taken as a
    # count, every copy on the value's GPU)
    results = collectives.broadcast(on_devices([np.arange(3.0)], [0])[0], [1, 0])
    assert [int(r.device.id) for r in results] == [1, 0]
    assert all(host(r).tolist() == [0.0, 1.0, 2.0] for r in results)
