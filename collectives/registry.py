"""Finding transports without importing them: the core names backends, backends plug in.

Backends register under the ``collectives.backends`` entry-point group (see pyproject.toml),
so the core never imports a transport module by itself.
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import entry_points
from types import ModuleType
from typing import TYPE_CHECKING

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


def backend_for_arrays(values) -> DeviceBackend:
    """The multi-device backend for these arrays: NumPy goes to the embedded backend, CuPy to
    the ``cupy`` backend where one is installed (else ``load_backend`` says it is missing).
    Every array must be of the same library."""
    kinds = [type(v).__module__.split(".")[0] for v in values]
    for i, kind in enumerate(kinds[1:], 1):
        if kind != kinds[0]:
            raise TypeError(f"values[{i}] is a {type(values[i]).__module__}."
                            f"{type(values[i]).__name__} but values[0] is a "
                            f"{type(values[0]).__module__}.{type(values[0]).__name__}; one call "
                            "takes arrays of one library (move them with cupy.asarray or .get())")
    if kinds and kinds[0] == "cupy":
        return load_backend("cupy").devices()
    return load_backend("local").devices()
