"""The pieces every multi-device function is built from: handing the call to the arrays'
backend where it runs calls its own way, and checking the arrays. Choosing the algorithm and
its schedule, the result buffers and delivering results are the runtime's
(``collectives.runtime.execute.device_calls``); ``pick_algorithm`` is its choice without the
groups, for the benchmark's tables."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, overload

import numpy as np

from ..algorithms import select
from ..algorithms.schedule import Collective
from ..compression import requested
from ..hints import Op
from ..ops import ReduceOp
from ..registry import backend_for_arrays
from ..runtime.execute.device_calls import pick
from ..runtime.validate import as_array, check_op, same_layout
from ..runtime.work import Completed
from ..timeline import record_devices, recorder


def backend_first(function: Callable) -> Callable:
    """A multi-device function whose arrays' backend may run the call its own way (the CuPy
    backend: NCCL for "nccl" names on distinct GPUs; handles that wait for the devices'
    streams), else the library's algorithms here. Adds ``async_op``: a handle whose ``wait()``
    returns the results. A backend that checked a call and does not run it its own way hands
    it to the runtime's forms (``runtime.execute.device_calls``), never back to ``function``."""

    @functools.wraps(function)
    def wrapper(values, *args, async_op: bool = False, **kwargs):
        if recorder.ON:  # the call as a span on every device's row
            return record_devices.device_call(function, values, args,
                                               lambda: dispatch(values, args, async_op, kwargs))
        return dispatch(values, args, async_op, kwargs)

    def dispatch(values, args, async_op, kwargs):
        first = values[0] if isinstance(values, (list, tuple)) and values else values
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
                                                                 np.dtype, ReduceOp]]:
    """``prepare`` of every tensor of a batch (``value_lists[k]``: tensor ``k`` on every
    device), with the same checks and messages, the op parsed once and checked once per
    dtype (a gradient list has hundreds of tensors and one or two dtypes)."""
    checked: dict[np.dtype, ReduceOp] = {}
    prepared = []
    for k, values in enumerate(value_lists):
        argument = f"value_lists[{k}]"
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(f"{argument} must be a list with one array per device, "
                            f"not {type(values).__name__}")
        kind: Any = type(values[0]) if len(values) else None
        if kind is not None and _plain_array_type(kind) and all(
                type(v) is kind for v in values):
            values = list(values)  # (arrays of one plain type: as_array would return each)
        else:
            values = [as_array(v, f"{argument}[{i}]") for i, v in enumerate(values)]
        first = values[0] if values else None
        shape, dtype = (first.shape, first.dtype) if first is not None else ((), None)
        if first is not None and isinstance(dtype, np.dtype) and not dtype.hasobject and all(
                v.shape == shape and v.dtype == dtype for v in values):
            shape = tuple(shape)  # (one layout: what same_layout returns, without its walk)
        else:
            shape, dtype = same_layout(values, argument)
        parsed = checked.get(dtype)
        if parsed is None:
            parsed = checked[dtype] = check_op(op, dtype, argument)
        prepared.append((values, shape, dtype, parsed))
    return prepared


@functools.cache
def _plain_array_type(kind: Any) -> bool:
    """Whether ``as_array`` returns instances of ``kind`` as they are: a class with ``shape``
    and ``dtype`` of its own, NumPy's ndarray itself but none of its subclasses."""
    return (hasattr(kind, "shape") and hasattr(kind, "dtype")
            and (kind is np.ndarray or not issubclass(kind, np.ndarray)))


@overload
def prepare(values: Any, op: None, argument: str = ...
            ) -> tuple[list[Any], tuple[int, ...], np.dtype, None]: ...
@overload
def prepare(values: Any, op: Op, argument: str = ...
            ) -> tuple[list[Any], tuple[int, ...], np.dtype, ReduceOp]: ...
def prepare(values: Any, op: Op | None, argument: str = "values"
            ) -> tuple[list[Any], tuple[int, ...], np.dtype, ReduceOp | None]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{argument} must be a list with one array per device, "
                        f"not {type(values).__name__}")
    values = [as_array(v, f"{argument}[{i}]") for i, v in enumerate(values)]
    shape, dtype = same_layout(values, argument, op)
    op = check_op(op, dtype, argument) if op is not None else None
    return values, shape, dtype, op
