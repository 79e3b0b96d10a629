"""The two ways of calling with other libraries' arrays: a Communicator method's ``x`` and
``out`` (``accepts_foreign``), and a multi-device function's list of them
(``accepts_foreign_values``): each adopted at the edge (``foreign``), and the result handed
back as the caller's type. NumPy arguments pass straight through, at the cost of one check.
"""

from __future__ import annotations

import functools
import inspect
import operator
from collections.abc import Callable
from typing import Any

from .arrays import kind_name, library_of
from .foreign import Edge, adopt, adopt_out, handed_back, is_foreign


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


def call_foreign(method: Callable, self: Any, x: Any, args: tuple, kwargs: dict) -> Any:
    """``method(self, x, *args, **kwargs)`` with ``x`` and ``out`` adopted at the edge, and the
    result (or the handle's) back as ``x``'s type; an ``out`` its kind refuses raises first."""
    out = kwargs.get("out")
    foreign_out = out is not None and is_foreign(out)
    if foreign_out:
        adopted_out = adopt_out(out, "out")
    edge = None
    if is_foreign(x):
        edge = Edge(x)
        x = edge.adopt(x, "x")
    if foreign_out:
        kwargs = {**kwargs, "out": adopted_out}
        result = method(self, x, *args, **kwargs)  # filled in place: the caller's own
        return None if result is None else handed_back(
            result, lambda r: None if r is None else filled(out, r))
    result = method(self, x, *args, **kwargs)
    if edge is None or edge.returner is None or result is None or out is not None:
        return result  # (a result written to a NumPy ``out`` is that array)
    return handed_back(result, edge.back)


def filled(out: Any, result: Any) -> Any:
    """The caller's ``out`` (an array or a list of them), filled with ``result`` (the library's
    view of it), handed back. On a GPU its library's current stream is first ordered after the
    call, as a fresh result's is: ``result`` goes back through the edge (whose DLPack
    handshake makes, e.g., PyTorch's current stream wait for the call's end) and is dropped."""
    edge = Edge(_first(out))
    if edge.gpu and edge.returner is not None:
        edge.back(result)
    return list(out) if isinstance(out, (list, tuple)) else out


def first_argument(function: Callable, name: str, args: tuple, kwargs: dict) -> tuple:
    """``(the first argument, the rest of args)``, where it may come by its own ``name`` (as
    the signature shows it: ``value_lists=``, ``value=``); taken out of ``kwargs``."""
    if args:
        return args[0], args[1:]
    if name in kwargs:
        return kwargs.pop(name), ()
    raise TypeError(f"{function.__name__}() missing its first argument: '{name}'")


def _first(values: Any) -> Any:
    """The first array of ``values`` (an array, or lists of them, as deep as they go)."""
    while isinstance(values, (list, tuple)) and values:
        values = values[0]
    return values


def _adopt_all(values: Any, argument: str) -> Any:
    if isinstance(values, (list, tuple)):
        return [_adopt_all(v, f"{argument}[{i}]") for i, v in enumerate(values)]
    return adopt(values, argument)


def _adopt_outs(out: Any, argument: str) -> Any:
    if isinstance(out, (list, tuple)):
        return [_adopt_outs(o, f"{argument}[{i}]") for i, o in enumerate(out)]
    return adopt_out(out, argument) if is_foreign(out) else out


def _refuse_mixed(values: Any, argument: str) -> None:
    """Every device brings one kind of array (the results go back as that kind)."""
    first, first_label = values, argument
    while isinstance(first, (list, tuple)) and first:
        first, first_label = first[0], f"{first_label}[0]"

    def visit(v: Any, label: str) -> None:
        if isinstance(v, (list, tuple)):
            for i, item in enumerate(v):
                visit(item, f"{label}[{i}]")
        elif type(v) is not type(first) and library_of(v) != library_of(first):
            raise TypeError(f"{label} is a {kind_name(v)} but {first_label} is a "
                            f"{kind_name(first)}; every device must bring the same kind of array")

    visit(values, argument)


def accepts_foreign_values(function: Callable) -> Callable:
    """Let a multi-device function take other libraries' arrays: a list of them as its first
    argument (or one, for broadcast and scatter; or a list of lists, for a batch); results
    come back as that type, each placed as the input of its device."""

    signature = inspect.signature(function)
    argument = next(iter(signature.parameters))  # values, value_lists

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        values, args = first_argument(function, argument, args, kwargs)
        out = kwargs.get("out")
        if not is_foreign(_first(values)) and not is_foreign(_first(out)):
            return function(values, *args, **kwargs)
        adopted_out = None if out is None else _adopt_outs(out, "out")
        _refuse_mixed(values, argument)
        edge = Edge(_first(values)) if is_foreign(_first(values)) else None
        if kwargs.get("shared_result") and edge is not None and edge.returner is not None and (
                edge.kind is None or edge.kind.out_refusal is None):
            # (handed back, the read-only views became writable tensors over one buffer: a
            # device's in-place step changed every device's result)
            raise ValueError(f"shared_result=True returns read-only views of one buffer, which "
                             f"{kind_name(_first(values))} arrays cannot be; drop it (each "
                             "device then gets a result of its own)")
        likes = _placed_as(signature, values, args, kwargs)
        values = _adopt_all(values, argument)
        if is_foreign(_first(out)):
            kwargs = {**kwargs, "out": adopted_out}
            result = function(values, *args, **kwargs)  # filled in place: the caller's own
            return handed_back(result, lambda r: filled(out, r))
        result = function(values, *args, **kwargs)
        if edge is None or edge.returner is None or out is not None:
            return result  # (results written to NumPy ``out`` arrays are those arrays)
        if likes and isinstance(likes[0], (list, tuple)):  # a batch: tensor k on device d
            return handed_back(result, lambda r: [edge.back_each(t, list(like))
                                              for t, like in zip(r, likes, strict=True)])
        if len(likes) == 1:  # (one result, a root's: placed as the root's input)
            return handed_back(result, lambda r: edge.back(r, likes[0]))
        return handed_back(result, lambda r: edge.back_each(r, likes))

    return wrapper


def _placed_as(signature: inspect.Signature, values: Any, args: tuple, kwargs: dict) -> list:
    """The arrays the results go back beside: the root's input for a rooted call's one result
    (``reduce``, ``gather``), the arrays ``devices`` lists where it lists them (``broadcast``,
    ``scatter``: "the arrays to place the copies beside"), else one per device, as the
    inputs (or none: the call's first array)."""
    given = signature.bind_partial(values, *args, **kwargs).arguments
    devices = given.get("devices")
    if isinstance(devices, (list, tuple)) and devices and is_foreign(devices[0]):
        return list(devices)
    if not isinstance(values, (list, tuple)):
        return []
    if "root" in signature.parameters and "devices" not in signature.parameters:
        root = given.get("root", signature.parameters["root"].default)
        try:
            at = operator.index(root)  # (a NumPy integer too)
        except TypeError:
            at = -1  # (the call refuses it)
        if 0 <= at < len(values):
            return [values[at]]
    return list(values)
