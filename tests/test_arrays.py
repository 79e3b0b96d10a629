"""The array backend: pooled results are reused only when nobody holds them; overlap checks."""

from __future__ import annotations

import gc

import numpy as np

from collectives.arrays import NUMPY, ResultPool
from collectives.overlap import any_overlap, overlaps, unsafe_outputs


def test_pool_reuses_a_buffer_only_after_every_view_is_gone():
    pool = ResultPool(min_bytes=0)
    first = pool.take(1024)
    view = first.view(np.float32)[10:20]
    del first
    gc.collect()
    second = pool.take(1024)
    assert not np.shares_memory(second, view)  # a view of the first still lives
    del view, second
    gc.collect()
    third = pool.take(1024)
    again = pool.take(1024)
    assert not np.shares_memory(third, again)  # the held one is never handed out twice


def test_pool_reuses_dropped_results_and_stays_bounded():
    pool = ResultPool(min_bytes=0, per_size=2, max_bytes=10_000)
    first = pool.take(4096)
    address = first.ctypes.data
    del first
    assert pool.take(4096).ctypes.data == address  # dropped: reused, no fresh pages
    for size in range(1000, 9000, 500):
        pool.take(size)
    assert pool.nbytes <= 10_000


def test_results_from_the_backend_are_independent_while_held():
    a = NUMPY.result((1000, 100), np.float64)
    b = NUMPY.result((1000, 100), np.float64)
    a[...] = 1
    b[...] = 2
    assert (a == 1).all() and (b == 2).all()


def test_overlap_checks():
    buf = np.arange(10.0)
    assert overlaps(NUMPY, buf[0:3], buf[2:5]) and not overlaps(NUMPY, buf[0:3], buf[3:5])
    assert any_overlap(NUMPY, [buf[0:2], np.zeros(3), buf[1:4]])
    assert not any_overlap(NUMPY, [buf[0:2], buf[2:4], np.zeros(0)])
    x = [np.zeros(4), np.zeros(4)]
    assert not unsafe_outputs(NUMPY, x, x)  # each output is its own input: in place
    assert unsafe_outputs(NUMPY, x, x[::-1])  # another device's input
    assert unsafe_outputs(NUMPY, x, [buf[:4], buf[:4]])  # one array as every output
    assert not unsafe_outputs(NUMPY, [x[0], x[0]], [np.zeros(4), np.zeros(4)])  # shared input
