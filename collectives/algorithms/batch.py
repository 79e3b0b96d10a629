"""Batches: many tensors reduced as few buffers, in both ways of calling.

``plan_batch`` turns an all-reduce spec (any form of ``spec.parse_spec``) and the packing
knobs into a list of ``(range, plan)`` pairs: the spec's size ranges decide which algorithm
and shard count each tensor gets (by element count), and the packing plan decides how that
range's tensors travel as buffers. Buckets started as their tensors become ready
(``in_order``, ``comm.buckets``) are the list's runs instead, each taking the range of the
elements it carries. Results always come back in input order with input
shapes, whatever the ranges (TensorFlow's MultiWorkerAllReduce reordered them).

``start_batch`` is the batch loop, the one every batched call runs (the multi-device API, the
Communicator, the CuPy backend, both TensorFlow paths): pack each part's tensors, hand each
pack to the caller's reduction, and, in the ``finish`` it returns, unpack the reduced packs.
The reduction may return handles still in flight (``async_op``): ``finish`` collects them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ops import ReduceOp, result_dtype
from .fusion import DEFAULT_BUCKET_BYTES, check_bucket_bytes
from .pack_plan import whole_packs
from .packing import PackPlan, make_plan
from .reuse import BucketKeeper
from .spec import SpecRange, assign_ranges, parse_spec, pick_range, spec_key, with_shards


@dataclass(frozen=True)
class BatchPart:
    spec: SpecRange
    indices: tuple[int, ...]  # which tensors of the batch this part carries, in order
    plan: PackPlan


def plan_batch(shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype], algorithm,
               *, num_packs: int = 0, agg_small_grads_max_bytes: int = 0,
               agg_small_grads_max_group: int = 10, bytes_per_pack: int | None = None,
               shards: int = 0, extra_names: Sequence[str] = (),
               bucket_bytes: int = DEFAULT_BUCKET_BYTES,
               alone_bytes: int | None = None, in_order: bool = False) -> list[BatchPart]:
    """The parts of a batch; the same inputs give the same (cached) plan, since training
    loops reduce the same gradient list every step. ``extra_names``: a transport's own
    algorithm names (e.g. MPI's "native"). With none of TensorFlow's packing knobs, tensors
    are fused into buckets of ``bucket_bytes`` (0: each alone), those of ``alone_bytes`` or
    more alone (the array backend's ``alone_bytes``: where a copy costs more than a call)."""
    check_bucket_bytes(bucket_bytes)  # (before the cache: "64M" would be a key)
    knobs = (num_packs, agg_small_grads_max_bytes, agg_small_grads_max_group, bytes_per_pack,
             shards)
    key = (tuple(map(tuple, shapes)), tuple(map(np.dtype, dtypes)), spec_key(algorithm),
           spec_key(knobs), tuple(extra_names), bucket_bytes, alone_bytes, in_order)
    try:
        plan = _CACHE.get(key)
    except TypeError:  # an unhashable part of a spec: plan without the cache
        return _plan(*key[:2], algorithm, *knobs, *key[4:])
    if plan is None:
        if len(_CACHE) > 256:
            _CACHE.clear()
        plan = _CACHE[key] = _plan(*key[:2], algorithm, *knobs, *key[4:])
    return plan


_CACHE: dict = {}


def _plan(shapes, dtypes, algorithm, num_packs, agg_small_grads_max_bytes,
          agg_small_grads_max_group, bytes_per_pack, shards, extra_names=(),
          bucket_bytes=DEFAULT_BUCKET_BYTES, alone_bytes=None, in_order=False) -> list[BatchPart]:
    ranges = with_shards(algorithm, parse_spec(algorithm, extra_names=extra_names,
                                               argument="algorithm"), shards)
    if in_order and len(ranges) > 1:
        return _runs_by_size(shapes, dtypes, ranges, bucket_bytes)
    sizes = [int(np.prod(s)) for s in shapes]
    parts = []
    for spec, indices in zip(ranges, assign_ranges(sizes, ranges)):
        if not indices:
            continue
        plan = make_plan([shapes[i] for i in indices], [dtypes[i] for i in indices],
                         num_packs=num_packs, agg_small_grads_max_bytes=agg_small_grads_max_bytes,
                         agg_small_grads_max_group=agg_small_grads_max_group,
                         bytes_per_pack=bytes_per_pack, bucket_bytes=bucket_bytes,
                         alone_bytes=alone_bytes, in_order=in_order)
        parts.append(BatchPart(spec, tuple(indices), plan))
    return parts


def _runs_by_size(shapes, dtypes, ranges: Sequence[SpecRange],
                  bucket_bytes: int) -> list[BatchPart]:
    """Buckets started as their tensors become ready (``in_order``), under a spec of several
    ranges: the list's runs of consecutive tensors, as without one, each bucket taking the
    range of the elements it carries. (Cut by each tensor's range first, a bucket of one
    range's tensors 0 and 2 waited for tensor 2, and the buckets after it for that one; cut by
    range and run, weights and biases of alternating ranges made a bucket of every tensor.)"""
    whole = make_plan(shapes, dtypes, bucket_bytes=bucket_bytes, in_order=True)
    parts = []
    for pack in whole.packs:
        members = list(pack.indices)
        sub_shapes = tuple(whole.shapes[i] for i in members)
        sub_dtypes = tuple(whole.dtypes[i] for i in members)
        plan = PackPlan(sub_shapes, sub_dtypes,
                        whole_packs([list(range(len(members)))], sub_shapes, sub_dtypes))
        parts.append(BatchPart(pick_range(ranges, pack.size), tuple(members), plan))
    return parts


@dataclass
class StartedBatch:
    """A batch whose packs are reducing: ``pending`` holds what the reduction returned for
    each pack, in order (results, or handles still in flight); ``finish`` unpacks them."""

    parts: Sequence[BatchPart]
    pending: list
    tensors: int
    arrays: Any
    home: Callable[[Any], Any]
    keeper: BucketKeeper | None = None
    took: frozenset = frozenset()  # (id(plan), pack, member) of every kept bucket it took

    def finish(self, reduced: Sequence[Sequence[Any]]) -> list[list]:
        """``results[k][m]`` from ``reduced[p]``, the reduced buffers of pending pack ``p`` (one
        per member that gets results): tensor ``k`` for result member ``m``, in input order
        with input shapes (views of the reduced packs where a tensor lies in one)."""
        results: list[list] = [[] for _ in range(self.tensors)]
        start = 0
        for part in self.parts:
            packs = reduced[start:start + len(part.plan.packs)]
            start += len(packs)
            for m in range(len(packs[0])):
                with self.home(packs[0][m]):
                    unpacked = self._unpack(part.plan, [p[m] for p in packs], m)
                for i, result in zip(part.indices, unpacked, strict=True):
                    results[i].append(result)
        return results

    def _unpack(self, plan: PackPlan, buffers: list, member: int) -> list:
        """``plan.unpack``, with the keeper's views of each kept bucket this call took and
        reduced in place; the other fused buckets and their new views are kept."""
        keeper = self.keeper
        if keeper is None or not keeper.enabled or not plan.whole:
            return plan.unpack(buffers, arrays=self.arrays)
        fused = [j for j, pack in enumerate(plan.packs) if len(pack.indices) > 1]
        kept: dict[int, Sequence[Any]] = {}
        for j in fused:  # (each bucket taken is given back, reused or not)
            if (id(plan), j, member) in self.took:
                views = keeper.views(plan, j, member, buffers[j])
                if views is not None:
                    kept[j] = views
        out = plan.unpack(buffers, arrays=self.arrays, views=kept)
        dtype_of = self.arrays.dtype_of
        for j in fused:
            pack, buf = plan.packs[j], buffers[j]
            if j not in kept and dtype_of(buf) == pack.dtype and tuple(buf.shape) == (pack.size,):
                keeper.keep(plan, j, member, buf, [out[i] for i in pack.indices])
        return out


def start_batch(tensors: Sequence[Sequence[Any]], parts: Sequence[BatchPart],
                reduce_pack: Callable[[BatchPart, list, bool], Any], *, arrays: Any,
                home: Callable[[Any], Any] | None = None,
                validated: bool = False, keeper: BucketKeeper | None = None) -> StartedBatch:
    """The batch loop's first half: pack every part and start each pack's reduction.

    ``tensors[m][k]`` is tensor ``k`` of member ``m`` (a device of a multi-device call, or a
    rank's own tensors: one member). ``reduce_pack(part, buffers, fresh)`` reduces one pack
    of ``part`` from ``buffers`` (one per member) and returns its result, or a handle in
    flight; ``fresh``: the buffers are new arrays of the batch's own (fused buckets), which
    the reduction may write in place, not views of a tensor travelling alone.
    ``home(array)`` is the device context to pack and unpack a member's arrays in (CuPy: its
    GPU). The caller turns each pending result into the reduced buffers and calls ``finish``.
    ``validated``: every member's tensors are ``arrays``' arrays of the plans' shapes and
    dtypes (the caller checked them), so packing need not check them again.
    ``keeper``: where fused buckets are kept from one call to the next (``reuse.py``; the
    caller's, for validated tensors only).
    """
    place = home or _nowhere
    keeping = keeper is not None and keeper.enabled and validated
    took: set[tuple[int, int, int]] = set()
    pending = []
    for part in parts:
        plan = part.plan
        packed = []
        for m, member in enumerate(tensors):
            into = None
            if keeping and plan.whole:
                assert keeper is not None
                into = [keeper.bucket(plan, j, m) if len(pack.indices) > 1 else None
                        for j, pack in enumerate(plan.packs)]
                took.update((id(plan), j, m) for j, bucket in enumerate(into) if bucket)
            with place(member[part.indices[0]]):
                packed.append(plan.pack([member[i] for i in part.indices], arrays=arrays,
                                        validated=validated, into=into))
        pending += [reduce_pack(part, [buffers[j] for buffers in packed],
                                len(plan.packs[j].indices) != 1)
                    for j in range(len(plan.packs))]
    return StartedBatch(parts, pending, len(tensors[0]) if tensors else 0, arrays, place,
                        keeper if keeping else None, frozenset(took))


def in_place(fresh: bool, op: Any, dtype: Any) -> bool:
    """Whether a pack's reduction may write its own buffers: a fused bucket (``fresh``) whose
    result has the bucket's dtype (an integer MEAN's is float64)."""
    return fresh and result_dtype(ReduceOp.parse(op), dtype) == dtype


def _nowhere(_: Any) -> Any:
    return nullcontext()
