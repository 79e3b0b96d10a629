"""What a Communicator's call returns once its data has moved: one small record per kind of
result.

A call's method (``collectives.api.spmd_*``) checks its arguments, picks its buffers and
hands the engine its stages and one of these records; the engine calls the record when the
last stage is done (``Operation.finish``), so finishing a call never goes back into the API
wing. Each record keeps what it needs and nothing else, and ``late`` is the error of an
``out`` that could not take the result: the call ran with a buffer of its own (peers are not
left with half a collective) and the record raises it once the data has moved.

The same records finish prepared calls (``Communicator.all_reduce_init`` and the like), whose
``out`` is bound when they are made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..compression import decompress
from ..ops import ReduceOp
from .calls import Call


@dataclass(slots=True)
class Reduced:
    """All-reduce, and reduce on its root: the reduction in ``work``, in the call's dtype.

    MEAN divides once (into ``target``, else into ``work`` where the result's dtype is the
    same, else into a new array like ``like``); another op fills ``target`` from ``work``, or
    returns ``work`` as it is."""

    arrays: Any
    call: Call
    work: Any
    size: int
    target: Any = None
    late: BaseException | None = None
    like: Any = None

    def __call__(self) -> Any:
        arrays, call, work, target = self.arrays, self.call, self.work, self.target
        result = work
        if call.op is ReduceOp.MEAN:
            dest = target if target is not None else (
                work if call.final == call.dtype else arrays.result(call.shape, call.final,
                                                                    like=self.like))
            result = arrays.divide(work, self.size, out=dest)
        return delivered(arrays, result, target, self.late)


@dataclass(slots=True)
class Block:
    """Reduce-scatter: this rank's rows ``lo:hi`` of the reduction in ``work`` (MEAN divided
    once), into ``target`` or a new array of ``shape``."""

    arrays: Any
    call: Call
    work: Any
    size: int
    lo: int
    hi: int
    shape: tuple[int, ...]
    target: Any = None
    late: BaseException | None = None
    like: Any = None

    def __call__(self) -> Any:
        arrays, call, target = self.arrays, self.call, self.target
        block = self.work[self.lo:self.hi]
        if call.op is ReduceOp.MEAN:
            dest = target if target is not None else arrays.result(self.shape, call.final,
                                                                   like=self.like)
            result = arrays.divide(block, self.size, out=dest)
        else:
            result = target if target is not None else arrays.result(self.shape, call.dtype,
                                                                     like=self.like)
            arrays.copy(result, block)
        if self.late is not None:
            raise self.late
        return result


@dataclass(slots=True)
class Gathered:
    """All-gather: every rank's block in rank order in ``work``, joined along ``axis``.

    ``work`` is ``target`` itself (flat) where the blocks join along a leading axis (every
    axis before ``axis`` of length 1); otherwise its rows are concatenated along ``axis``."""

    arrays: Any
    work: Any
    size: int
    base: tuple[int, ...]  # one rank's block (a scalar as one element)
    axis: int
    gathered: tuple[int, ...]
    leading: bool
    target: Any = None
    late: BaseException | None = None

    def __call__(self) -> Any:
        if self.leading:
            result = self.work.reshape(self.gathered)
        else:
            rows = list(self.work.reshape((self.size, *self.base)))
            result = self.arrays.concatenate(rows, self.axis)
        return delivered(self.arrays, result, self.target, self.late)


@dataclass(slots=True)
class Stacked:
    """Gather on its root: the ranks' arrays stacked on a new leading axis."""

    work: Any
    shape: tuple[int, ...]  # (ranks, *one rank's shape)
    late: BaseException | None = None

    def __call__(self) -> Any:
        return self.work.reshape(self.shape)


@dataclass(slots=True)
class Decompressed:
    """A compressed all-reduce: the sum carried in a narrower float (``small``, MEAN's
    division already made before it moved) cast back into ``target`` or a new array."""

    arrays: Any
    small: Any
    shape: tuple[int, ...]
    dtype: Any
    like: Any
    target: Any = None
    late: BaseException | None = None

    def __call__(self) -> Any:
        result = self.target if self.target is not None else self.arrays.result(
            self.shape, self.dtype, like=self.like)
        decompress(self.arrays, self.small, result)
        if self.late is not None:
            raise self.late
        return result


@dataclass(slots=True)
class Ready:
    """A result that is whole once the data has moved (all-to-all's, a prepared call's
    ``out``); None on a rank that gets nothing (reduce and gather off their root)."""

    result: Any = None
    late: BaseException | None = None

    def __call__(self) -> Any:
        return self.result


def delivered(arrays: Any, result: Any, target: Any, late: BaseException | None) -> Any:
    """``result``, copied into ``target`` unless it is ``target`` (or a view of it); then the
    error of an ``out`` that could not take it (``late``), raised once the data has moved."""
    if target is not None and result is not target and result.base is not target:
        arrays.copy(target, result)
        result = target
    if late is not None:
        raise late
    return result
