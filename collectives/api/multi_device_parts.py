"""The pieces every multi-device function is built from: handing the call to the arrays'
backend where it runs calls its own way, and checking the arrays. Choosing the algorithm and
its schedule, the result buffers and delivering results are the runtime's
(``collectives.runtime.execute.device_calls``); ``pick_algorithm`` is its choice without the
groups, for the benchmark's tables."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, overload

import numpy as np

from ..algorithms import select
from ..algorithms.schedule import Collective
from ..compression import requested
from ..foreign_calls import first_argument
from ..hints import Op
from ..log import configure_once
from ..ops import ReduceOp
from ..registry import backend_for_arrays
from ..runtime.execute.device_calls import pick
from ..runtime.validate import as_array, check_flag, check_op, same_layout
from ..runtime.work import Completed
from ..timeline import record_devices, recorder
from ..widened import integer_mean, widened_values


def backend_first(function: Callable) -> Callable:
    """A multi-device function whose arrays' backend may run the call its own way (the CuPy
    backend: NCCL for "nccl" names on distinct GPUs; handles that wait for the devices'
    streams), else the library's algorithms here. Adds ``async_op``: a handle whose ``wait()``
    returns the results. A backend that checked a call and does not run it its own way hands
    it to the runtime's forms (``runtime.execute.device_calls``), never back to ``function``."""

    first_name = next(iter(inspect.signature(function).parameters))  # (values, value_lists)

    @functools.wraps(function)
    def wrapper(*args, async_op: bool = False, **kwargs):
        values, args = first_argument(function, first_name, args, kwargs)
        check_flag(async_op, "async_op")
        configure_once()  # (COLLECTIVES_DEBUG: where no communicator is made, never read)
        if recorder.ON:  # the call as a span on every device's row
            return record_devices.device_call(function, values, args, kwargs,
                                               lambda: dispatch(values, args, async_op, kwargs))
        return dispatch(values, args, async_op, kwargs)

    def dispatch(values, args, async_op, kwargs):
        first = values  # (the first array: a batch's first list holds it)
        while isinstance(first, (list, tuple)) and first:
            first = first[0]
        if not requested(kwargs.get("compression")):
            kwargs.pop("compression", None)  # (a backend's own functions never compress)
        if first is not None and not isinstance(first, np.ndarray) and hasattr(first, "shape"):
            runner = backend_for_arrays([first]).own(function.__name__)
            if runner is not None and "compression" not in kwargs:
                return runner(values, *args, async_op=async_op, **kwargs)
        result = function(values, *args, **kwargs)
        return Completed(result) if async_op else result

    return wrapper


__all__ = ["backend_first", "pick_algorithm", "prepare", "prepare_batch"]


def pick_algorithm(collective: Collective, algorithm: Any, size: int, nbytes: int,
                   model: select.CostModel, count: int = 0, shards: int = 0) -> tuple[str, int]:
    """``(canonical name, shards)`` that run a call: ``auto`` resolved by the cost model,
    spec forms by the element ``count``."""
    name, shards, _ = pick(collective, algorithm, size, nbytes, model, count, shards)
    return name, shards


def prepare_batch(value_lists: Sequence, op: Op) -> list[tuple[list[Any], tuple[int, ...],
                                                                 np.dtype, ReduceOp | None]]:
    """``prepare``'s checks of every tensor of a batch (``value_lists[k]``: tensor ``k`` on
    every device): arrays of one plain type and one layout are taken as they are, the op
    checked once per dtype (a gradient list has hundreds of tensors and one or two dtypes);
    any other tensor goes through the checks and messages of ``prepare``. An integer MEAN's
    tensors stay integers: their packs are widened as each is reduced, and travel as they
    are (widened first, they joined the float64 packs, which a compression rounds)."""
    checked: dict[np.dtype, ReduceOp] = {}
    prepared = []
    for k, values in enumerate(value_lists):
        argument = f"value_lists[{k}]"
        layout = _one_layout(values)
        if layout is None:
            values, shape, dtype, parsed = checked_values(values, op, argument)
        else:
            shape, dtype = layout
            parsed = checked.get(dtype)
            if parsed is None:
                parsed = checked[dtype] = check_op(op, dtype, argument)
        prepared.append((list(values), shape, dtype, parsed))
    return prepared


def _one_layout(values: Any) -> tuple[tuple[int, ...], np.dtype] | None:
    """``(shape, dtype)`` where ``values`` is a non-empty list of arrays of one plain type
    (``as_array`` would return each as it is) sharing one shape and a communicable NumPy
    dtype; else None."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        return None
    first = values[0]
    kind: Any = type(first)
    if not _plain_array_type(kind):
        return None
    shape, dtype = first.shape, first.dtype
    if not isinstance(dtype, np.dtype) or dtype.hasobject or not all(
            type(v) is kind and v.shape == shape and v.dtype == dtype for v in values):
        return None
    return tuple(shape), dtype


@functools.cache
def _plain_array_type(kind: Any) -> bool:
    """Whether ``as_array`` returns instances of ``kind`` as they are: a class with ``shape``
    and ``dtype`` of its own, NumPy's ndarray itself but none of its subclasses."""
    return (hasattr(kind, "shape") and hasattr(kind, "dtype")
            and (kind is np.ndarray or not issubclass(kind, np.ndarray)))


@overload
def prepare(values: Any, op: None, argument: str = ..., *, reducing: bool = ...
            ) -> tuple[list[Any], tuple[int, ...], np.dtype, None]: ...
@overload
def prepare(values: Any, op: Op, argument: str = ..., *, reducing: bool = ...
            ) -> tuple[list[Any], tuple[int, ...], np.dtype, ReduceOp]: ...
def prepare(values: Any, op: Op | None, argument: str = "values", *, reducing: bool = True
            ) -> tuple[list[Any], tuple[int, ...], np.dtype, ReduceOp | None]:
    """``values`` as arrays of one shape and dtype, and ``op`` parsed for that dtype;
    ``reducing=False``: a collective with no op (``op`` None)."""
    values, shape, dtype, parsed = checked_values(values, op, argument, reducing=reducing)
    if parsed is None or not integer_mean(parsed, dtype):
        return values, shape, dtype, parsed
    return widened_values(backend_for_arrays(values).arrays, values, shape, dtype, parsed)


def checked_values(values: Any, op: Op | None, argument: str, *, reducing: bool = True
                   ) -> tuple[list[Any], tuple[int, ...], np.dtype, ReduceOp | None]:
    """``prepare``'s checks: ``values`` as arrays of one shape and dtype, ``op`` parsed for
    that dtype (an integer MEAN's values not widened yet)."""
    if reducing and op is None:
        ReduceOp.parse(op)  # type: ignore[arg-type]  # (raises naming op: None passed the checks)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{argument} must be a list with one array per device, "
                        f"not {type(values).__name__}")
    values = [as_array(v, f"{argument}[{i}]") for i, v in enumerate(values)]
    shape, dtype = same_layout(values, argument, op)
    return values, shape, dtype, check_op(op, dtype, argument) if op is not None else None
