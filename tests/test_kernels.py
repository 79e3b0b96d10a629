"""The one-pass combine kernels give NumPy's binary ufuncs' results bit for bit.

``collectives.kernels.combine_into`` runs the compiled kernels where they are built and cover
the op and dtype, else NumPy's ufuncs over cache-sized blocks; both must equal the plain
left-to-right chain of whole-array ufuncs (the library's results before the kernels), for
every op and dtype, any number of sources, lengths 0, 1, primes and several blocks, and
special values (NaN, infinities, signed zeros, subnormals, integer overflow). The
multi-device API must return the same bits whichever path combines.
"""

from __future__ import annotations

import numpy as np
import pytest

import collectives
from collectives import kernels
from collectives.ops import BFLOAT16, ReduceOp, check_dtype, kernel_name

OPS = [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN]
LENGTHS = [0, 1, 7, 513, 1031, 70_001]  # 513/1031: around the kernels' 512-element blocks


def _accepts(op, dtype) -> bool:
    try:
        check_dtype(op, dtype)
    except TypeError:
        return False
    return True


DTYPES = [d for d in collectives.ops.supported_dtypes()]
CASES = [(op, d) for op in OPS for d in DTYPES if _accepts(op, d)]


def _data(rng, dtype, n: int) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)  # the whole range: sums and products overflow and wrap
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    x = rng.standard_normal(n).astype(dtype)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-310, 3e38]).astype(dtype)
    if n >= 64:  # a few special values at random places
        x[rng.integers(0, n, len(special))] = special
    return x


def _chain(op, first, srcs, in_place: bool = False) -> np.ndarray:
    """The reference: NumPy's binary ufunc over whole arrays, left to right (the first one
    out of place unless ``in_place``: NumPy's complex products differ between the two)."""
    ufunc = getattr(np, kernel_name(op))
    out = np.array(first, copy=True)
    if not in_place:
        ufunc(first, srcs[0], out=out)
        srcs = srcs[1:]
    for s in srcs:
        ufunc(out, s, out=out)
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind in "fc" or a.dtype == BFLOAT16:
        nan = np.isnan(a)  # which NaN comes out is NumPy's business, that one does is ours
        if not np.array_equal(nan, np.isnan(b)):
            return False
        a, b = a[~nan], b[~nan]
    return a.tobytes() == b.tobytes()


pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")


@pytest.mark.parametrize("op,dtype", CASES, ids=[f"{o.value}-{d}" for o, d in CASES])
def test_combine_equals_numpy_chain(op, dtype):
    rng = np.random.default_rng(7)
    for n in LENGTHS:
        for k in (1, 2, 3, 4, 7):
            first = _data(rng, dtype, n)
            srcs = [_data(rng, dtype, n) for _ in range(k)]
            expected = _chain(op, first, srcs)
            in_place = _chain(op, first, srcs, in_place=True)
            for compiled in (True, False):
                out = np.full(n, 1, dtype)
                kernels.combine_into(op, out, first, srcs, compiled=compiled)
                assert _same_bits(out, expected), (op, dtype, n, k, compiled)
                acc = first.copy()  # in place: the destination is the first operand
                kernels.combine(op, acc, srcs, compiled=compiled)
                assert _same_bits(acc, in_place), (op, dtype, n, k, compiled, "in place")


def test_compiled_kernels_are_built_here():
    """The package builds them wherever a C compiler is present (as on this machine)."""
    import shutil
    import sysconfig

    if not shutil.which(sysconfig.get_config_var("CC").split()[0] or "cc"):
        pytest.skip("no C compiler here: the kernels are optional and NumPy combines")
    assert kernels.COMPILED, "collectives._kernels is not built: reinstall the package"
    assert kernels.compiled_covers(ReduceOp.SUM, np.dtype(np.float32))
    assert not kernels.compiled_covers(ReduceOp.MAX, np.dtype(np.float32))
    assert kernels.compiled_covers(ReduceOp.MAX, np.dtype(np.int16))
    # the integer kernels are a module of their own: built, and their table loaded
    from collectives import _kernels

    assert _kernels.INTEGERS == 1, "collectives._integer_kernels is not built: reinstall"
    for dtype in (np.int8, np.uint64):
        x, y = np.arange(9, dtype=dtype), np.full(9, 3, dtype)
        out = np.empty_like(x)
        assert _kernels.combine(2, kernels._TYPES[np.dtype(dtype)], out, x, (y,))  # MAX, in C
        assert np.array_equal(out, np.maximum(x, y))


def test_declined_operands_fall_back_to_numpy():
    """Non-contiguous, partly overlapping, mixed-dtype or foreign operands go to NumPy."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(4002).astype(np.float32)
    y = rng.standard_normal(4002).astype(np.float32)
    out = np.empty(2001, np.float32)
    kernels.combine_into(ReduceOp.SUM, out, x[::2], [y[::2], y[1::2]])  # strided
    assert _same_bits(out, _chain(ReduceOp.SUM, x[::2], [y[::2], y[1::2]]))
    buf = np.arange(20, dtype=np.int32)
    expected = buf[2:12] + buf[0:10]
    kernels.combine(ReduceOp.SUM, buf[2:12], [buf[0:10]])  # overlap: NumPy buffers it
    assert np.array_equal(buf[2:12], expected)
    mixed = np.zeros(7, np.float64)
    kernels.combine(ReduceOp.SUM, mixed, [np.arange(7, dtype=np.int32), [1.5] * 7])
    assert np.array_equal(mixed, np.arange(7) + 1.5)
    frozen = np.zeros(5, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kernels.combine(ReduceOp.SUM, frozen, [np.ones(5, np.float32)])


SIZES = [0, 1, 1031, 150_001]  # the last: several tiles, spread over threads


@pytest.mark.parametrize("algorithm", ["one_device", "ring", "tree", "rechd", "shuffle"])
def test_multi_device_results_unchanged(algorithm, monkeypatch):
    """all_reduce (p outputs and shared_result) and reduce return the bits of the binary
    ufunc path, for 1 to 5 devices and several ops and dtypes."""
    rng = np.random.default_rng(11)
    for n in (1, 2, 3, 4, 5):
        for op, dtype in [("sum", np.float32), ("prod", np.float64), ("max", np.int32),
                          ("sum", np.int8)]:
            for size in SIZES:
                values = [_data(rng, dtype, size) for _ in range(n)]
                runs = []
                for compiled in (True, False):
                    monkeypatch.setattr(kernels, "_compiled",
                                        kernels._compiled if compiled else None)
                    runs.append((collectives.all_reduce(values, op, algorithm),
                                 collectives.all_reduce(values, op, algorithm,
                                                        shared_result=True)[0],
                                 collectives.reduce(values, op, n - 1, algorithm)))
                    monkeypatch.undo()
                fast, plain = runs
                for a, b in zip([*fast[0], fast[1], fast[2]], [*plain[0], plain[1], plain[2]]):
                    assert _same_bits(a, b), (algorithm, n, op, dtype, size)


NARROW = [np.dtype(np.float16)] + ([BFLOAT16] if BFLOAT16 is not None else [])


def _wide_data(rng, dtype, n: int) -> np.ndarray:
    """Values that exercise every rounding case of a narrow float: specials, overflow,
    subnormals, points a hair beyond halfway between two halves (float64 to float16 through
    float32 would round them twice, wrongly), then random magnitudes."""
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0, 65520.0, 65519.99, 1e300,
                        -1e300, 2.0 ** -25, 2.0 ** -24 * 1.5, 5e-324, 3.4e38, 3.5e38, -3.4e38])
    halves = rng.standard_normal(n // 4).astype(np.float16)
    ulp = np.spacing(halves).astype(np.float64)
    base = halves.astype(np.float64)
    edges = np.concatenate([base + ulp / 2 + ulp * 2.0 ** -20, base - ulp / 2 - ulp * 2.0 ** -20,
                            base + ulp / 2])
    x = rng.standard_normal(n) * np.exp2(rng.integers(-30, 20, n))
    return np.concatenate([special, edges, x])[:n].astype(dtype)


@pytest.mark.parametrize("narrow", NARROW, ids=[str(d) for d in NARROW])
@pytest.mark.parametrize("wide", [np.float32, np.float64])
def test_casts_equal_numpy(narrow, wide):
    rng = np.random.default_rng(5)
    for n in (0, 1, 3, 7, 8, 9, 4097, 100_003):
        x = _wide_data(rng, wide, n) if n > 64 else rng.standard_normal(n).astype(wide)
        down, expected = np.empty(n, narrow), np.empty(n, narrow)
        with np.errstate(over="ignore", invalid="ignore"):
            np.copyto(expected, x, casting="unsafe")
            kernels.cast_into(down, x)
        assert _same_bits(down, expected), (narrow, wide, n, "down")
        up, back = np.empty(n, wide), np.empty(n, wide)
        np.copyto(back, expected, casting="unsafe")
        kernels.cast_into(up, expected)
        assert _same_bits(up, back), (narrow, wide, n, "up")


def test_casts_decline_what_they_do_not_cover():
    x = np.arange(10, dtype=np.float32)
    half = np.empty(5, np.float16)
    kernels.cast_into(half, x[::2])  # strided: NumPy's cast
    assert np.array_equal(half, x[::2])
    ints = np.empty(10, np.int16)
    kernels.cast_into(ints, x)  # not a narrow float: NumPy's cast
    assert np.array_equal(ints, np.arange(10))
