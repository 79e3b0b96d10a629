"""Argument checks shared by both ways of calling. All run before any data moves."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .ops import ReduceOp, check_dtype


def as_array(x, argument: str):
    """Accept NumPy-like arrays (anything with shape and dtype); wrap scalars and lists."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return x
    if x is None:
        raise TypeError(f"{argument} is None; pass an array")
    try:
        return np.asarray(x)
    except Exception as exc:  # pragma: no cover - numpy's own message is the useful part
        raise TypeError(f"{argument} cannot be read as an array: {exc}") from exc


def same_layout(values: Sequence, argument: str = "values") -> tuple[tuple[int, ...], np.dtype]:
    """All values share one shape and dtype; return them."""
    if len(values) == 0:
        raise ValueError(f"{argument} is empty; pass one array per device")
    shape, dtype = tuple(values[0].shape), np.dtype(values[0].dtype)
    for i, v in enumerate(values[1:], 1):
        if tuple(v.shape) != shape:
            raise ValueError(f"{argument}[{i}] has shape {tuple(v.shape)} but {argument}[0] has "
                             f"{shape}; every device must bring the same shape")
        if np.dtype(v.dtype) != dtype:
            raise TypeError(f"{argument}[{i}] has dtype {np.dtype(v.dtype)} but {argument}[0] has "
                            f"{dtype}; every device must bring the same dtype")
    return shape, dtype


def check_op(op, dtype: np.dtype, argument: str = "values") -> ReduceOp:
    op = ReduceOp.parse(op)
    check_dtype(op, dtype, argument)
    return op


def check_root(root, size: int) -> int:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        raise TypeError(f"root must be an integer rank, not {type(root).__name__}")
    if not 0 <= root < size:
        raise ValueError(f"root={root} is out of range; there are {size} participants (0..{size - 1})")
    return int(root)


def check_out(out, shape: tuple[int, ...], dtype: np.dtype, argument: str = "out") -> None:
    """``out`` must be a writable, C-contiguous array of the result's shape and dtype."""
    if not (hasattr(out, "shape") and hasattr(out, "dtype")):
        raise TypeError(f"{argument} must be an array, not {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{argument} has shape {tuple(out.shape)}; the result has shape {shape}")
    if np.dtype(out.dtype) != np.dtype(dtype):
        raise TypeError(f"{argument} has dtype {np.dtype(out.dtype)}; the result has dtype "
                        f"{np.dtype(dtype)}")
    flags = getattr(out, "flags", None)
    if flags is not None and not flags.c_contiguous:
        raise ValueError(f"{argument} is not C-contiguous; pass a contiguous array "
                         "(e.g. numpy.ascontiguousarray) to receive results")
    if flags is not None and not flags.writeable:
        raise ValueError(f"{argument} is read-only; pass a writable array")


def check_shards(shards) -> int:
    if isinstance(shards, bool) or not isinstance(shards, (int, np.integer)) or shards < 0:
        raise ValueError(f"shards={shards!r} must be a non-negative integer (0: the default)")
    return int(shards)


def flat(x):
    """A 1-D view of ``x`` when contiguous, else a contiguous copy (inputs are never written)."""
    if x.flags.c_contiguous:
        return x.reshape(-1)
    return np.ascontiguousarray(x).reshape(-1)
