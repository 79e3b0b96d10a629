"""Transports, imported on first use: ``collectives.backends.local`` (embedded, the default:
nothing beyond NumPy), ``collectives.backends.mpi`` (mpi4py), and any other installed under the
``collectives.backends`` entry-point group."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # ``import collectives`` alone makes ``collectives.backends.mpi`` reachable: the
    # submodule is imported (and MPI initialised) only when first named.
    if name.startswith("_"):
        raise AttributeError(name)
    from collectives.registry import load_backend

    try:
        return load_backend(name)
    except ValueError as exc:
        raise AttributeError(str(exc)) from None


def __dir__() -> list[str]:
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group="collectives.backends")} | {"local"})


