"""The multi-device API against the float64 reference: algorithm x devices x op x dtype x size."""

from __future__ import annotations

import functools

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from conftest import (
    ALGORITHMS,
    DTYPES,
    RANKS,
    SIZES,
    TF_NAMES,
    TWO_LEVEL,
    assert_identical,
    assert_reduced,
    combos,
    exact_inputs,
    reference,
)
from hypothesis import given, settings

import collectives
from collectives import ReduceOp

PAIRS = combos()


# Inputs of up to this many elements (and their reference) are made once per module: every
# algorithm of a matrix reads the same (devices, count, dtype, op) cases. Larger ones (several
# MiB per device) are made per call, so the module does not hold hundreds of MB.
CACHED_COUNT = 1 << 16


@functools.cache
def _pristine(n, count, dtype, op):
    values = exact_inputs(n, count, dtype, op)
    return values, reference(values, op)


@pytest.fixture(scope="module", autouse=True)
def _drop_pristine():
    yield
    _pristine.cache_clear()


def _check_all_reduce(n, algorithm, pairs, sizes, **kw):
    for dtype, op in pairs:
        for count in sizes:
            if count <= CACHED_COUNT:
                before, expected = _pristine(n, count, np.dtype(dtype), op)
                values = [b.copy() for b in before]  # the call's own: the cache stays intact
            else:
                values = exact_inputs(n, count, dtype, op)
                before, expected = [v.copy() for v in values], None
            results = collectives.all_reduce(values, op, algorithm, **kw)
            if expected is None:
                expected = reference(before, op)
            assert len(results) == n
            assert_identical(results)  # so the first is right only if every one is
            assert_reduced(results[0], expected, op)
            for v, b in zip(values, before):
                if not np.array_equal(v, b):  # inputs untouched (the quick test first)
                    np.testing.assert_array_equal(v, b)


@pytest.mark.slow
@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_all_reduce_matrix(algorithm, n):
    _check_all_reduce(n, algorithm, PAIRS, SIZES)


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3, 4, 7])
@pytest.mark.parametrize("algorithm", TF_NAMES + TWO_LEVEL)
@pytest.mark.parametrize("groups", [None, 2, 3])
def test_all_reduce_tensorflow_names_and_two_level(algorithm, n, groups):
    pairs = combos(dtypes=[np.float32, np.int32, np.float16])
    _check_all_reduce(n, algorithm, pairs, [0, 1, 13, 4099], groups=groups)


@pytest.mark.parametrize("shards", [1, 2, 3])
@pytest.mark.parametrize("algorithm", ["ring", "shuffle", "pscpu/pscpu", "nccl/xring"])
def test_shards(algorithm, shards):
    _check_all_reduce(4, algorithm, combos(dtypes=[np.float32]), [0, 5, 1001], shards=shards,
                      groups=2)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ring", "rechd", "one_device", "shuffle", "tree"])
def test_large_buffers_run_in_parallel_tiles(algorithm):
    # Several MiB per device, so the embedded backend splits work over tiles and threads.
    _check_all_reduce(5, algorithm, [(np.dtype(np.float32), ReduceOp.SUM),
                                     (np.dtype(np.float64), ReduceOp.MAX)], [1 << 20, 3_000_017])


def test_random_floats_identical_everywhere(rng):
    # Non-associative arithmetic: every device must still hold the same bits.
    for algorithm in ["ring", "rechd", "tree", "shuffle", "one_device", "nccl/xring"]:
        values = [rng.standard_normal(100_003).astype(np.float32) for _ in range(6)]
        results = collectives.all_reduce(values, "sum", algorithm, groups=3)
        assert_identical(results)
        np.testing.assert_allclose(results[0], np.sum(values, axis=0, dtype=np.float64),
                                   rtol=1e-5, atol=1e-4)



def test_accumulation_fn_is_used():
    calls = []

    def add_n(arrays):
        calls.append(len(arrays))
        return np.sum(np.stack(arrays), axis=0)

    values = exact_inputs(4, 10, np.float32, ReduceOp.SUM)
    results = collectives.all_reduce(values, "sum", "one_device", accumulation_fn=add_n)
    np.testing.assert_array_equal(results[2], reference(values, ReduceOp.SUM))
    assert calls == [4]


def test_multidimensional_and_noncontiguous_inputs():
    base = [np.arange(24, dtype=np.float64).reshape(4, 6) * (i + 1) for i in range(3)]
    views = [b[:, ::2] for b in base]  # not contiguous: read, never written
    results = collectives.all_reduce(views, "max", "ring")
    np.testing.assert_array_equal(results[0], views[2])
    assert results[0].shape == (4, 3)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("algorithm", ALGORITHMS + ["pscpu/pscpu", "nccl/rechd"])
def test_reduce(algorithm, n):
    for dtype, op in combos(dtypes=[np.float32, np.int64, np.uint8, np.complex64, np.bool_]):
        for root in sorted({0, n - 1, n // 2}):
            values = exact_inputs(n, 257, dtype, op)
            result = collectives.reduce(values, op, root, algorithm, groups=2)
            assert_reduced(result, reference(values, op), op)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("algorithm", ["one_device", "ring", "tree", "shuffle", "auto"])
def test_broadcast(algorithm, n):
    for dtype in DTYPES:
        value = exact_inputs(1, 301, dtype, ReduceOp.SUM)[0].reshape(7, 43)
        before = value.copy()
        results = collectives.broadcast(value, n, algorithm)
        assert len(results) == n
        for r in results:
            assert r is not value
            np.testing.assert_array_equal(r, value)
        np.testing.assert_array_equal(value, before)




@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("algorithm", ["one_device", "ring", "rechd", "tree", "shuffle", "auto"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_all_gather(algorithm, n, axis):
    values = [np.arange(12, dtype=np.int16).reshape(3, 4) + 100 * p for p in range(n)]
    results = collectives.all_gather(values, axis=axis, algorithm=algorithm)
    expected = np.concatenate(values, axis=axis)
    for r in results:
        np.testing.assert_array_equal(r, expected)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("rows", [0, 1, 5, 16, 33])
def test_reduce_scatter(algorithm, n, rows):
    for dtype, op in combos(dtypes=[np.float32, np.int32]):
        values = [v.reshape(rows, 3) for v in exact_inputs(n, rows * 3, dtype, op)]
        results = collectives.reduce_scatter(values, op, algorithm)
        expected = reference(values, op)
        for i, r in enumerate(results):
            assert_reduced(r, expected[i * rows // n:(i + 1) * rows // n], op)


def test_batch_all_reduce_keeps_order_and_shapes():
    shapes = [(3, 2), (), (0,), (70,), (5, 5, 2), (1,)]
    dtypes = [np.float32, np.float32, np.float64, np.float32, np.int32, np.float32]
    n = 4
    value_lists = [[(np.arange(int(np.prod(s))).reshape(s) % 5 + d).astype(t) for d in range(n)]
                   for s, t in zip(shapes, dtypes)]
    specs = ["pscpu:8:pscpu#2:64:xring", [("tree", 1, 10), ("ring", 2, -1)], ("rechd",),
             "nccl/xring", "auto"]
    for spec in specs:
        for knobs in [{}, {"num_packs": 2}, {"agg_small_grads_max_bytes": 64,
                                             "agg_small_grads_max_group": 2},
                      {"bytes_per_pack": 100}]:
            results = collectives.batch_all_reduce(value_lists, "sum", spec, groups=2, **knobs)
            assert len(results) == len(shapes)
            for k, per_device in enumerate(results):
                expected = reference(value_lists[k], ReduceOp.SUM)
                for r in per_device:
                    assert_reduced(r, expected, ReduceOp.SUM)


@settings(max_examples=60, deadline=None)
@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9),
       n=st.integers(1, 9), algorithm=st.sampled_from(ALGORITHMS + TF_NAMES + TWO_LEVEL),
       op=st.sampled_from([ReduceOp.SUM, ReduceOp.MAX, ReduceOp.PROD, ReduceOp.MEAN]),
       group=st.integers(1, 4), data=st.data())
def test_random_shapes_both_ways(shape, n, algorithm, op, group, data):
    dtype = data.draw(st.sampled_from([np.float32, np.int64, np.float16]))
    values = [v.reshape(shape) for v in exact_inputs(n, int(np.prod(shape)), dtype, op)]
    expected = reference(values, op)
    multi = collectives.all_reduce(values, op, algorithm, groups=group)
    spmd = collectives.run(lambda comm: comm.all_reduce(values[comm.rank], op, algorithm,
                                                        groups=group), n)
    for r in multi + spmd:
        assert_reduced(r, expected, op)
    assert_identical(multi + spmd)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 9])
@pytest.mark.parametrize("op", list(ReduceOp))
def test_batch_all_reduce_fuses_by_default(n, op):
    """Defaults fuse each dtype's tensors into one bucket (results are views of it) with the
    per-tensor all-reduce's bits (exact inputs); ``bucket_bytes=0`` fuses nothing; a tensor
    of a bucket's size or more travels alone."""
    shapes = [(3, 2), (0,), (7,), (1,), (101,), (2, 2)]
    dtypes = [np.float32, np.float32, np.float64, np.float32, np.float32, np.float64]
    value_lists = [exact_inputs(n, int(np.prod(s)), t, op, seed=k, shape=s)
                   for k, (s, t) in enumerate(zip(shapes, dtypes))]
    copies = [[v.copy() for v in values] for values in value_lists]
    each = [collectives.all_reduce(values, op) for values in value_lists]
    fused = collectives.batch_all_reduce(value_lists, op)
    alone = collectives.batch_all_reduce(value_lists, op, bucket_bytes=0)
    small = collectives.batch_all_reduce(value_lists, op, bucket_bytes=400)  # 101 floats: alone
    for k in range(len(shapes)):
        for d in range(n):
            for got in (fused, alone, small):
                assert got[k][d].tobytes() == each[k][d].tobytes() and got[k][d].shape == shapes[k]
            assert np.array_equal(value_lists[k][d], copies[k][d])
    f32 = [k for k, t in enumerate(dtypes) if t == np.float32 and np.prod(shapes[k])]
    def bucket(x):  # the buffer a result is a view of
        return x.base if x.base is not None else x

    assert all(bucket(fused[f32[0]][0]) is bucket(fused[k][0]) for k in f32)
    assert bucket(alone[0][0]) is not bucket(alone[3][0])
    assert bucket(small[4][0]) is not bucket(small[0][0])
    assert bucket(small[0][0]) is bucket(small[3][0])


def test_a_large_host_tensor_is_not_copied_into_a_bucket():
    """In host memory a tensor of HOST_ALONE_BYTES or more travels alone (its copy would cost
    more than its call); the small ones around it still share one bucket."""
    from collectives.arrays import HOST_ALONE_BYTES

    big = HOST_ALONE_BYTES // 4
    value_lists = [[np.full(s, float(d + 1), np.float32) for d in range(2)]
                   for s in (3, big, 5)]
    got = collectives.batch_all_reduce(value_lists)
    assert all(float(r[0][0]) == 3.0 for r in got)
    owner = [r[0].base if r[0].base is not None else r[0] for r in got]
    assert owner[0] is owner[2] and owner[1] is not owner[0]
    assert got[1][0].size == big


def test_a_numpy_scalar_beside_a_0d_array_is_numpy_too():
    # (one library, two types: refused as "not the same kind of array" for a day)
    got = collectives.all_reduce([np.ones(()), np.float64(2.0)])
    assert [float(g) for g in got] == [3.0, 3.0]
