"""Arrays of other libraries: adapted at the edge, once, through DLPack.

A PyTorch CPU tensor, a JAX array or anything else with ``__dlpack__`` (or ``__array__``) is
viewed as a NumPy array without a copy where its producer allows, goes through the collective,
and the result comes back as the caller's type where that type's library can rebuild it from
DLPack (``torch.from_dlpack``, ``jax.numpy.from_dlpack``); an ``out`` of the caller's type is
filled in place. Arrays whose DLPack device is a GPU go to the GPU backend the same way
(``collectives.backends.cupy.foreign``: CuPy arrays on the same memory), and their results
come back on their devices.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import numpy as np


def is_foreign(x: Any) -> bool:
    """Whether ``x`` is an array of another library, to be adapted (not NumPy, not None, and
    not CuPy: CuPy arrays have backends of their own, which take them as they are)."""
    return x is not None and not isinstance(x, np.ndarray) and (
        hasattr(x, "__dlpack__") or hasattr(x, "__array__")) and (
        type(x).__module__.partition(".")[0] != "cupy")


_GPU_DEVICES = (2, 10, 13)  # DLPack's CUDA, ROCm and CUDA managed memory


def on_gpu(x: Any) -> bool:
    """Whether a foreign array's memory is on a GPU (its DLPack device says so)."""
    device = getattr(x, "__dlpack_device__", None)
    if device is None:
        return False
    try:
        return int(device()[0]) in _GPU_DEVICES
    except Exception:  # noqa: BLE001 - a producer that cannot say is not one of ours
        return False


def _gpu():
    from .registry import load_backend

    return load_backend("cupy").foreign


def _adopt(x: Any, argument: str) -> Any:
    """``x`` as an array the library works on: NumPy, or CuPy for GPU memory."""
    return _gpu().adopt(x, argument) if on_gpu(x) else as_numpy(x, argument)


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
        gpu = on_gpu(first)
        if isinstance(values, (list, tuple)):
            values = [_adopt(v, f"values[{i}]") for i, v in enumerate(values)]
        else:
            values = _adopt(values, "value")
        out = kwargs.get("out")
        if isinstance(out, (list, tuple)) and out and is_foreign(out[0]):
            kwargs = {**kwargs, "out": [_adopt(o, f"out[{i}]") for i, o in enumerate(out)]}
            result = function(values, *args, **kwargs)  # filled in place: the caller's own
            return result if hasattr(result, "wait") else list(out)
        result = function(values, *args, **kwargs)
        if rebuild is None or hasattr(result, "wait"):  # a handle: its results stay NumPy/CuPy
            return result
        if gpu:
            return _gpu().hand_back(result, rebuild)
        return [rebuild(r) for r in result] if isinstance(result, list) else rebuild(result)

    return wrapper


def call_foreign(method: Callable, self: Any, x: Any, args: tuple, kwargs: dict) -> Any:
    rebuild, gpu = None, False
    if is_foreign(x):
        rebuild, gpu = rebuilder(x), on_gpu(x)
        x = _adopt(x, "x")
    out = kwargs.get("out")
    if is_foreign(out):
        kwargs = {**kwargs, "out": _adopt(out, "out")}
        result = method(self, x, *args, **kwargs)
        return out if result is not None and not hasattr(result, "wait") else result
    result = method(self, x, *args, **kwargs)
    if rebuild is None or result is None or hasattr(result, "wait"):
        return result
    if gpu:
        return _gpu().hand_back(result, rebuild)
    if isinstance(result, list):
        return [rebuild(r) for r in result]
    return rebuild(result)


@functools.cache
def _array_kinds() -> tuple:
    """The array kinds installed under the ``collectives.array_kinds`` entry points (each
    with ``detect(x)`` and the array operations packing needs)."""
    kinds = [ep.load() for ep in entry_points(group="collectives.array_kinds")]
    if not kinds:  # a source checkout whose metadata is stale: the bundled kinds
        kinds = [importlib.import_module("collectives.adapters.torch_arrays").ARRAYS]
    return tuple(kinds)


_REGISTERED: list = []  # kinds registered at run time (register_array_kind)


def register_array_kind(kind: Any) -> None:
    """Add an array kind: an object with ``detect(x)`` (whether ``x`` is one of its arrays)
    and the array operations packing needs on them (``owns``, ``dtype_of``, ``alone_bytes``,
    ``flat``, ``concatenate``, ``empty``, ``copy``, as ``collectives.arrays.ArrayBackend``). A batch of
    such arrays is then packed in their own library, and only the buckets cross over (through
    DLPack, as any array of another library does). Installed packages register under the
    ``collectives.array_kinds`` entry points instead."""
    if kind not in _REGISTERED:
        _REGISTERED.append(kind)


def array_kind(x: Any) -> Any:
    """The array kind (registered, or installed) that can pack ``x`` in its own library, or
    None."""
    for kind in (*_REGISTERED, *_array_kinds()):
        if kind.detect(x):
            return kind
    return None


class Edge:
    """How one call's arrays of another library cross into the library and back: each is
    adopted (``adopt``), each result goes back as the caller's type (``back``); ``arrays``:
    that library's own array kind, where one is installed, to pack a batch on its side."""

    def __init__(self, x: Any):
        self.rebuild, self.gpu, self.arrays = rebuilder(x), on_gpu(x), array_kind(x)

    @staticmethod
    def adopt(x: Any, argument: str) -> Any:
        return _adopt(x, argument)

    def back(self, result: Any) -> Any:
        if self.rebuild is None:
            return result
        return _gpu().hand_back(result, self.rebuild) if self.gpu else self.rebuild(result)
