"""Reduction operators: parsing, dtype rules, identities and the in-place kernels.

MEAN travels as SUM and is divided once, by the number of participants, after the
communication ends. Integer MEAN follows NumPy's true division, so its result is float64
(float16, float32, bfloat16 and complex keep their dtype).
"""

from __future__ import annotations

import enum

import numpy as np

try:  # bfloat16 is optional: it comes with ml_dtypes where installed
    import ml_dtypes

    BFLOAT16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - exercised only without ml_dtypes
    BFLOAT16 = None


class ReduceOp(enum.Enum):
    """How contributions combine. Strings are accepted case-insensitively; "avg" means MEAN."""

    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    PROD = "prod"

    @classmethod
    def parse(cls, op: ReduceOp | str) -> ReduceOp:
        """A ReduceOp from its name (any case; "avg", "average", "product" too), another
        library's enum with a ``name`` (TensorFlow's, torch.distributed's ``ReduceOp``), or
        mpi4py's ``MPI.SUM``/``PROD``/``MAX``/``MIN``."""
        if isinstance(op, ReduceOp):
            return op
        known = _BY_NAME.get(op) if isinstance(op, str) else None
        if known is not None:
            return known
        name = _mpi4py_name(op) or getattr(op, "name", op)
        if isinstance(name, str):
            key = name.strip().lower()
            key = {"avg": "mean", "average": "mean", "product": "prod", "add": "sum"}.get(key, key)
            for member in cls:
                if member.value == key:
                    return member
            if key in _BITWISE:
                raise ValueError(f"op={op!r} is a bitwise or logical reduction, which this "
                                 "library does not offer; use MAX or MIN on booleans for "
                                 "logical or/and")
        raise ValueError(
            f"op={op!r} is not a reduction; use one of "
            f"{', '.join(repr(m.value) for m in cls)} (or 'avg' for mean)"
        )

    @property
    def wire_op(self) -> ReduceOp:
        """The op applied while data moves: MEAN moves as SUM."""
        return ReduceOp.SUM if self is ReduceOp.MEAN else self


_BY_NAME = {m.value: m for m in ReduceOp}
_BITWISE = {"band", "bor", "bxor", "land", "lor", "lxor", "premul_sum"}


def _mpi4py_name(op: object) -> str | None:
    """The name of an mpi4py reduction (``MPI.SUM`` ...), without importing mpi4py."""
    if not type(op).__module__.startswith("mpi4py"):
        return None
    import sys

    mpi = sys.modules.get("mpi4py.MPI")
    for name in ("SUM", "PROD", "MAX", "MIN", "BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR"):
        if mpi is not None and op == getattr(mpi, name, None):
            return name
    return None  # the common spellings, without string work

_KERNELS = {
    ReduceOp.SUM: "add",
    ReduceOp.MEAN: "add",
    ReduceOp.PROD: "multiply",
    ReduceOp.MAX: "maximum",  # propagates NaN, as every path of the library must
    ReduceOp.MIN: "minimum",
}


def kernel_name(op: ReduceOp) -> str:
    """The ufunc that combines two contributions (NumPy's and CuPy's share the names)."""
    return _KERNELS[op]


def supported_dtypes() -> list[np.dtype]:
    """Every dtype some op accepts, in a stable order (for test matrices and docs)."""
    names = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float16", "float32", "float64", "complex64", "complex128"]
    dtypes = [np.dtype(n) for n in names]
    if BFLOAT16 is not None:
        dtypes.insert(dtypes.index(np.dtype("float16")) + 1, BFLOAT16)
    return dtypes


_NUMPY_FLOATS = (np.float16, np.float32, np.float64, np.longdouble)


def _kind(dtype: np.dtype) -> str:
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return "f"
    if dtype.kind == "f" and dtype.type not in _NUMPY_FLOATS:
        return "V"  # (ml_dtypes' float8_e5m2 says "f" where its float8 siblings say "V")
    return dtype.kind


def check_dtype(op: ReduceOp, dtype: np.dtype, argument: str = "values") -> None:
    """Raise TypeError unless ``op`` makes sense for ``dtype``."""
    if (op, dtype) in _ACCEPTED:
        return
    kind = _kind(np.dtype(dtype))
    allowed = {
        "b": {ReduceOp.MAX, ReduceOp.MIN},
        "i": set(ReduceOp),
        "u": set(ReduceOp),
        "f": set(ReduceOp),
        "c": {ReduceOp.SUM, ReduceOp.MEAN, ReduceOp.PROD},
    }.get(kind)
    if allowed is None:
        raise TypeError(
            f"{argument} has dtype {np.dtype(dtype)}, which cannot be reduced; use a boolean, "
            "integer, floating (float16, bfloat16, float32, float64) or complex dtype "
            "(cast it first, with .astype(np.float32))"
        )
    if op not in allowed:
        ok = ", ".join(sorted(m.value for m in allowed))
        raise TypeError(
            f"op={op.value!r} is not defined for {argument} of dtype {np.dtype(dtype)}; "
            f"that dtype accepts {ok}"
        )
    _ACCEPTED.add((op, np.dtype(dtype)))


_ACCEPTED: set = set()  # (op, dtype) pairs already checked: the check sits on every call


def result_dtype(op: ReduceOp, dtype: np.dtype) -> np.dtype:
    """The dtype a reduction returns: the input's, except integer MEAN (float64)."""
    dtype = np.dtype(dtype)
    if op is ReduceOp.MEAN and _kind(dtype) in "iu":
        return np.dtype(np.float64)
    return dtype


def identity(op: ReduceOp, dtype: np.dtype):
    """The value that leaves any contribution unchanged under ``op``: what padding must hold.

    The schedules never materialise padding (see ``schedule.element_ranges``); this is for
    callers that pad buffers themselves, as TensorFlow's padded split does.
    """
    dtype = np.dtype(dtype)
    op = op.wire_op
    if op is ReduceOp.SUM:
        return dtype.type(0)
    if op is ReduceOp.PROD:
        return dtype.type(1)
    kind = _kind(dtype)
    if kind == "b":
        return np.bool_(op is ReduceOp.MIN)
    if kind == "f":
        return dtype.type(-np.inf if op is ReduceOp.MAX else np.inf)
    info = np.iinfo(dtype)
    return dtype.type(info.min if op is ReduceOp.MAX else info.max)


def divide_for_mean(total: np.ndarray, count: int, out: np.ndarray | None = None) -> np.ndarray:
    """MEAN's one division; integer totals divide into float64 like NumPy's true division."""
    return np.true_divide(total, count, out=out, casting="unsafe")
