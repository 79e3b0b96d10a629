"""The two ways of calling with other libraries' arrays: a Communicator method's ``x`` and
``out`` (``accepts_foreign``), and a multi-device function's list of them
(``accepts_foreign_values``): each adopted at the edge (``foreign``), and the result handed
back as the caller's type. NumPy arguments pass straight through, at the cost of one check.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from .arrays import kind_name, library_of
from .foreign import Edge, adopt, handed_back, is_foreign, refuse_out


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
        refuse_out(out, "out")
    edge = None
    if is_foreign(x):
        edge = Edge(x)
        x = edge.adopt(x, "x")
    if foreign_out:
        kwargs = {**kwargs, "out": adopt(out, "out")}
        result = method(self, x, *args, **kwargs)  # filled in place: the caller's own
        return None if result is None else handed_back(result, lambda r: None if r is None else out)
    result = method(self, x, *args, **kwargs)
    if edge is None or edge.returner is None or result is None or out is not None:
        return result  # (a result written to a NumPy ``out`` is that array)
    return handed_back(result, edge.back)


def _first(values: Any) -> Any:
    """The first array of ``values`` (an array, or lists of them, as deep as they go)."""
    while isinstance(values, (list, tuple)) and values:
        values = values[0]
    return values


def _adopt_all(values: Any, argument: str) -> Any:
    if isinstance(values, (list, tuple)):
        return [_adopt_all(v, f"{argument}[{i}]") for i, v in enumerate(values)]
    return adopt(values, argument)


def _refuse_all(out: Any, argument: str) -> None:
    if isinstance(out, (list, tuple)):
        for i, o in enumerate(out):
            _refuse_all(o, f"{argument}[{i}]")
    elif is_foreign(out):
        refuse_out(out, argument)


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

    argument = next(iter(inspect.signature(function).parameters))  # values, value_lists

    @functools.wraps(function)
    def wrapper(values, *args, **kwargs):
        out = kwargs.get("out")
        if not is_foreign(_first(values)) and not is_foreign(_first(out)):
            return function(values, *args, **kwargs)
        _refuse_all(out, "out")
        _refuse_mixed(values, argument)
        edge = Edge(_first(values)) if is_foreign(_first(values)) else None
        likes = list(values) if isinstance(values, (list, tuple)) else []
        values = _adopt_all(values, argument)
        if is_foreign(_first(out)):
            kwargs = {**kwargs, "out": _adopt_all(out, "out")}
            result = function(values, *args, **kwargs)  # filled in place: the caller's own
            return handed_back(result, lambda _: list(out) if isinstance(out, (list, tuple)) else out)
        result = function(values, *args, **kwargs)
        if edge is None or edge.returner is None:
            return result
        if likes and isinstance(likes[0], (list, tuple)):  # a batch: tensor k on device d
            return handed_back(result, lambda r: [edge.back_each(t, list(like))
                                              for t, like in zip(r, likes, strict=True)])
        return handed_back(result, lambda r: edge.back_each(r, likes))

    return wrapper
