"""The multi-device API over CuPy arrays, on a real GPU: 2, 3 and 4 logical devices sharing
one GPU, every algorithm, collective, op and dtype, sizes 0, 1, a prime and 64 MiB, bitwise
equal to the NumPy backend running the same algorithm (and to the float64 reference); NCCL
over one device; several GPUs where there are several. Skipped, with the reason, where CuPy
or a GPU is missing."""

from __future__ import annotations

import numpy as np
import pytest
from gpukit import (
    STAND_IN,
    STAND_IN_GAP,
    host,
    is_bfloat16,
    needs_gpu,
    needs_gpus,
    on_devices,
    same_bits,
)

import collectives
from collectives import algorithms
from collectives.algorithms.schedule import Collective
from collectives.ops import BFLOAT16, ReduceOp, check_dtype
from collectives.tools.reference import exact_inputs, expected_outputs, random_inputs

pytestmark = needs_gpu

ALGORITHMS = ["one_device", "ring", "rechd", "tree", "shuffle", "xring", "pscpu/pscpu"]
DTYPES = [np.bool_, np.int8, np.int16, np.uint32, np.int64, np.float16, np.float32,
          np.float64, np.complex64, np.complex128] + ([BFLOAT16] if BFLOAT16 is not None else [])
FLOATS = [np.dtype(d) for d in (np.float16, np.float32, np.float64)] + (
    [BFLOAT16] if BFLOAT16 is not None else [])
SIZES = [0, 1, 1009]


def pairs():
    out = []
    for dtype in DTYPES:
        for op in ReduceOp:
            try:
                check_dtype(op, np.dtype(dtype))
            except TypeError:
                continue
            out.append((np.dtype(dtype), op))
    return out


def gpu():
    from collectives.backends import cupy as backend

    return backend


def run_both(collective: str, values: list, op: ReduceOp, algorithm: str, n: int, **kw):
    """The NumPy backend's results and the CuPy backend's (as host arrays)."""
    cpu_fn = getattr(collectives, collective)
    gpu_fn = getattr(gpu(), collective)
    devices = [0] * n
    if collective == "broadcast":
        cpu = cpu_fn(values[0], n, algorithm)
        out = gpu_fn(on_devices(values[:1], [0])[0], n, algorithm)
    elif collective == "all_gather":
        cpu = cpu_fn(values, 0, algorithm)
        out = gpu_fn(on_devices(values, devices), 0, algorithm)
    elif collective == "reduce":
        cpu = [cpu_fn(values, op, 0, algorithm, **kw)]
        out = [gpu_fn(on_devices(values, devices), op, 0, algorithm, **kw)]
    else:
        cpu = cpu_fn(values, op, algorithm, **kw)
        out = gpu_fn(on_devices(values, devices), op, algorithm, **kw)
    return cpu, [host(o) for o in out]


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("collective", ["all_reduce", "reduce", "reduce_scatter"])
def test_reductions_match_numpy_bit_for_bit(collective, algorithm, n):
    # (the core's reduce_scatter takes no groups: its two-level form spans one group)
    kw = {"groups": 2} if "/" in algorithm and collective != "reduce_scatter" else {}
    for dtype, op in pairs():
        for count in SIZES:
            rows = count * n if collective == "reduce_scatter" else count
            values = exact_inputs(n, rows, dtype, op)
            before = [v.copy() for v in values]
            cpu, got = run_both(collective, values, op, algorithm, n, **kw)
            for c, g in zip(cpu, got):
                assert same_bits(c, g), (collective, algorithm, n, dtype, op, count)
            expected = [e for e in expected_outputs(collective, values, op) if e is not None]
            if op is not ReduceOp.MEAN:
                for e, g in zip(expected, got):
                    assert same_bits(e, g), (collective, algorithm, dtype, op, count)
            for v, b in zip(values, before):
                assert same_bits(v, b)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_auto_on_one_gpu_reads_every_input_in_one_kernel(n, monkeypatch):
    """Logical devices sharing one GPU: ``auto`` reduces every input in one kernel
    (backends/cupy/one_gpu.py), left to right as one_device does: bitwise the NumPy backend's
    one_device, into new arrays, into out= and in place; inputs untouched but in place."""
    from collectives.backends.cupy import one_gpu

    runs = []
    real = one_gpu.all_reduce
    monkeypatch.setattr(one_gpu, "all_reduce", lambda *a: runs.append(1) or real(*a))
    for dtype, op in pairs():
        if STAND_IN and is_bfloat16(dtype):
            continue  # (STAND_IN_GAP)
        for count in SIZES:
            values = exact_inputs(n, count, dtype, op)
            cpu = collectives.all_reduce(values, op, "one_device")
            got = gpu().all_reduce(on_devices(values, [0] * n), op, "auto")
            assert all(same_bits(c, host(g)) for c, g in zip(cpu, got)), (dtype, op, count)
            inputs = on_devices(values, [0] * n)
            outs = on_devices([np.zeros_like(c) for c in cpu], [0] * n)
            filled = gpu().all_reduce(inputs, op, "auto", out=outs)
            assert all(f is o for f, o in zip(filled, outs))
            assert all(same_bits(c, host(o)) for c, o in zip(cpu, outs)), (dtype, op)
            assert all(same_bits(v, host(i)) for v, i in zip(values, inputs))
            if cpu[0].dtype == values[0].dtype:  # (integer MEAN returns float64)
                gpu().all_reduce(inputs, op, "auto", out=inputs)
                assert all(same_bits(c, host(i)) for c, i in zip(cpu, inputs)), (dtype, op)
    assert len(runs) >= 2 * len(pairs()) * len(SIZES)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("algorithm", ["one_device", "ring", "rechd", "tree", "shuffle"])
def test_moves_match_numpy(algorithm, n):
    # each collective with the algorithms that have it (rechd has no broadcast)
    collectives_here = [c for c in ("broadcast", "all_gather")
                        if algorithms.supports(Collective(c), algorithm)]
    assert collectives_here
    for dtype in DTYPES:
        for count in SIZES:
            values = exact_inputs(n, count, dtype, ReduceOp.SUM)
            for collective in collectives_here:
                cpu, got = run_both(collective, values, ReduceOp.SUM, algorithm, n)
                assert all(same_bits(c, g) for c, g in zip(cpu, got)), (collective, dtype)


@pytest.mark.parametrize("algorithm", ["ring", "rechd", "tree", "shuffle", "one_device"])
def test_rounded_sums_follow_the_same_order(algorithm):
    # random floats round: only the same order of additions gives the same bits
    values = random_inputs(3, 100_003, np.float32, seed=5)
    cpu, got = run_both("all_reduce", values, ReduceOp.SUM, algorithm, 3)
    assert all(same_bits(c, g) for c, g in zip(cpu, got))
    assert all(same_bits(got[0], g) for g in got)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ring", "rechd", "auto"])
def test_64_mib(algorithm):
    count = (64 << 20) // 4
    values = exact_inputs(4, count, np.float32, ReduceOp.SUM)
    cpu, got = run_both("all_reduce", values, ReduceOp.SUM, algorithm if algorithm != "auto"
                        else "ring", 4)
    assert all(same_bits(c, g) for c, g in zip(cpu, got))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_nan_propagates_through_max_and_min(dtype):
    if STAND_IN and is_bfloat16(dtype):
        pytest.skip(STAND_IN_GAP)
    n = 3
    values = [np.arange(10).astype(dtype) for _ in range(n)]
    values[0][4] = np.nan  # the first operand: a kernel that drops a NaN accumulator fails
    values[1][6] = np.nan
    for op in ("max", "min"):
        for algorithm in ("ring", "rechd", "tree", "shuffle", "one_device"):
            out = gpu().all_reduce(on_devices(values, [0] * n), op, algorithm)
            for o in out:
                got = host(o).astype(np.float32)
                assert np.isnan(got[4]) and np.isnan(got[6]), (op, algorithm, got)


def test_nccl_over_one_device():
    for dtype, op in pairs():
        if STAND_IN and is_bfloat16(dtype):
            continue  # (STAND_IN_GAP)
        values = exact_inputs(1, 1009, dtype, op)
        got = host(gpu().all_reduce(on_devices(values, [0]), op, "nccl")[0])
        cpu = collectives.all_reduce(values, op, "ring")[0]
        assert same_bits(cpu, got), (dtype, op)
    x = np.arange(8, dtype=np.float64)
    x[3] = np.nan
    for op in ("max", "min"):
        assert np.isnan(host(gpu().all_reduce(on_devices([x], [0]), op, "nccl")[0])[3])


def test_explicit_nccl_on_one_gpu_names_it_and_auto_does_not():
    values = on_devices(exact_inputs(2, 16, np.float32), [0, 0])
    with pytest.raises(ValueError, match=r"values\[0\] and values\[1\] are both on GPU 0"):
        gpu().all_reduce(values, "sum", "nccl")
    assert host(gpu().all_reduce(values, "sum", "auto")[1]).sum() > 0


def test_core_api_routes_cupy_arrays_and_async_handles_wait():
    import cupy

    values = on_devices(exact_inputs(4, 1000, np.float32), [0] * 4)
    expected = collectives.all_reduce(exact_inputs(4, 1000, np.float32), "sum", "ring")
    assert all(isinstance(r, cupy.ndarray) for r in collectives.all_reduce(values, "sum"))
    handle = gpu().all_reduce(values, "sum", "ring", async_op=True)
    for bad in (-1, float("nan"), "soon", True, 10 ** 400):  # checked first, as every wait's
        with pytest.raises((TypeError, ValueError), match="timeout"):
            handle.wait(timeout=bad)
    results = handle.wait(timeout=60)
    assert handle.is_completed()
    assert all(same_bits(e, host(r)) for e, r in zip(expected, results))
    with pytest.raises(TypeError, match="mixed|NumPy"):
        gpu().all_reduce([values[0], np.zeros(1000, np.float32)])


def test_batch_all_reduce():
    n = 3
    lists = [exact_inputs(n, c, np.float32) for c in (5, 0, 70, 1)]
    cpu = collectives.batch_all_reduce(lists, "sum", "ring", num_packs=2)
    got = gpu().batch_all_reduce([on_devices(v, [0] * n) for v in lists], "sum", "ring",
                                 num_packs=2)
    for c, g in zip(cpu, got):
        assert all(same_bits(a, host(b)) for a, b in zip(c, g))


@pytest.mark.parametrize("n", [1, 2, 4])
def test_fused_batch_gives_views_of_its_buckets(n):
    """The default batch fuses tensors into buckets and hands back views of the reduced
    buckets (CuPy arrays made on the bucket's memory): shapes of every rank, empty ones
    included, bitwise the NumPy backend's."""
    shapes = [(3, 5), (0,), (7,), (2, 3, 4, 1), (1,), (0, 3), (11, 13)]
    lists = [exact_inputs(n, int(np.prod(s)), np.float32) for s in shapes]
    lists = [[v.reshape(s) for v in values] for values, s in zip(lists, shapes)]
    cpu = collectives.batch_all_reduce(lists, "sum")
    got = gpu().batch_all_reduce([on_devices(v, [0] * n) for v in lists], "sum")
    for values, c, g in zip(lists, cpu, got):
        assert [r.shape for r in g] == [v.shape for v in values]
        assert all(same_bits(a, host(b)) for a, b in zip(c, g))


def test_each_request_goes_to_its_runner_and_explain_says_why():
    """The CuPy backend's runners (backends/cupy/runners.py): the first that takes a call
    runs it, and explain names it and why each before it was skipped."""
    import cupy
    from collectives.backends.cupy import runners

    values = on_devices(exact_inputs(4, 1009, np.float32), [0] * 4)
    text = runners.explain(values, "sum", "auto")
    assert "runs on the one_gpu runner" in text, text
    text = runners.explain(values, "sum", "ring")
    assert "runs on the library runner" in text and "one_gpu skipped: not auto" in text, text
    text = runners.explain(values, "sum", "auto", collective="reduce")
    assert "runs on the library runner" in text and "nccl skipped" in text, text
    n = cupy.cuda.runtime.getDeviceCount()
    if n >= 2:  # distinct GPUs: NCCL
        spread = on_devices(exact_inputs(n, 1009, np.float32), list(range(n)))
        assert "runs on the nccl runner" in runners.explain(spread, "sum", "auto")
    with pytest.raises(ValueError, match="GPU"):  # asked for by name, and it cannot run
        runners.explain(values, "sum", "nccl")
    cpu = collectives.all_reduce(exact_inputs(4, 1009, np.float32), "sum", "one_device")
    got = gpu().all_reduce(values, "sum", "auto")
    assert all(same_bits(c, host(g)) for c, g in zip(cpu, got))


def test_batch_of_numpy_and_cupy_arrays_is_refused_naming_the_array():
    """A batch is packed in one library: a CuPy array among NumPy ones raises before any
    data moves, naming it (the buckets would otherwise mix memories)."""
    lists = [exact_inputs(2, c, np.float32) for c in (5, 7)]
    mixed = [lists[0], on_devices(lists[1], [0, 0])]
    with pytest.raises(TypeError, match=r"value_lists\[1\]\[0\].*one library"):
        collectives.batch_all_reduce(mixed)


@needs_gpus
@pytest.mark.parametrize("algorithm", ["ring", "rechd", "nccl", "auto", "nccl/xring"])
def test_several_gpus(algorithm):
    import cupy

    n = cupy.cuda.runtime.getDeviceCount()
    for dtype, op in pairs():
        if STAND_IN and is_bfloat16(dtype) and ("nccl" in algorithm or algorithm == "auto"):
            continue  # (STAND_IN_GAP)
        values = exact_inputs(n, 1009, dtype, op)
        got = gpu().all_reduce(on_devices(values, list(range(n))), op, algorithm,
                               groups=2 if "/" in algorithm else None)
        assert [g.device.id for g in got] == list(range(n))
        cpu = collectives.all_reduce(values, op, "ring")
        for c, g in zip(cpu, got):
            if op is ReduceOp.MEAN or algorithm.startswith("nccl") or algorithm == "auto":
                np.testing.assert_array_equal(c, host(g))  # NCCL's order is its own
            else:
                assert same_bits(c, host(g))


@needs_gpus
@pytest.mark.parametrize("layout", [[[0, 1], [1, 0]], [[0, 1], [0, 0]], [[0, 0], [0, 1]]])
def test_a_batch_whose_tensors_list_their_gpus_in_other_orders_is_refused(layout):
    """Device d's arrays are fused there: they must share its GPU. (They were packed under
    the first array's GPU: results on the wrong GPUs, and kernels reading across GPUs.)"""
    lists = [on_devices(exact_inputs(2, c, np.float32), devices)
             for c, devices in zip((5, 7), layout)]
    for batch in (collectives.batch_all_reduce, gpu().batch_all_reduce):
        with pytest.raises(ValueError, match=r"value_lists\[1\]\[[01]\] is on (device|GPU)"):
            batch(lists, "sum", "ring")


@needs_gpus
@pytest.mark.parametrize("algorithm", ["nccl", "ring", "auto"])
def test_an_out_off_its_inputs_gpu_is_refused_naming_it(algorithm):
    """(NCCL's reduce named a single out "out[0]" and the root "values[0]"; the library's
    algorithms took an out on another GPU and copied there)"""
    values = on_devices(exact_inputs(2, 4, np.float32), [0, 1])
    wrong = on_devices([np.zeros(4, np.float32)], [0])[0]
    with pytest.raises(ValueError, match=r"^out is on (GPU|device) 0 but the root's value, "
                                         r"values\[1\], on (GPU|device) 1"):
        gpu().reduce(values, "sum", 1, algorithm, out=wrong)
    swapped = on_devices([np.zeros(4, np.float32)] * 2, [1, 0])
    with pytest.raises(ValueError, match=r"out\[0\] is on (GPU|device) 1 but values\[0\]"):
        gpu().all_reduce(values, "sum", algorithm, out=swapped)


@needs_gpus
def test_nccl_names_the_arrays_of_a_group_that_share_a_gpu():
    """(the indices were positions within the group: values[0] and values[1] for the second
    group's two)"""
    values = on_devices(exact_inputs(4, 8, np.float32), [0, 1, 1, 1])
    with pytest.raises(ValueError, match=r"values\[2\] and values\[3\] are both on GPU 1"):
        gpu().all_reduce(values, "sum", "nccl/xring", groups=[[0, 1], [2, 3]])
    x = on_devices([np.ones(4, np.float32)], [0])[0]
    with pytest.raises(ValueError, match=r"devices\[0\] and devices\[1\] are both on GPU 1"):
        gpu().broadcast(x, devices=[1, 1], algorithm="nccl")
    with pytest.raises(TypeError, match="devices='01' is text"):
        gpu().broadcast(x, devices="01")


def test_nccl_cliques_are_made_per_device_order_and_freed():
    import cupy
    from collectives.backends.cupy import free_communicators

    free_communicators()
    ids = list(range(min(2, cupy.cuda.runtime.getDeviceCount())))
    values = exact_inputs(len(ids), 64, np.float32)
    orders = [ids, ids[::-1]] if len(ids) > 1 else [ids]
    for order in orders:
        got = gpu().all_gather(on_devices(values, order), 0, "nccl")
        assert all(same_bits(np.concatenate(values), host(g)) for g in got)
    assert free_communicators() == len(orders)
    assert free_communicators() == 0
    got = gpu().all_reduce(on_devices(values, ids), "sum", "nccl")  # made again
    assert same_bits(host(got[0]), sum(values))
