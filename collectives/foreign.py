"""Arrays of other libraries: adapted at the edge, once, through DLPack.

A PyTorch CPU tensor, a JAX array or anything else with ``__dlpack__`` (or ``__array__``) is
viewed as a NumPy array without a copy where its producer allows, goes through the collective,
and the result comes back as the caller's type: through its array kind's ``back`` where one is
installed (``collectives.adapters.jax_arrays``: ``jax.numpy.from_dlpack``), else where the
type's library can rebuild it from DLPack (``torch.from_dlpack``). An ``out`` of the caller's
type is filled in place, unless its kind refuses one (JAX arrays are immutable); an
asynchronous call's handle hands its result back the same way. Arrays whose DLPack device is a
GPU go to the GPU backend the same way (``collectives.backends.cupy.foreign``: CuPy arrays on
the same memory), and their results come back on their devices.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .array_kinds import (  # noqa: F401 (re-exported)
    PACKING,
    Back,
    HostView,
    Kind,
    array_kind,
    check_kind,
    host_view,
    kind_of,
    register_array_kind,
)
from .registry import owner_of


def is_foreign(x: Any) -> bool:
    """Whether ``x`` is an array of another library, to be adapted (not NumPy, not None, and
    not an installed backend's own device arrays, such as CuPy's: those backends take them as
    they are; ``registry.owner_of``)."""
    return x is not None and not isinstance(x, (np.ndarray, np.generic)) and (
        hasattr(x, "__dlpack__") or hasattr(x, "__array__")) and owner_of(x) is None


_GPU_DEVICES = (2, 10, 13)  # DLPack's CUDA, ROCm and CUDA managed memory


def on_gpu(x: Any, kind: Kind | None = None) -> bool:
    """Whether a foreign array's memory is on a GPU: ``kind``'s ``on_gpu`` says, where it has
    one (PyTorch's ``__dlpack_device__`` costs microseconds), else its DLPack device."""
    if kind is not None and kind.on_gpu is not None:
        return kind.on_gpu(x)
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


def adopt(x: Any, argument: str, kind: Kind | None = None) -> Any:
    """``x`` as an array the library works on: NumPy, or CuPy for GPU memory; ``kind``:
    ``x``'s array kind, where the caller has looked it up."""
    kind = kind_of(x) if kind is None else kind
    if on_gpu(x, kind):
        return _gpu().adopt(x, argument)
    return as_numpy(x, argument, None if kind is None else kind.as_numpy)


def attribute(x: Any, name: str) -> Any:
    """``x``'s attribute ``name``, None where it has none or reading it raises (a deleted JAX
    array's ``device`` raises RuntimeError, and so does a nested tensor's ``shape``: a
    getattr default covers AttributeError alone, and the error escaped the refusal)."""
    try:
        return getattr(x, name, None)
    except Exception:  # noqa: BLE001 - whatever its library raises: no such attribute here
        return None


def has_attribute(x: Any, name: str) -> bool:
    """Whether ``x`` has an attribute ``name``; one whose reading raises counts (a nested
    tensor's ``shape``: it is an array, named where it is read; ``hasattr`` let the error
    out, past the refusal)."""
    try:
        getattr(x, name)
    except AttributeError:
        return False
    except Exception:  # noqa: BLE001 - its library's error: the attribute is there
        return True
    return True


def as_numpy(x: Any, argument: str, view: Callable[[Any], np.ndarray] | None = None) -> np.ndarray:
    """A NumPy view of ``x`` (a copy only where its producer cannot share memory); ``view``:
    its array kind's own way to one (``as_numpy``: PyTorch's bfloat16, which NumPy's DLPack
    import refuses), else ``np.from_dlpack``."""
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x) if view is None else view(x)
        except (BufferError, TypeError, RuntimeError, ValueError) as exc:
            device = attribute(x, "device")
            if str(device) == "meta":
                raise TypeError(f"{argument} is a meta tensor, which holds no data; pass one "
                                "that does") from exc
            if device is not None and not _on_host(x, device):
                raise TypeError(f"{argument} lives on {device}; pass it to a GPU backend (CuPy: "
                                "cupy.from_dlpack) or move it to the CPU first") from exc
            if attribute(x, "requires_grad"):
                raise TypeError(f"{argument} requires grad; pass {argument}.detach()") from exc
    try:
        return np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - the producer's message is the useful part
        raise TypeError(f"{argument} ({type(x).__name__}) cannot be read as an array: {exc}") \
            from exc


def _on_host(x: Any, device: Any) -> bool:
    """Whether ``x``, on ``device``, lives in host memory: a CPU device, or a JAX array
    sharded over CPU devices alone (its ``device`` is the sharding; NumPy reads it whole)."""
    if "cpu" in str(device).lower():
        return True
    devices = attribute(x, "devices")
    try:
        return callable(devices) and all(getattr(d, "platform", "") == "cpu" for d in devices())
    except Exception:  # noqa: BLE001 - a producer that cannot say is not on the host
        return False


# --- array kinds (``array_kinds``), re-exported for the callers of this module ---------------

@functools.cache
def _from_dlpack(package: str) -> Callable[[Any], Any] | None:
    """The ``from_dlpack`` of ``package`` (``torch.from_dlpack``), or None."""
    try:
        module = importlib.import_module(package)
    except ImportError:
        return None
    for candidate in (module, getattr(module, "numpy", None)):
        make = getattr(candidate, "from_dlpack", None)
        if make is not None:
            return make
    return None


def _returner(x: Any, kind: Kind | None = None) -> Back | None:
    """How a NumPy (or CuPy) result goes back to ``x``'s type (None: it stays as it is);
    ``kind``: ``x``'s array kind, where the caller has looked it up."""
    kind = kind_of(x) if kind is None else kind
    if kind is not None and kind.back is not None:
        return kind.back
    make = _from_dlpack(type(x).__module__.partition(".")[0])
    return None if make is None else lambda result, _: make(result)


def _call_back(back: Back, like: Any, result: Any) -> Any:
    return back(result, like)


def refuse_out(out: Any, argument: str) -> None:
    """Raise TypeError where ``out`` is an array kind that cannot be written in place (JAX).
    (A NumPy scalar, immutable too, is NumPy's: ``check_out`` refuses it.)"""
    kind = kind_of(out)
    if kind is not None and kind.out_refusal is not None:
        name = getattr(kind.kind, "name", type(out).__module__.partition(".")[0])
        raise TypeError(f"{argument} is a {name} array ({type(out).__name__}), which cannot be "
                        f"filled in place: {kind.out_refusal}; drop out= and use the returned "
                        f"{'arrays' if argument.startswith('out[') else 'array'} instead")


def adopt_out(out: Any, argument: str) -> Any:
    """``out`` adopted as the memory the call fills: an array kind that cannot be filled in
    place is refused (``refuse_out``), and so is one whose library hands over a copy each time
    it is read (a TensorFlow variable, any ``__array__`` that copies): filled, the copy was
    dropped, and ``out`` kept its old values without a word."""
    refuse_out(out, argument)
    kind = kind_of(out)
    adopted = adopt(out, argument, kind)
    # (an array kind's own way across shares memory: PyTorch's; others are read twice)
    if kind is None and isinstance(adopted, np.ndarray) and adopted.size and \
            not np.shares_memory(adopted, adopt(out, argument, kind)):
        raise TypeError(f"{argument} ({type(out).__name__}) cannot be filled in place: its "
                        "library hands over a copy of its memory each time; drop out= and use "
                        "the returned array (for a TensorFlow variable: variable.assign(it))")
    return adopted


# --- the edge of a call -----------------------------------------------------------------------


class Edge:
    """How one call's arrays of another library cross into the library and back: each is
    adopted (``adopt``), each result goes back as the caller's type (``back``); ``arrays``:
    that library's own array kind, where one is installed that packs, to pack a batch on its
    side."""

    def __init__(self, x: Any):
        kind = kind_of(x)
        self.like, self.gpu, self.kind = x, on_gpu(x, kind), kind
        self.arrays = kind.kind if kind is not None and kind.packs else None
        self.returner = _returner(x, kind)

    def adopt(self, x: Any, argument: str) -> Any:
        return adopt(x, argument, self.kind if x is self.like else None)

    def back(self, result: Any, like: Any = None) -> Any:
        """``result`` (an array, a list of them, or None) as the caller's type, placed as
        ``like`` is (by default the call's first array)."""
        back = self.returner
        if back is None or result is None:
            return result
        if isinstance(result, list):
            return [self.back(r, like) for r in result]
        like = self.like if like is None else like
        if self.gpu:
            return _gpu().hand_back(result, functools.partial(_call_back, back, like))
        return back(result, like)

    def back_each(self, result: Any, likes: list) -> Any:
        """A list result whose items go back placed as ``likes`` (one per device)."""
        if isinstance(result, list) and len(result) == len(likes):
            return [self.back(r, like) for r, like in zip(result, likes, strict=True)]
        return self.back(result)


class HandedBack:
    """The handle of an asynchronous call on another library's arrays, with `Work`'s methods:
    ``wait()`` returns the result as the caller's type (``back`` of what the inner handle
    returns), once."""

    __slots__ = ("_back", "_handle", "_outcome")

    def __init__(self, handle: Any, back: Callable[[Any], Any]):
        self._handle, self._back = handle, back
        self._outcome: tuple | None = None

    def wait(self, timeout: float | None = None) -> Any:
        """The result, as the blocking call would have returned it (see ``Work.wait``)."""
        if self._outcome is None:
            self._outcome = (self._back(self._handle.wait(timeout)),)
        return self._outcome[0]

    def is_completed(self) -> bool:
        return self._handle.is_completed()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        """``callback(this handle)`` once the call has finished (see
        `Work.add_done_callback`): its ``wait()`` then gives the caller's type at once."""
        if not callable(callback):  # (wrapped, the inner handle's check passed anything; as
            # runtime.work.callable_callback says it, which this base module cannot import)
            raise TypeError(f"callback={callback!r} must be a function of the handle (called "
                            "with it once the call has finished)")
        self._handle.add_done_callback(lambda _inner: callback(self))

    def reported_elsewhere(self) -> None:
        reported = getattr(self._handle, "reported_elsewhere", None)
        if reported is not None:
            reported()

    def exception(self) -> BaseException | None:
        return self._handle.exception()

    @property
    def description(self) -> str:
        return self._handle.description

    def __repr__(self) -> str:
        return repr(self._handle)


def handed_back(result: Any, back: Callable[[Any], Any]) -> Any:
    """``back(result)``, or a handle whose ``wait()`` does it where ``result`` is one."""
    return HandedBack(result, back) if hasattr(result, "wait") else back(result)
