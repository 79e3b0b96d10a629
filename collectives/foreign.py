"""Arrays of other libraries: adapted at the edge, once, through DLPack.

A PyTorch CPU tensor, a JAX array or anything else with ``__dlpack__`` (or ``__array__``) is
viewed as a NumPy array without a copy where its producer allows, goes through the collective,
and the result comes back as the caller's type where that type's library can rebuild it from
DLPack (``torch.from_dlpack``, ``jax.numpy.from_dlpack``); an ``out`` of the caller's type is
filled in place. GPU arrays belong to the GPU backends (CuPy), not here.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np


def is_foreign(x: Any) -> bool:
    """Whether ``x`` is an array of another library, to be adapted (not NumPy, not None, and
    not CuPy: CuPy arrays have backends of their own, which take them as they are)."""
    return x is not None and not isinstance(x, np.ndarray) and (
        hasattr(x, "__dlpack__") or hasattr(x, "__array__")) and (
        type(x).__module__.partition(".")[0] != "cupy")


def as_numpy(x: Any, argument: str) -> np.ndarray:
    """A NumPy view of ``x`` (a copy only where its producer cannot share memory)."""
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError, ValueError) as exc:
            device = getattr(x, "device", None)
            if device is not None and "cpu" not in str(device).lower():
                raise TypeError(f"{argument} lives on {device}; pass it to a GPU backend (CuPy: "
                                "cupy.from_dlpack) or move it to the CPU first") from exc
            if getattr(x, "requires_grad", False):
                raise TypeError(f"{argument} requires grad; pass {argument}.detach()") from exc
    try:
        return np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - the producer's message is the useful part
        raise TypeError(f"{argument} ({type(x).__name__}) cannot be read as an array: {exc}") \
            from exc


def rebuilder(x: Any) -> Callable[[Any], Any] | None:
    """How to turn a NumPy result back into ``x``'s type (None: leave it NumPy)."""
    package = type(x).__module__.split(".")[0]
    try:
        module = importlib.import_module(package)
    except ImportError:
        return None
    for candidate in (module, getattr(module, "numpy", None)):
        make = getattr(candidate, "from_dlpack", None)
        if make is not None:
            return make
    return None


def accepts_foreign(method: Callable) -> Callable:
    """Let a Communicator method take another library's arrays as ``x`` (first argument) and
    ``out``; NumPy arguments pass straight through."""

    @functools.wraps(method)
    def wrapper(self, x=None, *args, **kwargs):
        out = kwargs.get("out")
        if not is_foreign(x) and not is_foreign(out):
            return method(self, x, *args, **kwargs)
        return call_foreign(method, self, x, args, kwargs)

    return wrapper


def accepts_foreign_values(function: Callable) -> Callable:
    """Let a multi-device function take other libraries' arrays: a list of them as its first
    argument (or one, for broadcast and scatter); results come back as that type."""

    @functools.wraps(function)
    def wrapper(values, *args, **kwargs):
        first = values[0] if isinstance(values, (list, tuple)) and values else values
        if not is_foreign(first):
            return function(values, *args, **kwargs)
        rebuild = rebuilder(first)
        if isinstance(values, (list, tuple)):
            values = [as_numpy(v, f"values[{i}]") for i, v in enumerate(values)]
        else:
            values = as_numpy(values, "value")
        result = function(values, *args, **kwargs)
        if rebuild is None or hasattr(result, "wait"):  # a handle: its results stay NumPy
            return result
        return [rebuild(r) for r in result] if isinstance(result, list) else rebuild(result)

    return wrapper


def call_foreign(method: Callable, self: Any, x: Any, args: tuple, kwargs: dict) -> Any:
    rebuild = None
    if is_foreign(x):
        rebuild = rebuilder(x)
        x = as_numpy(x, "x")
    out = kwargs.get("out")
    if is_foreign(out):
        kwargs = {**kwargs, "out": as_numpy(out, "out")}
        result = method(self, x, *args, **kwargs)
        return out if result is not None and not hasattr(result, "wait") else result
    result = method(self, x, *args, **kwargs)
    if rebuild is None or result is None or hasattr(result, "wait"):
        return result
    if isinstance(result, list):
        return [rebuild(r) for r in result]
    return rebuild(result)
