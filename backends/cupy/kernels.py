"""The GPU kernels: fused n-ary combines (into one output, or into every one of ``n``),
MEAN's division, and order-preserving float keys.

Each kernel is a CuPy ``ElementwiseKernel`` built once per op, dtype and arity and cached
(CuPy compiles it on first use per device and keeps the binary on disk).

Every kernel computes exactly what the NumPy backend computes, in the same order, so the two
give the same bits on the same schedule:

* a combine of ``k`` sources is ``d = op(...op(op(d, s0), s1)..., s{k-1})``: left to right,
  rounded after every step (``float16`` arithmetic rounds each operation, as NumPy's does);
* MAX and MIN propagate NaN (NumPy's ``maximum``/``minimum``), so a NaN anywhere wins, in
  every float type (float16 and bfloat16 included);
* complex products and MEAN's division use round-to-nearest intrinsics, so the compiler
  cannot contract them into fused multiply-adds that NumPy does not do; complex MEAN is
  NumPy's own division by ``n + 0j`` (Smith's method: a multiplication by ``1/n``), which
  differs in the last bit from a plain division;
* integer MEAN divides into float64.

``key_kernels`` maps floats to integers whose order is the floats' order, NaN first or
last: NCCL's float MAX/MIN may drop NaN, its integer MAX/MIN cannot.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from collectives.ops import ReduceOp

MAX_ARITY = 16  # sources per kernel launch; longer combines run as several launches

# Helpers shared by every combine kernel. ``coll_isnan`` is true only for a NaN, so one
# MAX/MIN template serves integers, booleans and every float type. The generic form is
# ``x != x`` (false for integers and booleans, true for a NaN of any IEEE type): bfloat16
# (CuPy's ``bfloat16`` class, from a header CuPy includes only for bfloat16 kernels, after
# this preamble) compares as float and needs no overload naming it; nor does float16, whose
# ``isnan`` and ``float`` conversion NVRTC refused on an H100 (CUDA 13, CuPy 14.2), while its
# comparisons are those of every float16 kernel CuPy compiles.
PREAMBLE = r"""
template <typename T> __device__ __forceinline__ bool coll_isnan(const T& x) { return x != x; }
__device__ __forceinline__ bool coll_isnan(const float& x) { return isnan(x); }
__device__ __forceinline__ bool coll_isnan(const double& x) { return isnan(x); }

template <typename T> __device__ __forceinline__ T coll_sum(const T& a, const T& b) {
  return (T)(a + b);
}
template <typename T> __device__ __forceinline__ T coll_prod(const T& a, const T& b) {
  return (T)(a * b);
}
__device__ __forceinline__ complex<float> coll_prod(const complex<float>& a,
                                                    const complex<float>& b) {
  return complex<float>(__fsub_rn(__fmul_rn(a.real(), b.real()), __fmul_rn(a.imag(), b.imag())),
                        __fadd_rn(__fmul_rn(a.real(), b.imag()), __fmul_rn(a.imag(), b.real())));
}
__device__ __forceinline__ complex<double> coll_prod(const complex<double>& a,
                                                     const complex<double>& b) {
  return complex<double>(__dsub_rn(__dmul_rn(a.real(), b.real()), __dmul_rn(a.imag(), b.imag())),
                         __dadd_rn(__dmul_rn(a.real(), b.imag()), __dmul_rn(a.imag(), b.real())));
}
// NumPy's maximum/minimum: a NaN on either side wins; on a tie the right operand.
template <typename T> __device__ __forceinline__ T coll_max(const T& a, const T& b) {
  return (coll_isnan(a) || a > b) ? a : b;
}
template <typename T> __device__ __forceinline__ T coll_min(const T& a, const T& b) {
  return (coll_isnan(a) || a < b) ? a : b;
}
"""

_FUNCTIONS = {ReduceOp.SUM: "coll_sum", ReduceOp.MEAN: "coll_sum", ReduceOp.PROD: "coll_prod",
              ReduceOp.MAX: "coll_max", ReduceOp.MIN: "coll_min"}


def combine_operation(op: ReduceOp, arity: int, into: bool) -> tuple[str, str, str]:
    """``(in_params, out_params, operation)`` of a combine of ``arity`` sources.

    ``into=False``: ``d = op(d, s0, ...)``; ``into=True``: ``d = op(f, s0, ...)`` (``f`` is
    one more input, read instead of ``d``).
    """
    fn = _FUNCTIONS[op]
    names = [f"s{i}" for i in range(arity)]
    inputs = (["f"] if into else []) + names
    body = [f"T acc = {'f' if into else 'd'};"]
    body += [f"acc = {fn}(acc, {s});" for s in names]
    body.append("d = acc;")
    return ", ".join(f"T {p}" for p in inputs), "T d", " ".join(body)


def spread_operation(op: ReduceOp, arity: int) -> tuple[str, str, str]:
    """``(in_params, out_params, operation)`` of ``d_i = op(s0, s1, ...)`` for every one of
    ``arity`` outputs: the combine of ``combine_operation(op, arity - 1, into=True)``, written
    to every output by the thread that read the element (an output may be its own input)."""
    fn = _FUNCTIONS[op]
    body = ["T acc = s0;"] + [f"acc = {fn}(acc, s{i});" for i in range(1, arity)]
    body += [f"d{i} = acc;" for i in range(arity)]
    return (", ".join(f"T s{i}" for i in range(arity)), ", ".join(f"T d{i}" for i in range(arity)),
            " ".join(body))


def divide_operation(dtype: np.dtype) -> tuple[str, str, str]:
    """``(in_params, out_params, operation)`` of MEAN's ``out = total / n``."""
    kind = dtype.kind
    if kind in "iub":  # NumPy's true division of integers: float64
        return "T t, int64 n", "float64 out", "out = (double)t / (double)n;"
    if kind == "c":  # NumPy divides by n + 0j with Smith's method: scale = 1 / n, ratio = 0
        real = "float" if dtype.itemsize == 8 else "double"
        mul, add, sub, div = (("__fmul_rn", "__fadd_rn", "__fsub_rn", "__fdiv_rn")
                              if real == "float" else
                              ("__dmul_rn", "__dadd_rn", "__dsub_rn", "__ddiv_rn"))
        operation = (
            f"const {real} rat = ({real})0; const {real} scl = {div}(({real})1, ({real})n); "
            f"out = T({mul}({add}(t.real(), {mul}(t.imag(), rat)), scl), "
            f"{mul}({sub}(t.imag(), {mul}(t.real(), rat)), scl));")
        return "T t, int64 n", "T out", operation
    if dtype == np.float16:  # float16 / float16(n): one rounding of the float quotient
        return "T t, int64 n", "T out", "out = t / T((float)n);"
    if dtype.name == "bfloat16":  # as ml_dtypes: the float32 quotient, rounded to bfloat16
        return "T t, int64 n", "T out", "out = T(__fdiv_rn((float)t, (float)n));"
    fn = "__fdiv_rn" if dtype == np.float32 else "__ddiv_rn"
    return "T t, int64 n", "T out", f"out = {fn}(t, (T)n);"


def inward_operation() -> tuple[str, str, str]:
    """``(in_params, out_params, operation)`` of ``ArrayBackend.round_inward``: ``narrow``
    takes ``low`` or ``high`` where ``|exact| <= limit`` and it lies beyond them (read in
    double: every float16, bfloat16 and float32 value is exact there)."""
    return ("T exact, float64 limit, N low, N high", "N narrow",
            "if (fabs((double)exact) <= limit && "
            "fabs((double)(float)narrow) > (double)(float)high) "
            "narrow = exact < 0 ? low : high;")


def key_operations(dtype: np.dtype, op: ReduceOp) -> tuple[str, str, str]:
    """``(key dtype, to_key, from_key)``: in-place operations on a buffer of ``dtype`` floats
    seen as integers ``k`` of the same width. ``to_key`` turns each float into a key whose
    integer order is the floats' order, NaN ranked above everything for MAX and below
    everything for MIN; ``from_key`` turns keys back into floats (a NaN key into a NaN)."""
    if dtype == np.float32:
        key, ctype, mask, as_float = "int32", "int", "0x7fffffff", "__int_as_float"
        extreme = "2147483647" if op is ReduceOp.MAX else "(-2147483647 - 1)"
    elif dtype == np.float64:
        key, ctype, mask, as_float = ("int64", "long long", "0x7fffffffffffffffLL",
                                      "__longlong_as_double")
        extreme = ("9223372036854775807LL" if op is ReduceOp.MAX
                   else "(-9223372036854775807LL - 1)")
    else:
        raise TypeError(f"no integer keys for {dtype}")
    # Negative floats count down as their bits count up: flip all but the sign bit (the map
    # is its own inverse).
    flip = f"(k >= 0 ? k : ({ctype})(k ^ {mask}))"
    to_key = f"k = isnan({as_float}(k)) ? ({ctype}){extreme} : {flip};"
    from_key = f"k = {flip};"
    return key, to_key, from_key


def _cupy():
    import cupy

    return cupy


@cache
def combine_kernel(op: ReduceOp, arity: int, into: bool):
    """The cached ``ElementwiseKernel`` of ``combine_operation`` (dtype-generic: CuPy
    compiles one binary per dtype and device on first use)."""
    in_params, out_params, operation = combine_operation(op, arity, into)
    name = f"collectives_{op.wire_op.value}_{'into' if into else 'acc'}_{arity}"
    return _cupy().ElementwiseKernel(in_params, out_params, operation, name,
                                     preamble=PREAMBLE, no_return=True)


@cache
def spread_kernel(op: ReduceOp, arity: int):
    """The cached ``ElementwiseKernel`` of ``spread_operation``."""
    in_params, out_params, operation = spread_operation(op, arity)
    return _cupy().ElementwiseKernel(in_params, out_params, operation,
                                     f"collectives_{op.wire_op.value}_spread_{arity}",
                                     preamble=PREAMBLE, no_return=True)


@cache
def divide_kernel(dtype: np.dtype):
    in_params, out_params, operation = divide_operation(np.dtype(dtype))
    return _cupy().ElementwiseKernel(in_params, out_params, operation,
                                     f"collectives_mean_{np.dtype(dtype).name}", no_return=True)


@cache
def inward_kernel():
    """The cached ``ElementwiseKernel`` of ``inward_operation``."""
    return _cupy().ElementwiseKernel(*inward_operation(), "collectives_round_inward",
                                     no_return=True)


@cache
def key_kernels(dtype: np.dtype, op: ReduceOp):
    """``(to_key, from_key)`` kernels, each ``kernel(keys)`` on ``buffer.view(key dtype)``."""
    dtype = np.dtype(dtype)
    key, to_key, from_key = key_operations(dtype, op)
    cp = _cupy()
    name = f"collectives_{op.value}_{dtype.name}"
    return (cp.ElementwiseKernel("", f"{key} k", to_key, f"{name}_to_key", no_return=True),
            cp.ElementwiseKernel("", f"{key} k", from_key, f"{name}_from_key", no_return=True))
