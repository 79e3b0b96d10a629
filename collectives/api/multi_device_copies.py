"""Multi-device gather, scatter and all-to-all: blocks copied between devices, no reduction.

They are plain copies on the backend (a device-to-device copy per block), in the order the
SPMD plans move them; no schedule is needed when one process holds every buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, cast, overload

import numpy as np

from ..foreign_calls import accepts_foreign_values
from ..hints import ArrayT
from ..registry import backend_for_arrays
from ..runtime.execute import DeviceBackend
from ..runtime.validate import as_array, check_communicable, check_devices, check_root, same_layout
from ..runtime.work import Work
from .multi_device_parts import backend_first


def _values(values: Any, argument: str = "values") -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{argument} must be a list with one array per device, "
                        f"not {type(values).__name__}")
    return [as_array(v, f"{argument}[{i}]") for i, v in enumerate(values)]


@overload
def gather(values: Sequence[ArrayT], root: int = ..., *,
           async_op: Literal[False] = ...) -> ArrayT: ...
@overload
def gather(values: Sequence[ArrayT], root: int = ..., *,
           async_op: Literal[True]) -> Work[ArrayT]: ...
@accepts_foreign_values
@backend_first
def gather(values: Sequence[ArrayT], root: int = 0, *, async_op: bool = False) -> ArrayT:
    """Device ``root`` gets every device's array stacked along a new leading axis (row ``d``
    from device ``d``); ``all_gather`` concatenates instead.

    Parameters
    ----------
    values
        One array per device, all of one shape and dtype.
    root
        The device that gets the stack.
    async_op
        Return a `Work` handle whose ``wait()`` returns the result instead.

    Returns
    -------
    ArrayT
        The stack, on device ``root``, of shape ``(devices, *shape)``.

    Raises
    ------
    TypeError
        ``values`` is not a list of arrays of one dtype.
    ValueError
        Arrays of different shapes, or a ``root`` that is no device.
    """
    values = _values(values)
    shape, dtype = same_layout(values)
    root = check_root(root, len(values))
    arrays = cast(DeviceBackend, backend_for_arrays(values)).arrays
    out = arrays.result((len(values), *shape), dtype, like=values[root])
    for d, v in enumerate(values):
        arrays.copy(out[d, ...], v)  # (a view, also where each value is 0-d)
    return out


@overload
def scatter(value: ArrayT, devices: int | Sequence[Any], *,
            async_op: Literal[False] = ...) -> list[ArrayT]: ...
@overload
def scatter(value: ArrayT, devices: int | Sequence[Any], *,
            async_op: Literal[True]) -> Work[list[ArrayT]]: ...
@accepts_foreign_values
@backend_first
def scatter(value: ArrayT, devices: int | Sequence[Any], *, async_op: bool = False) -> list[ArrayT]:
    """Device ``d`` gets row ``d`` of ``value``.

    Parameters
    ----------
    value
        An array whose leading axis has one row per device.
    devices
        How many devices, or a list of arrays (one per device) to place the rows beside.
    async_op
        Return a `Work` handle whose ``wait()`` returns the results instead.

    Returns
    -------
    list
        Row ``d`` of ``value`` on device ``d``.

    Raises
    ------
    TypeError
        ``value`` is not an array, or holds Python objects.
    ValueError
        The leading axis does not have one row per device.
    """
    value = as_array(value, "value")
    n = check_devices(devices)
    if not value.shape or value.shape[0] != n:
        raise ValueError(f"value has shape {tuple(value.shape)}; scatter needs a leading axis of "
                         f"{n} rows, one per device")
    check_communicable(np.dtype(value.dtype), "value")
    arrays = cast(DeviceBackend, backend_for_arrays([value])).arrays
    likes = [None] * n if isinstance(devices, (int, np.integer)) else list(devices)
    results = [arrays.result(tuple(value.shape[1:]), value.dtype, like=like) for like in likes]
    rows: Any = value  # (an array of the backend's library, which indexes it by row)
    for d, r in enumerate(results):
        arrays.copy(r, rows[d])
    return results


@overload
def all_to_all(values: Sequence[ArrayT], *, async_op: Literal[False] = ...) -> list[ArrayT]: ...
@overload
def all_to_all(values: Sequence[ArrayT], *, async_op: Literal[True]) -> Work[list[ArrayT]]: ...
@accepts_foreign_values
@backend_first
def all_to_all(values: Sequence[ArrayT], *, async_op: bool = False) -> list[ArrayT]:
    """Block ``j`` of device ``i``'s leading axis goes to device ``j``, as its block ``i``.

    Parameters
    ----------
    values
        One array per device, all of one shape and dtype, whose leading axis is cut into as
        many equal blocks as there are devices.
    async_op
        Return a `Work` handle whose ``wait()`` returns the results instead.

    Returns
    -------
    list
        On device ``j``, block ``j`` of every device's array, in device order.

    Raises
    ------
    TypeError
        ``values`` is not a list of arrays of one dtype.
    ValueError
        Arrays of different shapes, or a leading axis the device count does not
        divide.
    """
    values = _values(values)
    shape, dtype = same_layout(values)
    n = len(values)
    if not shape or shape[0] % n:
        raise ValueError(f"values have shape {shape}; all_to_all cuts the leading axis into {n} "
                         "equal blocks, so it must divide")
    rows = shape[0] // n
    arrays = cast(DeviceBackend, backend_for_arrays(values)).arrays
    results = [arrays.result(shape, dtype, like=v) for v in values]
    for i, v in enumerate(values):
        for j, r in enumerate(results):
            arrays.copy(r[i * rows:(i + 1) * rows], v[j * rows:(j + 1) * rows])
    return results
