"""The pieces the CuPy backend's multi-device calls are made of: checking CuPy arrays,
which request names NCCL (``nccl_request``, ``use_nccl``), result buffers, delivering results
from work buffers, and handles whose ``wait()`` waits for the devices' streams. The runners
(``runners.py``) and the public functions (``api.py``, ``api_moves.py``) share them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast, overload

import numpy as np

from collectives.ops import ReduceOp
from collectives.runtime.calls import resolve_algorithm
from collectives.runtime.execute import DeviceBackend
from collectives.runtime.execute.device_calls import apart_outputs
from collectives.runtime.validate import as_array, check_op, check_out, resolve_groups, same_layout
from collectives.widened import widened_values

from . import group
from .devices import devices as _devices
from .probe import NcclUnavailableError, cupy_module, nccl_module
from .work import DeviceWork


def gpu_arrays():
    return _devices().arrays


@overload
def prepare(values: Any, op: None, argument: str = ..., *, reducing: bool = ...
             ) -> tuple[Sequence, tuple[int, ...], np.dtype, None]: ...
@overload
def prepare(values: Any, op: ReduceOp | str, argument: str = ..., *, reducing: bool = ...
             ) -> tuple[Sequence, tuple[int, ...], np.dtype, ReduceOp]: ...
def prepare(values: Any, op: ReduceOp | str | None, argument: str = "values", *,
            reducing: bool = True) -> tuple[Sequence, tuple[int, ...], np.dtype, ReduceOp | None]:
    """As the core's ``multi_device_parts.prepare``, for CuPy arrays only."""
    if reducing and op is None:
        ReduceOp.parse(op)  # type: ignore[arg-type]  # (raises naming op: None passed the checks)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{argument} must be a list with one CuPy array per device, "
                        f"not {type(values).__name__}")
    ndarray = cupy_module().ndarray
    for i, v in enumerate(values):
        if not isinstance(v, ndarray):
            as_array(v, f"{argument}[{i}]")  # None, a list of arrays: its own message
            raise TypeError(
                f"{argument}[{i}] is a {type(v).__module__}.{type(v).__name__}; these calls "
                "take CuPy arrays only (NumPy arrays and CuPy arrays cannot be mixed): move it "
                "with cupy.asarray under its device, or call collectives.all_reduce on NumPy "
                "arrays")
    shape, dtype = same_layout(values, argument)
    op = check_op(op, dtype, argument) if op is not None else None
    arrays = gpu_arrays()  # no GPU visible: raise here, before anything else
    return widened_values(arrays, list(values), shape, dtype, op)  # (integer MEAN: float64)


def library_devices() -> DeviceBackend:
    """The devices the library's algorithms run on (the rounds strategy: no ``map_parallel``,
    which only the tiles strategy of host memory calls)."""
    return cast(DeviceBackend, _devices())


def nccl_request(algorithm: Any, count: int) -> str | None:
    """``"nccl"``, ``"nccl/X"`` (X canonical), ``"auto"``, or None (a library algorithm)."""
    if isinstance(algorithm, str) and ":" not in algorithm and "#" not in algorithm:
        text = algorithm.strip().lower()
        if text in ("auto", "collective"):
            return "auto"
        if text == "nccl":
            return "nccl"
        if text.startswith("nccl/"):
            return "nccl/" + resolve_algorithm(text.split("/", 1)[1], count, 0)[0]
        return None
    name, _ = resolve_algorithm(algorithm, count, 0, ("nccl",))  # spec forms: by count
    return "nccl" if name == "nccl" else None


def use_nccl(request: str | None, values: Sequence, dtype: np.dtype, op: ReduceOp | None,
              groups: Any = None, argument: str = "values") -> bool:
    """Whether NCCL runs this call; raises where NCCL was asked for and cannot be (naming the
    arrays as ``argument``)."""
    if request is None or (request == "auto" and len(values) < 2):
        return False
    if request == "auto":
        if len({v.device.id for v in values}) < len(values):
            return False  # logical devices share a GPU: the library's algorithms
        try:
            return group.supports(dtype, op)
        except (ImportError, NcclUnavailableError):
            return False
    nccl_module()  # raises, naming the wheel, where NCCL is missing
    if not group.supports(dtype, op):
        return False  # no exact NCCL form: the library's algorithms run it
    if request == "nccl" or groups is None:
        group.distinct_devices(values, argument)
    else:
        layout = resolve_groups(groups, len(values))
        assert layout is not None  # groups is not None
        for members in layout:
            group.distinct_devices([values[p] for p in members], argument, members)
    return True


def handle(result: Any, arrays_out: Sequence, description: str, async_op: bool) -> Any:
    if not async_op:
        return result
    return DeviceWork(result, [a.device.id for a in arrays_out if a is not None], description)


def outputs(arrays, out, values, shape, dtype, same_results=True) -> list:
    if out is None:
        return [arrays.result(shape, dtype, like=v) for v in values]
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence) or len(out) != len(values):
        raise TypeError(f"out must be a list of {len(values)} CuPy arrays, one per device")
    for i, (o, v) in enumerate(zip(out, values)):
        check_out(o, shape, dtype, f"out[{i}]", arrays)
        if o.device.id != v.device.id:
            raise ValueError(f"out[{i}] is on GPU {o.device.id} but values[{i}] on GPU "
                             f"{v.device.id}; each result stays on its input's device")
    return apart_outputs(arrays, list(out), same_results=same_results)


def deliver(arrays, op, work, results, n) -> None:
    for w, r in zip(work, results):
        if op is ReduceOp.MEAN:
            arrays.divide(w, n, out=r.reshape(-1))
        elif w is not r and w.data.ptr != r.data.ptr:
            arrays.copy(r.reshape(-1), w)
