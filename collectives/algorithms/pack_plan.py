"""A packing plan and how it moves tensors: ``PackPlan.pack`` makes each pack's buffer and
``PackPlan.unpack`` gives the tensors back from the reduced buffers (views where a tensor lies
in one buffer). The plans themselves are made in ``collectives.algorithms.packing`` and ``fusion``; the
simplest, every tensor alone (``no_packing``), is here.

Where every tensor lies whole in one pack (fusion's plans), packing and unpacking go through
the array backend's ``fuse`` and ``split``: one pass over memory, or one kernel launch, per
pack, and one call for all of a pack's views, so that a batch of many small tensors costs
little per tensor.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Pack:
    """One buffer: pieces ``spans[k]`` of the flattened inputs ``indices[k]``, concatenated."""

    indices: tuple[int, ...]
    dtype: np.dtype
    spans: tuple[tuple[int, int], ...]
    size: int = field(init=False)  # elements in the buffer (read at every pack and unpack)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", sum(stop - start for start, stop in self.spans))


@dataclass(frozen=True)
class PackPlan:
    """How a list of tensors of ``shapes`` and ``dtypes`` maps onto ``packs``."""

    shapes: tuple[Shape, ...]
    dtypes: tuple[np.dtype, ...]
    packs: tuple[Pack, ...]

    def __post_init__(self) -> None:
        # A hand-built plan must still cover every element exactly once, or unpack would
        # return garbage; the constructors below always pass this check.
        if len(self.shapes) != len(self.dtypes):
            raise ValueError(f"got {len(self.shapes)} shapes but {len(self.dtypes)} dtypes")
        spans: list[list[tuple[int, int]]] = [[] for _ in self.shapes]
        for k, pack in enumerate(self.packs):
            if len(pack.indices) != len(pack.spans):
                raise ValueError(f"pack {k} has {len(pack.indices)} indices but "
                                 f"{len(pack.spans)} spans")
            for i, span in zip(pack.indices, pack.spans, strict=True):
                if not 0 <= i < len(self.shapes) or self.dtypes[i] != pack.dtype:
                    raise ValueError(f"pack {k} (dtype {pack.dtype}) cannot hold tensor {i}")
                spans[i].append(span)
        for i, shape in enumerate(self.shapes):
            covered = 0
            for start, stop in sorted(spans[i]):
                if start != covered or stop < start:
                    break
                covered = stop
            else:
                if spans[i] and covered == prod(shape):
                    continue
            raise ValueError(f"the packs do not cover tensor {i} (shape {shape}) exactly once")

    @cached_property
    def places(self) -> tuple[tuple[tuple[int, int, int, int], ...], ...]:
        """Where each tensor's pieces lie: ``(pack, offset in it, start, stop)`` per piece."""
        places: list[list[tuple[int, int, int, int]]] = [[] for _ in self.shapes]
        for k, pack in enumerate(self.packs):
            offset = 0
            for i, (start, stop) in zip(pack.indices, pack.spans, strict=True):
                places[i].append((k, offset, start, stop))
                offset += stop - start
        return tuple(tuple(p) for p in places)

    @cached_property
    def whole(self) -> bool:
        """Whether every tensor lies whole in one pack (fusion's plans, and no packing)."""
        return all(len(p) == 1 for p in self.places)

    def pack(self, tensors: Sequence[ArrayLike], *, copy: bool = False, arrays: Any = None,
             validated: bool = False, into: Sequence[Any] | None = None) -> list:
        """One contiguous 1-D buffer per pack; inputs are never modified.

        A buffer made of a single piece of a contiguous input is a view of it (the
        collectives never write their inputs); pass ``copy=True`` for fresh buffers
        throughout. ``arrays``: the array backend of the tensors (NumPy by default).
        ``validated``: the tensors are that backend's arrays of the plan's shapes and dtypes.
        ``into``: per pack, ``(bucket, views)`` to fill instead of a new bucket (or None): a
        bucket of the pack's dtype and size and its views shaped as the pack's tensors, for
        validated tensors of a whole plan (``reuse.BucketKeeper``'s).
        """
        if len(tensors) != len(self.shapes):
            raise ValueError(f"the plan is for {len(self.shapes)} tensors, got {len(tensors)}")
        flats: dict[int, Any] = {}
        return [self.pack_one(k, tensors, copy=copy, arrays=arrays, flats=flats,
                              validated=validated, into=None if into is None else into[k])
                for k in range(len(self.packs))]

    def pack_one(self, k: int, tensors: Sequence[Any], *, copy: bool = False,
                 arrays: Any = None, flats: dict[int, Any] | None = None,
                 validated: bool = False, into: Any = None) -> Any:
        """Pack ``k``'s buffer, from ``tensors`` (every tensor of the plan, by index; only
        pack ``k``'s members are read). ``flats``: 1-D views already made, by index.
        ``into``: the bucket to fill (see ``pack``)."""
        arrays = arrays or _numpy()
        pack = self.packs[k]
        if validated and self.whole and (copy or len(pack.indices) > 1):
            members = [tensors[i] for i in pack.indices]  # (one pass, or launch)
            if into is None:
                return arrays.fuse(members)
            bucket, views = into
            return arrays.fuse(members, out=bucket, views=views)
        flats = {} if flats is None else flats
        pieces = []
        for i, (start, stop) in zip(pack.indices, pack.spans, strict=True):
            flat = flats.get(i)
            if flat is None:
                arr = tensors[i]
                if not arrays.owns(arr):
                    arr = np.asarray(arr)
                if tuple(arr.shape) != self.shapes[i] or arrays.dtype_of(arr) != self.dtypes[i]:
                    raise ValueError(f"tensor {i} has shape {tuple(arr.shape)} and dtype "
                                     f"{arr.dtype}; the plan expects {self.shapes[i]} and "
                                     f"{self.dtypes[i]}")
                flat = flats[i] = arrays.flat(arr)
            pieces.append(flat if start == 0 and stop == flat.shape[0] else flat[start:stop])
        if len(pieces) == 1 and not copy:
            return pieces[0]
        if pieces:
            return arrays.concatenate(pieces, 0)
        like = next(iter(flats.values()), None)
        if like is None and tensors and arrays.owns(tensors[0]):
            like = tensors[0]
        return arrays.empty((0,), pack.dtype, like=like)

    def unpack(self, buffers: Sequence[ArrayLike], *, arrays: Any = None,
               views: dict[int, Sequence[Any]] | None = None) -> list:
        """The tensors in input order and shapes; each takes the dtype of its (first) buffer.

        A tensor that lies within one buffer is returned as a view of that buffer. ``views``:
        for a whole plan, pack ``k``'s views already made (a kept bucket's), used as they are.
        """
        arrays = arrays or _numpy()
        if len(buffers) != len(self.packs):
            raise ValueError(f"the plan has {len(self.packs)} packs, got {len(buffers)} buffers")
        flat_bufs = []
        buf: Any  # an array of any library
        for k, (pack, buf) in enumerate(zip(self.packs, buffers, strict=True)):
            if not arrays.owns(buf):
                buf = np.asarray(buf)
            buf = buf if len(buf.shape) == 1 else buf.reshape(-1)
            if buf.shape[0] != pack.size:
                raise ValueError(f"buffer {k} has {buf.shape[0]} elements; pack {k} has "
                                 f"{pack.size}")
            flat_bufs.append(buf)
        out: list = [None] * len(self.shapes)
        if self.whole:  # every pack's views at once
            given = views or {}
            for k, (pack, buf) in enumerate(zip(self.packs, flat_bufs)):
                made = given.get(k)
                if made is None:
                    made = arrays.split(buf, [self.shapes[i] for i in pack.indices])
                for i, view in zip(pack.indices, made):
                    out[i] = view
            return out
        for i, shape in enumerate(self.shapes):
            pieces = [p for p in self.places[i] if p[3] > p[2]] or self.places[i][:1]
            if len(pieces) == 1:
                k, offset, start, stop = pieces[0]
                view = flat_bufs[k][offset:offset + stop - start]
                out[i] = view if len(shape) == 1 else view.reshape(shape)  # (1-D: as is)
                continue
            # Spread over several buffers (concat_and_split): assemble a fresh array.
            first = flat_bufs[pieces[0][0]]
            result = arrays.empty((prod(shape),), first.dtype, like=first)
            for k, offset, start, stop in pieces:
                arrays.copy(result[start:stop], flat_bufs[k][offset:offset + stop - start])
            out[i] = result.reshape(shape)
        return out


def normalise_layout(shapes: Sequence[Sequence[int]],
                     dtypes: Sequence[DTypeLike]) -> tuple[tuple[Shape, ...], tuple[np.dtype, ...]]:
    """Shapes as tuples of ints and dtypes as NumPy dtypes, or raise naming what is wrong."""
    if len(shapes) != len(dtypes):
        raise ValueError(f"got {len(shapes)} shapes but {len(dtypes)} dtypes")
    norm_shapes = []
    for i, shape in enumerate(shapes):
        dims = tuple(operator.index(d) for d in shape)
        if any(d < 0 for d in dims):
            raise ValueError(f"shape {i} {dims} has a negative dimension")
        norm_shapes.append(dims)
    return tuple(norm_shapes), tuple(np.dtype(d) for d in dtypes)


def whole_packs(groups: Sequence[Sequence[int]], shapes: Sequence[Shape],
                dtypes: Sequence[np.dtype]) -> tuple[Pack, ...]:
    """One pack per group of tensor indices, each tensor whole in it."""
    return tuple(Pack(tuple(g), dtypes[g[0]], tuple((0, prod(shapes[i])) for i in g))
                 for g in groups)


def no_packing(shapes: Sequence[Sequence[int]], dtypes: Sequence[DTypeLike]) -> PackPlan:
    """Every tensor in a pack of its own."""
    shp, dts = normalise_layout(shapes, dtypes)
    return PackPlan(shp, dts, whole_packs([[i] for i in range(len(shp))], shp, dts))


def _numpy():
    from ..arrays import NUMPY

    return NUMPY
