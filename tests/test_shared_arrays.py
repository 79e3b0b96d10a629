"""``Communicator.shared_empty`` on thread ranks (which share one process's memory: an ordinary
array) and its agreement: bad arguments on one rank raise there and ``PeerFailedError`` on the
others, a rank in another collective makes every rank raise ``CollectiveMismatchError``.
Under ``mpiexec`` (MPI shared windows, the all-reduce through them) it runs in
``tests/mpi_scenarios/shm_rounds.py``."""

from __future__ import annotations

import numpy as np
import pytest

import collectives
from collectives.errors import CollectiveMismatchError, PeerFailedError


@pytest.mark.parametrize("shape, dtype, want", [
    (5, np.float32, (5,)), ((2, 3), "int64", (2, 3)), ((), np.float64, ()), ((0, 4), np.int8, (0, 4)),
    (np.int64(3), np.float16, (3,)),
])
def test_shared_empty_is_zeroed_and_all_reduces(shape, dtype, want):
    def body(comm):
        x = comm.shared_empty(shape, dtype)
        assert x.shape == want and x.dtype == np.dtype(dtype) and x.flags.c_contiguous
        assert x.flags.writeable and not x.any()
        x[...] = comm.rank + 1
        got = comm.all_reduce(x, out=x)
        assert got is x
        return x.copy()

    results = collectives.run(body, 3, timeout=20)
    for got in results:
        np.testing.assert_array_equal(got, np.full(want, 6, dtype))


@pytest.mark.parametrize("shape, dtype, error, words", [
    (-1, np.float32, ValueError, "shape=-1 has a negative dimension"),
    ("3", np.float32, TypeError, "shape='3' holds a non-integer"),
    ((2.5,), np.float32, TypeError, "holds a non-integer"),
    (None, np.float32, TypeError, "shape=None is not a shape"),
    (3, object, TypeError, "dtype has dtype object"),
    (3, "not a dtype", TypeError, "dtype='not a dtype' is not a NumPy dtype"),
])
def test_a_bad_argument_on_one_rank_raises_there_and_names_it_on_the_others(shape, dtype, error, words):
    def body(comm):
        try:
            if comm.rank == 1:
                comm.shared_empty(shape, dtype)
            else:
                comm.shared_empty(3, np.float32)
        except Exception as exc:  # noqa: BLE001 - each rank's error is what the test checks
            return exc
        return None

    errors = collectives.run(body, 3, timeout=20)
    assert isinstance(errors[1], error) and words in str(errors[1]), errors[1]
    for peer in (0, 2):
        assert isinstance(errors[peer], PeerFailedError) and "rank 1" in str(errors[peer])


def test_a_rank_in_another_collective_is_a_mismatch_on_every_rank():
    def body(comm):
        try:
            if comm.rank == 0:
                comm.all_reduce(np.ones(3))
            else:
                comm.shared_empty(3)
        except CollectiveMismatchError as exc:
            return str(exc)
        return None

    for message in collectives.run(body, 2, timeout=20):
        assert message is not None and "shared_empty" in message
