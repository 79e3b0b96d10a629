"""Multi-device results: where they land (``out=``, in place, one array for every device, outs
that overlap the values or one another) and in which dtype (an integer MEAN's float64), on the
library's algorithms over NumPy devices."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import exact_inputs, reference

import collectives
from collectives import ReduceOp


def test_out_and_in_place():
    values = exact_inputs(4, 1000, np.float32, ReduceOp.SUM)
    expected = reference(values, ReduceOp.SUM)
    out = [np.empty(1000, np.float32) for _ in range(4)]
    results = collectives.all_reduce(values, out=out)
    assert all(r is o for r, o in zip(results, out))
    results = collectives.all_reduce(values, "sum", "ring", out=values)  # in place, asked for
    for r, v in zip(results, values):
        assert r is v
        np.testing.assert_array_equal(v, expected)

@pytest.mark.parametrize("algorithm", ["one_device", "ring", "tree", "shuffle", "auto"])
def test_broadcast_into_outs_that_share_the_values_memory(algorithm):
    # (the work buffers were one for the value instead of one per device: an IndexError)
    value = np.arange(7.0)
    results = collectives.broadcast(value, 3, algorithm, out=[np.zeros(7), value, np.zeros(7)])
    assert results[1] is value and all(np.array_equal(r, np.arange(7.0)) for r in results)
    buffer = np.arange(8.0)
    first = buffer[1:]  # (overlaps the value, one element along)
    results = collectives.broadcast(buffer[:7], 2, algorithm, out=[first, np.zeros(7)])
    assert results[0] is first and all(np.array_equal(r, np.arange(7.0)) for r in results)

@pytest.mark.parametrize("algorithm", ["one_device", "ring", "tree", "auto"])
def test_outs_that_overlap_one_another_are_refused(algorithm):
    # (filled one after another: the last written won where they overlapped, so devices'
    # results differed, silently; a reduce-scatter given one array for every device returned
    # the last block on each)
    values = [np.arange(6.0), np.arange(6.0) + 10]
    calls = {
        "all_reduce": lambda out: collectives.all_reduce(values, "sum", algorithm, out=out),
        "broadcast": lambda out: collectives.broadcast(values[0], 2, algorithm, out=out),
    }
    for name, call in calls.items():
        buffer = np.zeros(18)
        with pytest.raises(ValueError, match=r"out\[1\] shares memory with out\[0\]"):
            call([buffer[0:6], buffer[3:9]])
        assert not buffer.any(), name  # (refused before anything was written)
        shared = np.empty(6)  # (one array for every device: each takes the same result)
        results = call([shared, shared])
        assert results[0] is shared and np.array_equal(shared, results[1])
        results = call([buffer[0:6], buffer[0:6]])  # (the same view, twice: the same)
        assert np.array_equal(results[0], results[1])
    gathered = np.zeros(18)
    with pytest.raises(ValueError, match="shares memory"):
        collectives.all_gather(values, algorithm=algorithm, out=[gathered[0:12], gathered[6:18]])
    rows = [np.arange(6.0) + 10 * d for d in range(3)]
    one = np.zeros(2)
    with pytest.raises(ValueError, match=r"out\[1\] shares memory with out\[0\]"):
        collectives.reduce_scatter(rows, "sum", algorithm, out=[one] * 3)
    got = collectives.reduce_scatter(rows, "sum", algorithm, out=[np.zeros(2) for _ in range(3)])
    assert [list(g) for g in got] == [[30, 33], [36, 39], [42, 45]]

@pytest.mark.parametrize("algorithm", ["one_device", "ring", "tree", "shuffle", "auto"])
def test_an_integer_mean_sums_in_float64(algorithm):
    # (summed in the input's dtype first: three devices' uint8 200s wrapped to 88, a "mean"
    # of 29.33; as numpy.mean, the library now sums integers in float64)
    values = [np.array([200, 7, 255], np.uint8) for _ in range(3)]
    before = [v.copy() for v in values]
    want = np.mean(np.stack(values), axis=0)
    for got in collectives.all_reduce(values, "mean", algorithm):
        assert got.dtype == np.float64 and np.array_equal(got, want)
    assert np.array_equal(collectives.reduce(values, "mean", 1, algorithm), want)
    rows = [np.array([200, 250, 7], np.uint8) + np.uint8(d) for d in range(3)]
    blocks = collectives.reduce_scatter(rows, "mean", algorithm)
    assert [b.tolist() for b in blocks] == [[201.0], [251.0], [8.0]]
    batch = collectives.batch_all_reduce([values, [np.full(2, 2**31 - 1, np.int32)] * 3], "mean",
                                         algorithm)
    assert np.array_equal(batch[0][2], want) and batch[1][0].tolist() == [2**31 - 1] * 2
    assert all(np.array_equal(v, b) for v, b in zip(values, before))  # (inputs untouched)
