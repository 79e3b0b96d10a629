"""Batches: many tensors reduced as few buffers, in both ways of calling.

``plan_batch`` turns an all-reduce spec (any form of ``spec.parse_spec``) and the packing
knobs into a list of ``(range, plan)`` pairs: the spec's size ranges decide which algorithm
and shard count each tensor gets (by element count), and the packing plan decides how that
range's tensors travel as buffers. Results always come back in input order with input
shapes, whatever the ranges (TensorFlow's MultiWorkerAllReduce reordered them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .packing import PackPlan, make_plan
from .spec import SpecRange, assign_ranges, parse_spec


@dataclass(frozen=True)
class BatchPart:
    spec: SpecRange
    indices: tuple[int, ...]  # which tensors of the batch this part carries, in order
    plan: PackPlan


def _freeze(spec):
    """A hashable copy of a spec (lists become tuples) for the plan cache."""
    if isinstance(spec, (list, tuple)):
        return type(spec).__name__, tuple(_freeze(s) for s in spec)
    return spec


def plan_batch(shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype], algorithm,
               *, num_packs: int = 0, agg_small_grads_max_bytes: int = 0,
               agg_small_grads_max_group: int = 10, bytes_per_pack: int | None = None,
               shards: int = 0, extra_names: Sequence[str] = ()) -> list[BatchPart]:
    """The parts of a batch; the same inputs give the same (cached) plan, since training
    loops reduce the same gradient list every step. ``extra_names``: a transport's own
    algorithm names (e.g. MPI's "native")."""
    key = (tuple(tuple(s) for s in shapes), tuple(np.dtype(d) for d in dtypes), _freeze(algorithm),
           num_packs, agg_small_grads_max_bytes, agg_small_grads_max_group, bytes_per_pack, shards,
           tuple(extra_names))
    try:
        return _plan_cached(key, algorithm)
    except TypeError:  # an unhashable part of a spec: plan without the cache
        return _plan(*key[:2], algorithm, *key[3:])


def _plan_cached(key, algorithm) -> list[BatchPart]:
    plan = _CACHE.get(key)
    if plan is None:
        if len(_CACHE) > 256:
            _CACHE.clear()
        plan = _CACHE[key] = _plan(*key[:2], algorithm, *key[3:])
    return plan


_CACHE: dict = {}


def _plan(shapes, dtypes, algorithm, num_packs, agg_small_grads_max_bytes,
          agg_small_grads_max_group, bytes_per_pack, shards, extra_names=()) -> list[BatchPart]:
    ranges = parse_spec(algorithm, extra_names=extra_names)
    plain = isinstance(algorithm, str) and ":" not in algorithm and "#" not in algorithm
    if plain:
        # a plain name takes ``shards`` (0: the algorithm's default), as a single call does
        ranges = [ranges[0]._replace(shards=shards)]
    elif shards:  # a spec carries its own shard counts
        raise ValueError(f"shards={shards} conflicts with the all-reduce spec {algorithm!r}, "
                         "which sets its own shards; put them in the spec (e.g. 'xring#2')")
    sizes = [int(np.prod(s)) for s in shapes]
    parts = []
    for spec, indices in zip(ranges, assign_ranges(sizes, ranges)):
        if not indices:
            continue
        plan = make_plan([shapes[i] for i in indices], [dtypes[i] for i in indices],
                         num_packs=num_packs, agg_small_grads_max_bytes=agg_small_grads_max_bytes,
                         agg_small_grads_max_group=agg_small_grads_max_group,
                         bytes_per_pack=bytes_per_pack)
        parts.append(BatchPart(spec, tuple(indices), plan))
    return parts

