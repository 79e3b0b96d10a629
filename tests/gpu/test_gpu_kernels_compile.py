"""Every kernel of the CuPy backend compiles with NVRTC, as CuPy compiles it, for every op,
dtype and form: NVRTC needs no GPU, so a kernel that would fail on a card fails here first.
Skipped, with the reason, where NVRTC or the CUDA headers are not installed."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from collectives.ops import BFLOAT16, ReduceOp, check_dtype

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cupy") is None,
                                reason="CuPy is not installed (pip install -e '.[cuda13]', "
                                       "or '.[cuda12]')")

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128] + (
    [BFLOAT16] if BFLOAT16 is not None else [])


@pytest.fixture(scope="module")
def nvrtc():
    from nvrtc import compile_source, elementwise_source, nvrtc_ready

    reason = nvrtc_ready()
    if reason is not None:
        pytest.skip(reason)
    return compile_source, elementwise_source


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_combine_and_divide_kernels_compile(nvrtc, dtype):
    from collectives.backends.cupy import kernels

    compile_source, source = nvrtc
    dtype = np.dtype(dtype)
    for op in (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN):
        try:
            check_dtype(op, dtype)
        except TypeError:
            continue
        for arity, into in ((1, False), (3, True)):
            i, o, operation = kernels.combine_operation(op, arity, into)
            compile_source(source("k", i, o, operation, {"T": dtype}, kernels.PREAMBLE))
    if dtype.kind != "b":
        i, o, operation = kernels.divide_operation(dtype)
        compile_source(source("mean", i, o, operation, {"T": dtype}))


@pytest.mark.parametrize("narrow", [np.float16] + ([BFLOAT16] if BFLOAT16 is not None else []),
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("exact", [np.float32, np.float64])
def test_round_inward_kernel_compiles(nvrtc, narrow, exact):
    """Wire compression's step back inside the largest share (``round_inward``)."""
    from collectives.backends.cupy import kernels

    compile_source, source = nvrtc
    i, o, operation = kernels.inward_operation()
    compile_source(source("inward", i, o, operation, {"T": np.dtype(exact), "N": np.dtype(narrow)}))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_key_kernels_compile(nvrtc, dtype):
    from collectives.backends.cupy import kernels

    compile_source, source = nvrtc
    for op in (ReduceOp.MAX, ReduceOp.MIN):
        key, to_key, from_key = kernels.key_operations(np.dtype(dtype), op)
        for operation in (to_key, from_key):
            compile_source(source("keys", "", f"{key} k", operation, {}))


def test_gather_kernels_compile(nvrtc):
    """The bucket's gather kernel (backends/cupy/gather.py), every word size."""
    from collectives.backends.cupy import gather

    compile_source, _ = nvrtc
    for word_bytes, word in gather.WORDS.items():
        compile_source(gather.SOURCE.format(bits=8 * word_bytes, word=word))
