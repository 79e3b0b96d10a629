"""Finding transports without importing them: the core names backends, backends plug in.

Backends register under the ``collectives.backends`` entry-point group (see pyproject.toml),
so the core never imports a transport module by itself; a backend whose arrays have
multi-device calls of their own (CuPy's) also says which arrays it owns, under
``collectives.device_arrays``, so that the core routes them without knowing their library.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache
from importlib.metadata import entry_points
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .runtime.execute.devices import DeviceBackend


@cache
def load_backend(name: str) -> ModuleType:
    """The module of an installed backend, found through the ``collectives.backends``
    entry points.

    Parameters
    ----------
    name
        ``"local"``, ``"mpi"``, ``"cupy"``, ``"nccl"`` or another installed backend.

    Returns
    -------
    types.ModuleType
        The backend's module (``init()``, ``run()``, ...).

    Raises
    ------
    ValueError
        No backend of that name is installed (the message lists those that are).
    """
    for ep in entry_points(group="collectives.backends"):
        if ep.name == name:
            return ep.load()
    try:  # a source checkout whose metadata is stale still finds the bundled backends
        return importlib.import_module(f"collectives.backends.{name}")
    except ModuleNotFoundError as exc:
        known = sorted(ep.name for ep in entry_points(group="collectives.backends"))
        raise ValueError(f"backend={name!r} is not installed; installed backends: {known}") from exc


@cache
def device_array_owners() -> tuple[tuple[str, Callable[[object], bool]], ...]:
    """``(backend, owns)`` for every installed backend whose arrays (not NumPy's) have
    multi-device calls of their own: the ``collectives.device_arrays`` entry points, each an
    ``owns(x)`` that says whether ``x`` is one of them without importing anything."""
    found = [(ep.name, ep.load()) for ep in entry_points(group="collectives.device_arrays")]
    if not found:  # a source checkout whose metadata is stale: the bundled ones
        found = [("cupy", importlib.import_module("collectives.backends.cupy.arrays").owns)]
    return tuple(found)


def owner_of(x: object) -> str | None:
    """The backend whose device arrays ``x`` is one of (None: NumPy, or any other)."""
    if isinstance(x, np.ndarray):
        return None
    for name, owns in device_array_owners():
        if owns(x):
            return name
    return None


def backend_for_arrays(values) -> DeviceBackend:
    """The multi-device backend for these arrays: the backend that owns them
    (``device_array_owners``: CuPy arrays go to the ``cupy`` backend), else the embedded one
    (NumPy). Every array must be of the same library."""
    owners = [owner_of(v) for v in values]
    for i, owner in enumerate(owners[1:], 1):
        if owner != owners[0]:
            raise TypeError(f"values[{i}] is a {type(values[i]).__module__}."
                            f"{type(values[i]).__name__} but values[0] is a "
                            f"{type(values[0]).__module__}.{type(values[0]).__name__}; one call "
                            "takes arrays of one library (move them with cupy.asarray or .get())")
    return load_backend(owners[0] if owners and owners[0] else "local").devices()
