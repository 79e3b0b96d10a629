"""The pieces every multi-device function is built from: handing the call to the arrays'
backend where it runs calls its own way, checking the arrays, choosing the algorithm and its
schedule, the result buffers, and delivering results from work buffers."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, overload

import numpy as np

from .. import algorithms
from ..algorithms import select
from ..algorithms.base import Layout
from ..algorithms.cost import Placement
from ..algorithms.schedule import Collective
from ..arrays import unsafe_outputs
from ..compression import requested
from ..hints import Op
from ..ops import ReduceOp
from ..registry import backend_for_arrays
from ..runtime import tracing_devices
from ..runtime.calls import resolve_algorithm
from ..runtime.validate import as_array, check_op, check_out, check_shards, resolve_groups, same_layout
from ..runtime.work import Completed
from ..timeline import recorder


def backend_first(function: Callable) -> Callable:
    """A multi-device function whose arrays' backend may run the call its own way (the CuPy
    backend: NCCL for "nccl" names on distinct GPUs; handles that wait for the devices'
    streams), else the library's algorithms here. Adds ``async_op``: a handle whose ``wait()``
    returns the results. ``function.library`` is the library's own implementation, for
    backends that fall back to it."""

    @functools.wraps(function)
    def wrapper(values, *args, async_op: bool = False, **kwargs):
        if recorder.ON:  # the call as a span on every device's row
            return tracing_devices.device_call(function, values, args,
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

    wrapper.library = function  # type: ignore[attr-defined]
    return wrapper


def pick_algorithm(collective: Collective, algorithm: Any, size: int, nbytes: int,
                   model: select.CostModel, count: int = 0, shards: int = 0) -> tuple[str, int]:
    """``(canonical name, shards)`` that run a call: ``auto`` resolved by the cost model,
    spec forms by the element ``count``."""
    name, shards, _ = pick(collective, algorithm, size, nbytes, model, count, shards)
    return name, shards


def pick(collective: Collective, algorithm: Any, size: int, nbytes: int, model: Any,
         count: int = 0, shards: int = 0) -> tuple[str, int, Layout | None]:
    """`pick_algorithm`, with the groups of a two-level choice of ``auto`` (or None)."""
    name, shards = resolve_algorithm(algorithm, count, shards)
    if name == "auto":
        fabric = select.fabric_of(model)
        decision = select.decide(collective, size, nbytes, fabric,
                                 Placement(size, None, processes=False))
        return decision.name, decision.shards or shards, decision.layout
    if not algorithms.supports(collective, name):
        raise ValueError(f"algorithm={algorithm!r} has no {collective.value}; use 'auto' or one "
                         f"of {', '.join(algorithms.names_for(collective))}")
    return name, shards, None


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


def plan(backend, collective, algorithm, n, shape, dtype, shards=0, groups=None, root=0):
    count = math.prod(shape)
    nbytes = count * dtype.itemsize * (n if collective is Collective.ALL_GATHER else 1)
    name, shards, chosen = pick(collective, algorithm, n, nbytes, getattr(
        backend, "fabric", None) or backend.cost_model, count, check_shards(shards))
    layout = Layout(resolve_groups(groups, n)) if groups is not None else chosen
    shards = min(shards, max(count, 1))  # more sub-chunks than elements: pointless
    return algorithms.schedule(collective, name, n, root=root, shards=shards, layout=layout)


def outputs(arrays, out, values, shape, dtype, argument="out") -> list:
    if out is None:
        return [arrays.result(shape, dtype, like=v) for v in values]
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
        raise TypeError(f"{argument} must be a list of {len(values)} arrays, one per device")
    if len(out) != len(values):
        raise ValueError(f"{argument} has {len(out)} arrays for {len(values)} devices; pass one "
                         "per device")
    for i, o in enumerate(out):
        check_out(o, shape, dtype, f"{argument}[{i}]", arrays)
    return list(out)


def work_buffers(arrays, results, values, shape, dtype, given: bool = True):
    """Work buffers: the results themselves where that is safe and the dtype fits. Results the
    library allocated (``given`` False) share memory with nothing: no check needed."""
    if results[0].dtype != dtype or (given and unsafe_outputs(arrays, values, results)):
        return [arrays.result(shape, dtype, like=v) for v in values]
    return results


def deliver(arrays, op, work, results, size):
    """Results from work buffers: MEAN's one division, or a copy where work stood in."""
    for w, r in zip(work, results):
        if op is ReduceOp.MEAN:
            arrays.divide(w, size, out=r)
        elif w is not r:
            arrays.copy(r, w)
