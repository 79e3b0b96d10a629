"""Argument checks shared by both ways of calling. All run before any data moves.

They read only shapes, dtypes and flags, and ask the array backend about the rest (whether an
array is contiguous or writable), so they serve NumPy and GPU arrays alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import numpy as np

from ..algorithms.spec import spec_key
from ..arrays import kind_name, library_of, plain_ndarray
from ..ops import ReduceOp, check_dtype

Groups = Sequence[Sequence[int]] | int | None


def as_array(x: Any, argument: str, arrays: Any = None) -> Any:
    """An array (anything with ``shape`` and ``dtype``); scalars and array-likes become NumPy
    arrays. None and lists raise TypeError: one array is expected. NumPy subclasses are
    taken as plain arrays (a masked array raises: ``collectives.arrays.plain_ndarray``)."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        if isinstance(x, np.ndarray) and x.__class__ is not np.ndarray:
            return plain_ndarray(x, argument)
        return x
    if x is None:
        raise TypeError(f"{argument} is None; pass an array")
    if isinstance(x, (list, tuple)) and any(hasattr(v, "shape") or hasattr(v, "__array__")
                                             for v in x):
        raise TypeError(f"{argument} is a {type(x).__name__} of arrays; pass one array (stack "
                        "them yourself with numpy.stack)")
    try:
        return np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - NumPy's own message is the useful part
        raise TypeError(f"{argument} cannot be read as an array: {exc}") from exc


def check_communicable(dtype: np.dtype, argument: str) -> None:
    """Any fixed-size dtype travels as bytes; Python objects (pointers) cannot."""
    if dtype.hasobject:
        raise TypeError(f"{argument} has dtype {dtype} (Python objects), which cannot be "
                        "communicated; use a numeric dtype (or all_gather_object for objects)")


def same_layout(values: Sequence, argument: str = "values",
                op: Any = None) -> tuple[tuple[int, ...], np.dtype]:
    """All values share one shape and dtype (that ``op``, if given, can reduce); return them."""
    if len(values) == 0:
        raise ValueError(f"{argument} is empty; pass one array per device")
    try:
        shape, dtype = tuple(values[0].shape), np.dtype(values[0].dtype)
    except TypeError:  # a dtype NumPy cannot read: another library's array, in a NumPy call
        raise TypeError(f"{argument}[0] is a {kind_name(values[0])} but the call's first array "
                        "is a numpy.ndarray; every array of a call must be the same kind"
                        ) from None
    for i, v in enumerate(values[1:], 1):
        if type(v) is not type(values[0]) and library_of(v) != library_of(values[0]):
            raise TypeError(f"{argument}[{i}] is a {kind_name(v)} but {argument}[0] is a "
                            f"{kind_name(values[0])}; every device must bring the same kind of "
                            "array")
        if tuple(v.shape) != shape:
            raise ValueError(f"{argument}[{i}] has shape {tuple(v.shape)} but {argument}[0] has "
                             f"{shape}; every device must bring the same shape")
        if np.dtype(v.dtype) != dtype:
            raise TypeError(f"{argument}[{i}] has dtype {np.dtype(v.dtype)} but {argument}[0] has "
                            f"{dtype}; every device must bring the same dtype")
    if op is not None:
        check_op(op, dtype, argument)
    check_communicable(dtype, argument)
    return shape, dtype


def check_op(op: Any, dtype: np.dtype, argument: str = "values") -> ReduceOp:
    parsed = ReduceOp.parse(op)
    check_dtype(parsed, dtype, argument)
    return parsed


def check_root(root: Any, size: int) -> int:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        raise TypeError(f"root must be an integer rank, not {type(root).__name__}")
    if not 0 <= root < size:
        raise ValueError(f"root={root} is out of range; there are {size} participants (0..{size - 1})")
    return int(root)


MAX_DEVICES = 1 << 17  # the most devices one process's call names (the cost model's plans,
# and one array a device, are made for each: 2**70 of them ran until memory ran out)


def check_devices(devices: Any, argument: str = "devices") -> int:
    """How many devices ``devices`` names: a positive count (at most ``MAX_DEVICES``), or a
    list (of ids or arrays)."""
    if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        count = int(devices)
    else:
        try:
            if isinstance(devices, (str, bytes, bool)) or devices is None:
                raise TypeError
            count = len(devices)
        except TypeError:
            raise TypeError(f"{argument}={devices!r} must be a number of devices or a list of "
                            f"them, not {type(devices).__name__}") from None
    if count < 1:
        raise ValueError(f"{argument}={devices!r} names no device; pass a count or a list")
    if count > MAX_DEVICES:
        raise ValueError(f"{argument}={devices!r} names more devices than one process holds "
                         f"(at most {MAX_DEVICES:,})")
    return count


def check_out(out: Any, shape: tuple[int, ...] | None, dtype: np.dtype | None,
              argument: str = "out", arrays: Any = None) -> None:
    """``out`` must be a writable, C-contiguous array of the result's shape and dtype, of the
    same kind as the inputs (``arrays``: their backend). ``shape`` and ``dtype`` None: any
    (a broadcast's non-root tells the root's in its opening agreement)."""
    if not (hasattr(out, "shape") and hasattr(out, "dtype")):
        raise TypeError(f"{argument} must be an array, not {type(out).__name__}")
    if isinstance(out, np.matrix):  # (2-D whatever it is reshaped to: a call's flat view of
        # it was a row, which took one element, and the ranks' calls disagreed)
        raise TypeError(f"{argument} is a numpy.matrix, which stays 2-D when flattened; pass "
                        f"its plain array ({argument}.A, or np.asarray({argument})), which "
                        "shares its memory")
    if isinstance(out, np.generic):  # (immutable: it cannot take the result)
        raise TypeError(f"{argument} is a numpy.{type(out).__name__} scalar, which cannot be "
                        "filled in place; pass an array (e.g. numpy.zeros((), "
                        f"{type(out).__name__})) or drop out= and use the returned value")
    if arrays is not None and not arrays.owns(out):
        raise TypeError(f"{argument} is a {type(out).__module__}.{type(out).__name__}; the "
                        f"inputs are {arrays.name} arrays, so pass one of those")
    if shape is not None and tuple(out.shape) != tuple(shape):
        raise ValueError(f"{argument} has shape {tuple(out.shape)}; the result has shape {shape}")
    if dtype is not None and np.dtype(out.dtype) != np.dtype(dtype):
        raise TypeError(f"{argument} has dtype {np.dtype(out.dtype)}; the result has dtype "
                        f"{np.dtype(dtype)}")
    if arrays is not None:
        contiguous, writable = arrays.contiguous(out), arrays.writable(out)
    else:
        flags = getattr(out, "flags", None)
        contiguous = flags is None or flags.c_contiguous
        writable = flags is None or flags.writeable
    if not contiguous:
        raise ValueError(f"{argument} is not C-contiguous; pass a contiguous array "
                         "(e.g. numpy.ascontiguousarray) to receive results")
    if not writable:
        raise ValueError(f"{argument} is read-only; pass a writable array")
    misplaced = getattr(arrays, "misplaced", None)  # (an array backend of another package's
    reason = misplaced(out) if misplaced is not None else None  # may not have the hook)
    if reason:
        raise ValueError(f"{argument} {reason}")


def check_function(value: Any, argument: str, what: str) -> Any:
    """``value``, where it can be called; else ``TypeError`` naming ``argument`` and saying
    it must be ``what`` (checked at once: called later, its error named nothing)."""
    if not callable(value):
        raise TypeError(f"{argument}={value!r} must be {what}")
    return value


def check_timeout(timeout: Any) -> float | None:
    """None (the communicator's default) or a positive number of seconds, returned as a
    Python float: every deadline is counted in those (a NumPy float16's or float32's sum with
    ``time.monotonic()``, seconds since boot, rounds to its own precision: float16 made it
    ``inf`` after 18 hours up, float32 a second off after 97 days)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer,
                                                             np.floating)):
        raise TypeError(f"timeout={timeout!r} must be a number of seconds (or None for the "
                        "communicator's default)")
    if not timeout > 0:
        raise ValueError(f"timeout={timeout!r} must be a positive number of seconds")
    try:  # (waits count in floats: an integer past them failed after the call went out)
        return float(timeout)
    except OverflowError:
        raise ValueError(f"timeout (an integer of {len(str(timeout))} digits) is too large for "
                         "a number of seconds: pass math.inf for no limit") from None


def check_default_timeout(timeout: Any) -> None:
    """A communicator's default deadline: a positive number of seconds (``math.inf``: none).
    Unlike a call's ``timeout``, None has no default to stand for."""
    if timeout is None:
        raise TypeError("timeout=None: a communicator's timeout is every call's default, a "
                        "number of seconds (pass math.inf for no limit)")
    check_timeout(timeout)


def check_flag(value: Any, argument: str) -> None:
    """True or False (a NumPy bool too): a string such as "no" must not read as True."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{argument}={value!r} must be True or False")


def hot_key(x: Any, op: Any, algorithm: Any) -> tuple:
    """The key of a signature's hot path: each argument by type and value (``spec_key``: a
    plain name is its own key; ``("native", 1.0)`` equals ``("native", 1)`` but is refused,
    and a key by value let it skip the checks once the other had run)."""
    return x.shape, x.dtype, spec_key(op), spec_key(algorithm)


def no_shards(shards: Any) -> bool:
    """Whether ``shards`` is the default 0 (None, 0.0 and False are refused by the checks)."""
    return type(shards) is int and shards == 0


def valid_timeout(timeout: Any) -> bool:
    """Whether ``check_timeout`` accepts ``timeout`` (whatever it raises: the call checks it
    again, where its error reaches the peers)."""
    try:
        check_timeout(timeout)
    except Exception:  # noqa: BLE001
        return False
    return True


def check_shards(shards: Any) -> int:
    if isinstance(shards, bool) or not isinstance(shards, (int, np.integer)) or shards < 0:
        raise ValueError(f"shards={shards!r} must be a non-negative integer (0: the default)")
    return int(shards)


@overload
def resolve_groups(groups: None, size: int) -> None: ...


@overload
def resolve_groups(groups: Sequence[Sequence[int]] | int, size: int) -> tuple[tuple[int, ...], ...]: ...


@overload
def resolve_groups(groups: Groups, size: int) -> tuple[tuple[int, ...], ...] | None: ...


def resolve_groups(groups: Groups, size: int) -> tuple[tuple[int, ...], ...] | None:
    """Groups for two-level algorithms: None, a group size, or a partition of the participants."""
    if groups is None:
        return None
    if isinstance(groups, (int, np.integer)) and not isinstance(groups, bool):
        if groups < 1:
            raise ValueError(f"groups={groups} must be a positive group size or a list of groups")
        return tuple(tuple(range(i, min(i + groups, size))) for i in range(0, size, groups))
    def member(p: Any) -> int:
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)):
            raise TypeError  # (a float, a string, ...: no participant)
        return int(p)

    try:
        if isinstance(groups, (str, bytes)):
            raise TypeError
        # a bool is no group size: iterating it raises the TypeError refused below
        out = tuple(tuple(member(p) for p in g) for g in groups)  # type: ignore[union-attr]
    except TypeError:
        raise TypeError(f"groups={groups!r} must be a group size or a list of lists of "
                        "participants (ints)") from None
    members = sorted(p for g in out for p in g)
    if members != list(range(size)) or any(len(g) == 0 for g in out):
        raise ValueError(f"groups={groups!r} must split the participants 0..{size - 1} into "
                         "non-empty groups, each participant in exactly one")
    return out


def check_groups(groups: Groups) -> None:
    """``groups`` checked where no participants are known (an empty batch): a group size, or
    a partition of as many participants as it names."""
    try:
        named = sum(len(group) for group in groups)  # type: ignore[union-attr, misc]
    except TypeError:  # (None, a group size, or no list of lists: resolve_groups says which)
        named = 1
    resolve_groups(groups, named)


def gather_axis(axis: int, shape: tuple[int, ...], argument: str = "arrays") -> int:
    """All-gather's ``axis`` for ``argument`` of ``shape`` (a scalar gathers as one element),
    checked and made non-negative."""
    base = shape if shape else (1,)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis={axis!r} must be an int (the dimension to gather along)")
    axis = int(axis)
    if not -len(base) <= axis < len(base):
        raise ValueError(f"axis={axis} is out of range for {argument} of {len(shape)} "
                         "dimensions")
    return axis % len(base)


def check_rows(shape: tuple[int, ...]) -> None:
    """Reduce-scatter splits axis 0 into blocks: arrays of ``shape`` must have one."""
    if not shape:
        raise ValueError("values are scalars; reduce_scatter splits axis 0, so pass arrays")
