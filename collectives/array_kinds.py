"""Array kinds: what the library uses of each other library's arrays, read from its kind.

An array kind (``register_array_kind``, or installed under the ``collectives.array_kinds``
entry points: ``collectives.adapters.torch_arrays``, ``jax_arrays``) says which arrays are
its own (``detect``) and, optionally, how results go back to its type, how one of its host
arrays is viewed as NumPy, whether one is on a GPU, why it refuses an ``out=``, and how to pack
a batch in its own library. ``collectives.foreign`` crosses arrays at the edge with them.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, NamedTuple

import numpy as np

Back = Callable[[Any, Any], Any]  # (a NumPy or CuPy result, the caller's array) -> its type


class Kind(NamedTuple):
    """What the library uses of an array kind, read from it once: ``kind`` itself, whether it
    ``packs`` batches in its own library, how results go ``back`` to its type (None: through
    its package's ``from_dlpack``), why it refuses an ``out=`` (None: it takes one), how one
    of its CPU arrays is viewed as NumPy (``as_numpy``; None: ``np.from_dlpack``) and whether
    one is on a GPU (``on_gpu``; None: its DLPack device says)."""

    kind: Any
    packs: bool
    back: Back | None
    out_refusal: str | None
    as_numpy: Callable[[Any], np.ndarray] | None
    on_gpu: Callable[[Any], bool] | None


def _declared(kind: Any) -> Kind:
    return Kind(kind, hasattr(kind, "concatenate"), *(
        getattr(kind, name, None) for name in ("back", "out_refusal", "as_numpy", "on_gpu")))


# what a kind that packs batches in its own library provides (``ArrayBackend``'s names)
PACKING = ("owns", "dtype_of", "alone_bytes", "flat", "concatenate", "fuse", "split", "empty", "copy")


def check_kind(kind: Any, argument: str = "kind") -> None:
    """Raise TypeError, naming what is missing, where ``kind`` is not an array kind (see
    ``register_array_kind``): checked when it is given, not at a later call's first array."""
    need = ("an array kind is an object with a method detect(x) (whether x is one of its arrays), "
            "and optionally back(result, like), as_numpy(x), on_gpu(x), out_refusal (a str) and, "
            "to pack batches in its own library, all of " + ", ".join(PACKING))
    if isinstance(kind, type):
        raise TypeError(f"{argument} is the class {kind.__name__}, not an array kind; pass an "
                        f"instance ({kind.__name__}()): {need}")
    if not callable(getattr(kind, "detect", None)):
        raise TypeError(f"{argument} ({type(kind).__name__}) has no method detect(x); {need}")
    packing = [name for name in PACKING if callable(getattr(kind, name, None))]
    if packing and len(packing) < len(PACKING):
        missing = [name for name in PACKING if name not in packing]
        raise TypeError(f"{argument} ({type(kind).__name__}) packs batches ({', '.join(packing)})"
                        f" but lacks {', '.join(missing)}; {need}")
    for name in ("back", "as_numpy", "on_gpu", "out_refusal"):
        value, text = getattr(kind, name, None), name == "out_refusal"
        if value is not None and not (isinstance(value, str) if text else callable(value)):
            raise TypeError(f"{argument}.{name} is a {type(value).__name__}, not a "
                            f"{'str' if text else 'method'}; {need}")


@functools.cache
def _array_kinds() -> tuple:
    """The array kinds installed under the ``collectives.array_kinds`` entry points."""
    kinds = [ep.load() for ep in entry_points(group="collectives.array_kinds")]
    if not kinds:  # a source checkout whose metadata is stale: the bundled kinds
        kinds = [importlib.import_module(f"collectives.adapters.{name}").ARRAYS
                 for name in ("torch_arrays", "jax_arrays")]
    return tuple(kinds)


_REGISTERED: list = []  # kinds registered at run time (register_array_kind)


@functools.cache
def _kinds() -> tuple[Kind, ...]:
    return tuple(_declared(kind) for kind in (*_REGISTERED, *_array_kinds()))


def register_array_kind(kind: Any) -> None:
    """Add an array kind: an object with ``detect(x)`` (whether ``x`` is one of its arrays)
    and, each optional:

    * all of the array operations packing needs on its arrays (``owns``, ``dtype_of``,
      ``alone_bytes``, ``flat``, ``concatenate``, ``fuse``, ``split``, ``empty``, ``copy``,
      as ``collectives.arrays.ArrayBackend``): a batch of them is then packed in their own
      library, and only the buckets cross over (through DLPack). Without them each array
      crosses over on its own and the library packs;
    * ``back(result, like)``: ``result`` (a NumPy or CuPy array) as one of its arrays, placed
      as ``like`` (the caller's array) is; without it, its package's ``from_dlpack(result)``;
    * ``out_refusal``: a reason its arrays cannot be an ``out=`` (``"JAX arrays are
      immutable"``); such an ``out=`` raises TypeError before any data moves;
    * ``as_numpy(x)``: a NumPy view of one of its CPU arrays (without it,
      ``np.from_dlpack(x)``): PyTorch's views its bfloat16 tensors, which NumPy cannot import;
    * ``on_gpu(x)``: whether ``x``'s memory is on a GPU (without it, its DLPack device says).

    Installed packages register under the ``collectives.array_kinds`` entry points instead.

    Raises
    ------
    TypeError
        ``kind`` is a class, lacks ``detect``, has some packing operations but not all, or
        an optional attribute of the wrong type (checked here, not inside a later call)."""
    check_kind(kind)
    if kind not in _REGISTERED:
        _REGISTERED.append(kind)
        _kinds.cache_clear()
        _VIEWED.clear()


def kind_of(x: Any) -> Kind | None:
    """The array kind (registered, or installed) that claims ``x``, or None."""
    for kind in _kinds():
        if kind.kind.detect(x):
            return kind
    return None


class HostView(NamedTuple):
    """An array kind's own way across for its host arrays (``host_view``)."""

    kind: Any
    on_gpu: Callable[[Any], bool]
    as_numpy: Callable[[Any], np.ndarray]
    back: Back
    takes_out: bool  # whether one of its arrays may be an ``out=`` (no ``out_refusal``)


_VIEWED: dict[type, HostView | None] = {}  # host_view's answers, by type


def host_view(x: Any) -> HostView | None:
    """How ``x`` crosses where its array kind declares its own way for host arrays
    (``as_numpy``, ``back`` and ``on_gpu``: PyTorch's): a call may view ``x`` and hand its
    result back without the edge's general steps; None: the edge's way (``call_foreign``)."""
    way = _VIEWED.get(x.__class__, _UNSEEN)
    if way is _UNSEEN:
        kind = kind_of(x)
        way = _VIEWED[x.__class__] = (
            HostView(kind.kind, kind.on_gpu, kind.as_numpy, kind.back, kind.out_refusal is None)
            if kind is not None and kind.as_numpy and kind.back and kind.on_gpu else None)
    return way if way is not None and way.kind.detect(x) else None


_UNSEEN: Any = object()


def viewed_in_place(given: Any, argument: str) -> Any:
    """``given`` as a NumPy view of its memory, for a call that reads or writes it in place,
    where it is a host array whose kind declares its own way across and takes an ``out=`` (a
    PyTorch CPU tensor, bfloat16 too); anything else as it is, for the caller's checks."""
    way = host_view(given) if given is not None else None
    if way is None or not way.takes_out or way.on_gpu(given):
        return given
    try:
        return way.as_numpy(given)
    except (BufferError, RuntimeError) as exc:  # (a tensor that requires grad, or with a
        text = str(exc)                         # lazy conjugate or negation)
        fix = ("resolve_conj()" if "conjugate" in text else "resolve_neg()" if "negative" in text
               else "detach()")
        raise TypeError(f"{argument} cannot be viewed in place ({text}); pass "
                        f"{argument}.{fix}") from exc


def array_kind(x: Any) -> Any:
    """The array kind that can pack ``x`` in its own library, or None."""
    kind = kind_of(x)
    return kind.kind if kind is not None and kind.packs else None
