"""Shared test helpers: exact inputs, the float64 reference, the parameter axes."""

from __future__ import annotations

import numpy as np
import pytest

from collectives.ops import ReduceOp, check_dtype, result_dtype, supported_dtypes

ALGORITHMS = ["one_device", "ring", "rechd", "tree", "shuffle", "auto"]
TF_NAMES = ["xring", "pscpu", "psgpu", "nccl"]
TWO_LEVEL = ["pscpu/pscpu", "nccl/xring", "nccl/rechd", "nccl/pscpu", "tree/ring", "rechd/tree"]
RANKS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16]
OPS = list(ReduceOp)
DTYPES = supported_dtypes()
SIZES = [0, 1, 7, 1000]


def combos(dtypes=DTYPES, ops=OPS):
    """Every (dtype, op) pair the library accepts."""
    out = []
    for dtype in dtypes:
        for op in ops:
            try:
                check_dtype(op, dtype)
            except TypeError:
                continue
            out.append((np.dtype(dtype), op))
    return out


def exact_inputs(n: int, count: int, dtype, op: ReduceOp, seed: int = 0) -> list[np.ndarray]:
    """Small integers whose reduction is exact in every dtype and in any order.

    Sums stay below 64 (exact in int8, float16, bfloat16); products are of +-1 and at most
    one 2 per position, so they never overflow.
    """
    i = np.arange(count)
    dtype = np.dtype(dtype)
    out = []
    for p in range(n):
        if dtype.kind == "b":
            x = ((i * 3 + p + seed) % 3 == 0)
        elif op.wire_op is ReduceOp.PROD:
            x = np.where((i + p + seed) % (n + 1) == 0, 2, 1)
            if dtype.kind in "fic":
                x = x * np.where((i * 5 + p) % 3 == 0, -1, 1)
        elif op in (ReduceOp.MAX, ReduceOp.MIN):
            x = (i * 7 + p * 3 + seed) % 11
            if dtype.kind in "fic":
                x = x - 5
        else:
            x = (i * 5 + p * 3 + seed) % 4
        x = np.asarray(x)
        if dtype.kind == "c":
            x = x + 1j * ((i + p) % 3 if op.wire_op is not ReduceOp.PROD else 0)
        out.append(x.astype(dtype))
    return out


def reference(values: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    """The float64 (complex128, bool) NumPy reduction of ``values``, cast to the result dtype."""
    dtype = np.dtype(values[0].dtype)
    wide = np.complex128 if dtype.kind == "c" else (np.bool_ if dtype.kind == "b" else np.float64)
    stack = np.stack([v.astype(wide) for v in values])
    if op is ReduceOp.SUM:
        total = stack.sum(axis=0)
    elif op is ReduceOp.MEAN:
        total = stack.sum(axis=0) / len(values)
    elif op is ReduceOp.PROD:
        total = stack.prod(axis=0)
    elif op is ReduceOp.MAX:
        total = stack.max(axis=0)
    else:
        total = stack.min(axis=0)
    return total.astype(result_dtype(op, dtype))


def assert_reduced(result: np.ndarray, expected: np.ndarray, op: ReduceOp) -> None:
    assert result.dtype == expected.dtype, (result.dtype, expected.dtype)
    assert result.shape == expected.shape, (result.shape, expected.shape)
    if op is ReduceOp.MEAN and expected.dtype.kind in "fc":
        # one correctly rounded division of an exact sum (float16/bfloat16 may round twice)
        tol = 1e-2 if expected.dtype.itemsize <= 2 else 1e-6
        np.testing.assert_allclose(result.astype(np.complex128), expected.astype(np.complex128),
                                   rtol=tol, atol=0)
    else:
        np.testing.assert_array_equal(result, expected)


def assert_identical(results: list[np.ndarray]) -> None:
    """Bitwise identical across participants."""
    first = np.ascontiguousarray(results[0]).view(np.uint8)
    for r in results[1:]:
        assert np.array_equal(np.ascontiguousarray(r).view(np.uint8), first)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
