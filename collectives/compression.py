"""Wire compression: an all-reduce carried in a narrower float and cast back.

``compression="fp16"`` or ``"bf16"`` on a float32 or float64 SUM or MEAN all-reduce, as
Horovod's ``Compression.fp16`` and torch's fp16/bf16 communication hooks: every contribution
is cast to float16 (or bfloat16), the all-reduce runs on those (the wire carries half the
bytes of float32, a quarter of float64), and the result is cast back to the input's dtype.
The additions happen in the narrow type, each rounded, so the result carries their error
(``docs/performance.md`` measures it). MEAN divides each contribution by the number of
participants *before* compressing, as torch's hook does, so a mean of values within the wire's
range never overflows (a share at the very top of its range goes a few steps down, so that
the additions' roundings cannot carry ``n`` of them past it: ``compress``); SUM compresses
the values as they are (the same few steps down for values within the range over ``n``), so
a sum overflows where it passes the wire's range (float16's 65504; bfloat16's, whose exponent
is float32's, about 3.39e38, just short of float32's largest). Every participant casts the same bits
back, so results stay bitwise identical everywhere.

bfloat16 comes from ``ml_dtypes``: ``pip install 'collective-schedules[bfloat16]'``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .extras import install_line
from .ops import BFLOAT16, ReduceOp

__all__ = ["NAMES", "compress", "decompress", "for_batch", "requested", "wire_dtype", "wire_name"]

#: the accepted spellings, by the dtype the wire carries
NAMES = {"fp16": "float16", "float16": "float16", "half": "float16",
         "bf16": "bfloat16", "bfloat16": "bfloat16"}
_COMPRESSIBLE = (np.dtype(np.float32), np.dtype(np.float64))


def wire_name(compression: str) -> str:
    """``compression`` (a name ``NAMES`` knows, in any case) as its wire type's name, what
    every spelling of one wire agrees on: "fp16" and "half" are "float16"."""
    return NAMES[compression.lower()]


def requested(compression: Any) -> bool:
    """Whether ``compression`` asks for any (None and "none" do not)."""
    return compression is not None and not (isinstance(compression, str)
                                            and compression.lower() == "none")


def wire_dtype(compression: Any, op: Any, dtype: Any, argument: str = "x") -> np.dtype | None:
    """The dtype the wire carries for an all-reduce with ``compression``.

    Parameters
    ----------
    compression
        ``"fp16"`` (also ``"float16"``, ``"half"``), ``"bf16"`` (also ``"bfloat16"``), or
        None / ``"none"`` for none.
    op
        The call's reduction (a `ReduceOp` or its name).
    dtype
        The dtype of the call's arrays.
    argument
        The argument's name, for error messages.

    Returns
    -------
    numpy.dtype or None
        float16 or bfloat16; None where nothing is compressed.

    Raises
    ------
    ValueError
        An unknown ``compression``, an op other than SUM and MEAN, or bfloat16 without
        ``ml_dtypes`` (the message names the ``pip install``).
    TypeError
        ``dtype`` is neither float32 nor float64.
    """
    if not requested(compression):
        return None
    name = NAMES.get(compression.lower()) if isinstance(compression, str) else None
    if name is None:
        raise ValueError(f"compression={compression!r} is not a wire compression; use 'fp16', "
                         "'bf16' or None")
    op = ReduceOp.parse(op)
    if op not in (ReduceOp.SUM, ReduceOp.MEAN):
        raise ValueError(f"compression={compression!r} applies to sum and mean all-reduces; "
                         f"op={op.value!r} must travel uncompressed: pass compression=None")
    dtype = np.dtype(dtype)
    if dtype.newbyteorder("=") not in _COMPRESSIBLE:  # (">f4" is float32 too)
        raise TypeError(f"compression={compression!r} compresses float32 and float64; "
                        f"{argument} has dtype {dtype}: pass compression=None")
    if name == "float16":
        return np.dtype(np.float16)
    if BFLOAT16 is None:
        raise ValueError(f"compression={compression!r} needs bfloat16 from the ml_dtypes "
                         f"package: {install_line('bfloat16')}, or use compression='fp16'")
    return BFLOAT16


def for_batch(compression: Any, op: Any, dtypes: Any) -> list:
    """Per tensor of a batch, the compression it travels with: ``compression`` for float32
    and float64 tensors, None for the others (as Horovod's compressors leave tensors that
    are not floating alone); raises for an op that cannot be compressed."""
    if not requested(compression):
        return [None] * len(dtypes)
    wire_dtype(compression, op, np.float32, "the batch")  # the name, the op, ml_dtypes
    return [compression if np.dtype(d).newbyteorder("=") in _COMPRESSIBLE else None
            for d in dtypes]


def compress(arrays: Any, x: Any, wire: np.dtype, divisor: int = 1, parts: int = 1) -> Any:
    """A new array of dtype ``wire`` holding ``x / divisor`` (``arrays``: ``x``'s backend),
    one of ``parts`` contributions to a sum on the wire.

    Each element is rounded to the nearest wire value, except a share within the wire's range
    over ``parts`` (at most its largest value / ``parts``) that would round above the largest
    share whose ``parts`` copies, added in the wire's rounding, stay within range: it takes
    that share instead (``share_bounds``, ``ArrayBackend.round_inward``; a few steps down at
    most, within the error the additions make). So a mean of values within the wire's range,
    or a sum of values within its range over ``parts``, never overflows on the wire (65504 / 3
    rounded up to 21840, and three of them made ``inf``; ten shares of 6548 added one after
    another rounded up past 65504)."""
    small = arrays.empty(tuple(x.shape), wire, like=x)
    if divisor != 1:  # divided in x's precision, then rounded once to the wire's
        x = arrays.divide(x, divisor, out=arrays.empty(tuple(x.shape), x.dtype, like=x))
    arrays.copy(small, x)
    if parts > 1:
        arrays.round_inward(small, x, *share_bounds(np.dtype(wire), parts))
    return small


@functools.cache
def share_bounds(wire: np.dtype, parts: int) -> tuple[float, float]:
    """``(limit, inside)``: a share whose exact magnitude is at most ``limit`` (``wire``'s
    largest value / ``parts``) goes on the wire as at most ``inside``, the largest ``wire``
    value whose ``parts`` copies stay within range added in ``wire``'s rounding in the orders
    the algorithms add in: one after another (ring, one device, shuffle) and in pairs
    (recursive halving, tree). Rounding is monotone, so smaller shares, or shares of either
    sign, stay within range too."""
    biggest = float(np.finfo(wire).max)
    kind = wire.type
    share = kind(biggest / parts)  # (the nearest: one step above the largest at most)
    if float(share) * parts > biggest:
        share = np.nextafter(share, kind(0))
    while not (_within(_one_after_another(share, parts, wire), biggest)
               and _within(_in_pairs(share, parts, wire), biggest)):
        share = np.nextafter(share, kind(0))  # (a few steps at most: the additions' error)
    return biggest / parts, float(share)


def _within(total: Any, biggest: float) -> bool:
    return bool(np.isfinite(total)) and float(total) <= biggest


def _one_after_another(share: Any, parts: int, wire: np.dtype) -> Any:
    with np.errstate(over="ignore"):
        return np.add.accumulate(np.full(parts, share, wire), dtype=wire)[-1]


def _in_pairs(share: Any, parts: int, wire: np.dtype) -> Any:
    values = np.full(parts, share, wire)
    with np.errstate(over="ignore"):
        while len(values) > 1:  # (an odd one out is carried to the next level)
            paired = (values[0:len(values) - 1:2] + values[1::2]).astype(wire)
            values = np.concatenate([paired, values[len(values) - 1:]]) if len(values) % 2 \
                else paired
    return values[0]


def decompress(arrays: Any, small: Any, out: Any) -> Any:
    """``out`` filled with the wire result ``small`` cast back (exactly) to ``out``'s dtype."""
    arrays.copy(out, small)
    return out
