"""Multi-device gather, scatter and all-to-all: blocks copied between devices, no reduction.

They are plain copies on the backend (a device-to-device copy per block), in the order the
SPMD plans move them; no schedule is needed when one process holds every buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..foreign import accepts_foreign_values
from ..registry import backend_for_arrays
from ..runtime.validate import as_array, check_communicable, check_devices, check_root, same_layout
from .multi_device import backend_first


def _values(values: Any, argument: str = "values") -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{argument} must be a list with one array per device, "
                        f"not {type(values).__name__}")
    return [as_array(v, f"{argument}[{i}]") for i, v in enumerate(values)]


@accepts_foreign_values
@backend_first
def gather(values: Sequence, root: int = 0) -> Any:
    """Device ``root`` gets every device's array stacked along a new leading axis (row ``d``
    from device ``d``); ``all_gather`` concatenates instead."""
    values = _values(values)
    shape, dtype = same_layout(values)
    root = check_root(root, len(values))
    arrays = backend_for_arrays(values).arrays
    out = arrays.result((len(values), *shape), dtype, like=values[root])
    for d, v in enumerate(values):
        arrays.copy(out[d], v)
    return out


@accepts_foreign_values
@backend_first
def scatter(value: Any, devices: int | Sequence) -> list:
    """Device ``d`` gets row ``d`` of ``value`` (whose leading axis has one row per device);
    ``devices`` is a count or a list of arrays to place the rows beside."""
    value = as_array(value, "value")
    n = check_devices(devices)
    if not value.shape or value.shape[0] != n:
        raise ValueError(f"value has shape {tuple(value.shape)}; scatter needs a leading axis of "
                         f"{n} rows, one per device")
    check_communicable(np.dtype(value.dtype), "value")
    arrays = backend_for_arrays([value]).arrays
    likes = [None] * n if isinstance(devices, (int, np.integer)) else list(devices)
    results = [arrays.result(tuple(value.shape[1:]), value.dtype, like=like) for like in likes]
    for d, r in enumerate(results):
        arrays.copy(r, value[d])
    return results


@accepts_foreign_values
@backend_first
def all_to_all(values: Sequence) -> list:
    """Block ``j`` of device ``i``'s leading axis goes to device ``j``, as its block ``i``
    (the leading axis is cut into as many equal blocks as there are devices)."""
    values = _values(values)
    shape, dtype = same_layout(values)
    n = len(values)
    if not shape or shape[0] % n:
        raise ValueError(f"values have shape {shape}; all_to_all cuts the leading axis into {n} "
                         "equal blocks, so it must divide")
    rows = shape[0] // n
    arrays = backend_for_arrays(values).arrays
    results = [arrays.result(shape, dtype, like=v) for v in values]
    for i, v in enumerate(values):
        for j, r in enumerate(results):
            arrays.copy(r[i * rows:(i + 1) * rows], v[j * rows:(j + 1) * rows])
    return results
