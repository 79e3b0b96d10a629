"""Packing: batch one participant's many tensors into a few contiguous 1-D buffers.

A ``PackPlan`` depends only on the tensors' shapes and dtypes, so every participant of a
collective computes the same plan from its own (identically shaped) list. ``plan.pack(arrays)``
gives one buffer per ``Pack``; after the buffers are reduced, ``plan.unpack(buffers)``
returns the tensors in input order with input shapes.

Every pack holds one dtype. A pack is a list of pieces: element ranges ``[start, stop)`` of
its members' flattened arrays, concatenated in order. Whole-tensor plans use full ranges;
``concat_and_split`` cuts tensors at pack boundaries, so a tensor may span several packs.

Plans, after TensorFlow (see ``make_plan``):

* ``no_packing`` - every tensor alone;
* ``concat_and_split`` - TF's ``_ConcatAndSplitPacker`` (``num_packs``);
* ``aggregate_small`` - TF's ``AggregateSmallTensorPacker`` (``agg_small_grads_max_bytes``,
  ``agg_small_grads_max_group``), with ``extract_ranges`` reproduced exactly;
* ``group_by_size`` - TF's (>= 2.4) ``group_by_size`` (``bytes_per_pack``);
* ``fuse`` and ``runs`` (``fusion.py``) - fusion buckets (``bucket_bytes``), the default when
  no TensorFlow knob is given: Horovod's fusion buffer (64 MiB) and PyTorch DDP's gradient
  buckets (25 MiB) by another name.

Differences from TensorFlow, all so that mixed dtypes work (TF needs one dtype per batch):

* ``concat_and_split`` groups tensors by dtype (in order of first appearance) and splits
  each group into ``num_packs`` packs;
* ``aggregate_small`` counts any dtype as small when ``nbytes <= max_bytes`` (TF: float32
  only, ``4 * elements``), and a range joins only consecutive tensors of the same dtype;
* ``group_by_size`` also closes a pack when the dtype changes, so ``bytes_per_pack=0``
  gives one pack per run of equal dtypes (one pack when all dtypes agree);
* an empty tensor list gives a plan with no packs.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
from numpy.typing import DTypeLike

from .fusion import FIRST_BUCKET_BYTES, TAIL_BUCKET_BYTES, check_bucket_bytes, fuse, runs
from .pack_plan import Pack, PackPlan, no_packing, normalise_layout, whole_packs

__all__ = [
    "Pack",
    "PackPlan",
    "aggregate_small",
    "concat_and_split",
    "extract_ranges",
    "fuse",
    "runs",
    "group_by_size",
    "make_plan",
    "no_packing",
]

MAX_PACKS = 1024  # as many calls as an asynchronous batch may have in flight


def concat_and_split(shapes: Sequence[Sequence[int]], dtypes: Sequence[DTypeLike],
                     num_packs: int) -> PackPlan:
    """Per dtype, concatenate and cut into ``num_packs`` packs; the last takes the remainder.

    With ``total`` elements, packs hold ``total // num_packs`` elements, the last one
    ``total - (num_packs - 1) * (total // num_packs)`` (10 in 3 -> 3, 3, 4; 2 in 3 -> 0, 0, 2).
    """
    if num_packs <= 0:
        raise ValueError(f"num_packs must be greater than zero, not {num_packs}")
    if num_packs > MAX_PACKS:
        raise ValueError(f"num_packs={num_packs} is more than {MAX_PACKS} packs (each is a call, "
                         "and an asynchronous batch holds a handle for each); use fewer")
    shp, dts = normalise_layout(shapes, dtypes)
    groups: dict[np.dtype, list[int]] = {}
    for i, dt in enumerate(dts):
        groups.setdefault(dt, []).append(i)
    packs = []
    last = num_packs - 1
    for dt, members in groups.items():
        sizes = [prod(shp[i]) for i in members]
        total = sum(sizes)
        split = total // num_packs

        per_pack: list[list[tuple[int, int, int]]] = [[] for _ in range(num_packs)]
        offset = 0
        for i, size in zip(members, sizes, strict=True):
            lo, hi = offset, offset + size
            if size == 0:
                # An empty tensor still needs a pack (its result takes that buffer's dtype):
                # the one its offset falls in.
                per_pack[_pack_of(lo, split, last)].append((i, 0, 0))
            first, final = _pack_of(lo, split, last), _pack_of(hi - 1, split, last)
            for k in range(first, final + 1) if size else ():
                start, stop = max(lo, k * split), min(hi, total if k == last else (k + 1) * split)
                if start < stop:
                    per_pack[k].append((i, start - lo, stop - lo))
            offset = hi
        for pieces in per_pack:
            packs.append(Pack(tuple(p[0] for p in pieces), dt,
                              tuple((p[1], p[2]) for p in pieces)))
    return PackPlan(shp, dts, tuple(packs))


def _pack_of(element: int, split: int, last: int) -> int:
    """The pack that holds ``element`` where pack ``k`` holds ``[k * split, (k + 1) * split)``
    and the last one the rest (all of them, where ``split`` is 0)."""
    return min(element // split, last) if split else last


def extract_ranges(index_list: Sequence[int],
                   range_size_limit: int = 32) -> tuple[list[list[int]], list[int]]:
    """TF's ``extract_ranges``: runs of consecutive indices as ``[first, last]``, and singles.

    Exactly as TensorFlow, a run keeps growing while ``last - first <= range_size_limit``,
    so it can hold up to ``range_size_limit + 2`` indices (limit 1 on 0..4 -> [[0, 2], [3, 4]]).
    """
    ranges: list[list[int]] = []
    singles: list[int] = []
    if not index_list:
        return ranges, singles
    first = last = index_list[0]

    def close() -> None:
        if last > first:
            ranges.append([first, last])
        else:
            singles.append(first)

    for i in index_list[1:]:
        if i == last + 1 and last - first <= range_size_limit:
            last = i
        else:
            close()
            first = last = i
    close()
    return ranges, singles


def aggregate_small(shapes: Sequence[Sequence[int]], dtypes: Sequence[DTypeLike],
                    max_bytes: int, max_group: int) -> PackPlan:
    """TF's small-tensor aggregation: runs of small tensors become packs, the rest stay alone.

    Small means ``nbytes <= max_bytes``. Runs come from ``extract_ranges`` with limit
    ``max_group`` (so up to ``max_group + 2`` tensors each); an isolated small tensor is not
    packed. Packs are ordered as TensorFlow does: the runs first, then the unpacked tensors
    in input order.
    """
    if max_bytes <= 0 or max_group <= 0:
        raise ValueError(f"max_bytes ({max_bytes}) and max_group ({max_group}) must both be "
                         "greater than zero")
    shp, dts = normalise_layout(shapes, dtypes)
    small = [i for i in range(len(shp)) if prod(shp[i]) * dts[i].itemsize <= max_bytes]
    large = [i for i in range(len(shp)) if prod(shp[i]) * dts[i].itemsize > max_bytes]
    # A dtype change acts as a gap: extract_ranges then never joins across it, and on a
    # single-dtype list the result is exactly TensorFlow's.
    segments: list[list[int]] = []
    for i in small:
        if segments and segments[-1][-1] == i - 1 and dts[i] == dts[i - 1]:
            segments[-1].append(i)
        else:
            segments.append([i])
    ranges: list[list[int]] = []
    singles: list[int] = []
    for segment in segments:
        seg_ranges, seg_singles = extract_ranges(segment, range_size_limit=max_group)
        ranges += seg_ranges
        singles += seg_singles
    groups = [list(range(first, last + 1)) for first, last in ranges]
    groups += [[i] for i in sorted(large + singles)]
    return PackPlan(shp, dts, whole_packs(groups, shp, dts))


def group_by_size(shapes: Sequence[Sequence[int]], dtypes: Sequence[DTypeLike],
                  bytes_per_pack: int) -> PackPlan:
    """TF's ``group_by_size``: fill packs in order, closing one once it exceeds the target.

    A pack closes only when its bytes are strictly greater than ``bytes_per_pack``, or when
    the dtype changes; ``bytes_per_pack=0`` means no size limit.
    """
    if bytes_per_pack < 0:
        raise ValueError(f"bytes_per_pack must be 0 (one pack) or more, not {bytes_per_pack}")
    shp, dts = normalise_layout(shapes, dtypes)
    groups: list[list[int]] = []
    filled = 0
    for i in range(len(shp)):
        full = bytes_per_pack > 0 and filled > bytes_per_pack
        if not groups or full or dts[i] != dts[groups[-1][-1]]:
            groups.append([])
            filled = 0
        groups[-1].append(i)
        filled += prod(shp[i]) * dts[i].itemsize
    return PackPlan(shp, dts, whole_packs(groups, shp, dts))


def make_plan(shapes: Sequence[Sequence[int]], dtypes: Sequence[DTypeLike], *,
              num_packs: int = 0, agg_small_grads_max_bytes: int = 0,
              agg_small_grads_max_group: int = 10, bytes_per_pack: int | None = None,
              bucket_bytes: int = 0, alone_bytes: int | None = None,
              in_order: bool = False) -> PackPlan:
    """Choose a plan as TensorFlow did: num_packs, else small-tensor aggregation, else size;
    with none of those, fusion buckets of ``bucket_bytes`` (0: every tensor alone), tensors of
    ``alone_bytes`` or more alone (see ``fuse``); ``in_order``: runs of consecutive tensors
    with a small first bucket and shrinking last ones instead (``runs``, for buckets started
    as they become ready)."""
    # (as Python ints: a NumPy int8 num_packs made the plan's sums int8, which overflowed)
    num_packs = _check_whole(num_packs, "num_packs", "0 (no concat-and-split) or more")
    agg_small_grads_max_bytes = _check_whole(agg_small_grads_max_bytes,
                                             "agg_small_grads_max_bytes",
                                             "0 (no aggregation) or more")
    agg_small_grads_max_group = _check_whole(agg_small_grads_max_group,
                                             "agg_small_grads_max_group",
                                             "0 (as TensorFlow: no aggregation) or more")
    if bytes_per_pack is not None:
        bytes_per_pack = _check_whole(bytes_per_pack, "bytes_per_pack", "0 (one pack) or more")
    check_bucket_bytes(bucket_bytes)
    if num_packs > 0:
        return concat_and_split(shapes, dtypes, num_packs)
    if agg_small_grads_max_bytes > 0 and agg_small_grads_max_group > 0:
        return aggregate_small(shapes, dtypes, agg_small_grads_max_bytes,
                               agg_small_grads_max_group)
    if bytes_per_pack is not None:
        return group_by_size(shapes, dtypes, bytes_per_pack)
    if in_order:  # (as DDP: a tensor is copied into its bucket unless it fills one, since
        # each tensor sent alone between runs costs a call, and a small run of its own)
        return runs(shapes, dtypes, bucket_bytes, None, min(FIRST_BUCKET_BYTES, bucket_bytes),
                    min(TAIL_BUCKET_BYTES, bucket_bytes))
    return fuse(shapes, dtypes, bucket_bytes, alone_bytes)


def _check_whole(value: object, name: str, wanted: str) -> int:
    """``value`` as a Python int, where it is a whole number, 0 or more; else raise naming
    ``name`` (a float raised a bare TypeError deep in the plan, and True passed as 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r} must be a whole number, {wanted}")
    if value < 0:
        raise ValueError(f"{name} must be {wanted}, not {value}")
    return int(value)
