"""Fusion buckets: a tensor list packed into buckets of a few MiB, for one call each.

``fuse`` fills each dtype's buckets in input order, as Horovod's fusion buffer does (64 MiB);
``runs`` makes buckets of consecutive tensors, as DDP's reducer does for a list in the order
its tensors become ready (25 MiB, a small first bucket so that communication starts early,
and shrinking last ones). A tensor as large as a bucket travels alone, as itself (no copy).
``packing.make_plan`` chooses between them and TensorFlow's plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
from numpy.typing import DTypeLike

from .pack_plan import PackPlan, no_packing, normalise_layout, whole_packs

# The default fusion bucket: Horovod's fusion threshold (HOROVOD_FUSION_THRESHOLD, 64 MiB);
# DDP's bucket_cap_mb is 25 MiB. Larger buckets mean fewer calls; smaller ones start earlier
# when buckets are started as their tensors become ready (``Communicator.buckets``).
DEFAULT_BUCKET_BYTES = 64 << 20
# Buckets started as their tensors become ready (``Communicator.buckets``) are sized as DDP's:
# 25 MiB (its bucket_cap_mb), the first 1 MiB (so that communication starts early)
OVERLAP_BUCKET_BYTES = 25 << 20
FIRST_BUCKET_BYTES = 1 << 20
# ... and the last ones shrink: a bucket holds at most half the bytes from its first tensor to
# the list's end, down to this size. The last bucket starts only when the backward pass ends,
# and everything in it is communication the step waits for: halving keeps that tail small
# for a few more calls (ResNet-50 at 6 MiB: 12 buckets instead of 7; docs/performance.md).
TAIL_BUCKET_BYTES = 256 << 10




def check_bucket_bytes(bucket_bytes: object) -> None:
    """``bucket_bytes`` is a whole number of bytes, 0 or more, or raise naming it."""
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, (int, np.integer)):
        raise TypeError(f"bucket_bytes={bucket_bytes!r} must be a whole number of bytes (for "
                        "64 MiB: 64 << 20), or 0 for no fusion")
    if bucket_bytes < 0:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be 0 (no fusion) or more bytes")


def fuse(shapes: Sequence[Sequence[int]], dtypes: Sequence[DTypeLike],
         bucket_bytes: int, alone_bytes: int | None = None) -> PackPlan:
    """Fusion buckets: each dtype's tensors, in input order, fill buckets of at most
    ``bucket_bytes``; a tensor that would overflow the open bucket starts the next one, and a
    tensor of ``alone_bytes`` (default: ``bucket_bytes``) or more travels alone (a view of it:
    no copy). Buckets of different dtypes never mix; buckets are ordered by their first
    tensor. ``bucket_bytes=0``: every tensor alone (``no_packing``).
    """
    check_bucket_bytes(bucket_bytes)
    shp, dts = normalise_layout(shapes, dtypes)
    if bucket_bytes == 0:
        return no_packing(shp, dts)
    alone = bucket_bytes if alone_bytes is None else min(alone_bytes, bucket_bytes)
    groups: list[list[int]] = []
    open_bucket: dict[np.dtype, tuple[list[int], int]] = {}  # dtype -> (members, bytes)
    for i, (shape, dt) in enumerate(zip(shp, dts, strict=True)):
        nbytes = prod(shape) * dt.itemsize
        members, filled = open_bucket.get(dt, (None, 0))
        if nbytes >= alone:
            groups.append([i])  # alone; the open bucket of its dtype stays open
            continue
        if members is None or filled + nbytes > bucket_bytes:
            members, filled = [], 0
            groups.append(members)
        members.append(i)
        open_bucket[dt] = (members, filled + nbytes)
    return PackPlan(shp, dts, whole_packs(groups, shp, dts))


def runs(shapes: Sequence[Sequence[int]], dtypes: Sequence[DTypeLike], bucket_bytes: int,
         alone_bytes: int | None = None, first_bytes: int | None = None,
         tail_bytes: int | None = None) -> PackPlan:
    """Buckets of consecutive tensors, as DDP's reducer makes them for a list in the order its
    tensors become ready: a bucket closes when the next tensor would overflow it
    (``first_bytes`` for the first bucket, small so that communication starts early;
    ``bucket_bytes`` for the others) or has another dtype; a tensor of ``alone_bytes`` (default
    and at most ``bucket_bytes``) or more closes the open bucket and travels alone. Every
    bucket holds a contiguous run of the list, so buckets complete in list order and none waits
    behind a later tensor. ``bucket_bytes=0``: every tensor alone.

    ``tail_bytes``: the last buckets shrink as well. A bucket opened at tensor ``i`` holds at
    most half the bytes of tensors ``i`` to the end (and at least ``tail_bytes``), so each
    bucket near the end is about as large as everything after it: the list's last tensors,
    ready when the backward pass ends, then wait behind one small bucket instead of a full
    one still filling.
    """
    check_bucket_bytes(bucket_bytes)
    shp, dts = normalise_layout(shapes, dtypes)
    if bucket_bytes == 0:
        return no_packing(shp, dts)
    sizes = [prod(shape) * dt.itemsize for shape, dt in zip(shp, dts, strict=True)]
    after = [0] * (len(sizes) + 1)  # after[i]: the bytes of tensors i to the end
    for i in range(len(sizes) - 1, -1, -1):
        after[i] = after[i + 1] + sizes[i]
    alone = bucket_bytes if alone_bytes is None else min(alone_bytes, bucket_bytes)
    groups: list[list[int]] = []
    members: list[int] | None = None
    filled = cap = 0
    for i, (nbytes, dt) in enumerate(zip(sizes, dts, strict=True)):
        if nbytes >= alone:
            groups.append([i])
            members = None
            continue
        if members is None or filled + nbytes > cap or dts[members[0]] != dt:
            members, filled = [], 0
            # (the new bucket's cap: the first bucket's is first_bytes)
            cap = bucket_bytes if groups or first_bytes is None else first_bytes
            if tail_bytes is not None:
                cap = min(cap, max(tail_bytes, after[i] // 2))
            groups.append(members)
        members.append(i)
        filled += nbytes
    return PackPlan(shp, dts, whole_packs(groups, shp, dts))
