"""Ring all-reduce with sub-chunks (TensorFlow's "xring", NCCL's ring).

The buffer is cut into ``n * S`` chunks (``S = shards`` sub-chunks per segment; chunk
``c = segment * S + s``). Sub-chunk ``s`` travels its own ring: TensorFlow's ring
permutations rotate the device order inside each worker (a group of ``G`` consecutive
participants; without groups the rotation moves the whole ring's starting point) by
``s * max(1, G // S)`` places, so with several workers a device talks to up to ``S``
different neighbours at once.

1. reduce-scatter, ``n - 1`` rounds: in round ``t`` the device of ring rank ``r`` adds its
   predecessor's copy of segment ``(r - 2 - t) mod n`` to its own; afterwards rank ``r`` holds
   the total of segment ``r``;
2. all-gather, ``n - 1`` rounds: in round ``t`` it copies segment ``(r - 1 - t) mod n`` from
   its predecessor.

``2 (n - 1)`` rounds; each participant sends and receives ``2 (n - 1) B / n`` bytes, the
bandwidth optimum. It wins for large buffers; its ``2 (n - 1)`` latencies lose to the tree
for small ones.
"""

from __future__ import annotations

from fractions import Fraction

from ..schedule import Collective, Schedule, block, concat, copy_step, reduce_step


def ring_permutations(num_workers: int, num_subchunks: int, gpu_perm):
    """TensorFlow's ``_ring_permutations``: ``(pred_by_s_d, rank_by_s_d)``, indexed [s][d]."""
    num_gpus = len(gpu_perm)
    devices = num_workers * num_gpus
    if devices == 0:
        return [], []
    if num_subchunks > num_gpus:
        raise ValueError(f"num_subchunks {num_subchunks} must be <= num_gpus {num_gpus}")
    rotation_interval = max(1, int(num_gpus / num_subchunks))
    preds, ranks = [], []
    for s in range(num_subchunks):
        offset = s * rotation_interval
        order = []
        for w in range(num_workers):
            local = [w * num_gpus + g for g in gpu_perm]
            order.extend(local[offset:] + local[:offset])
        rank = [0] * devices
        for position, d in enumerate(order):
            rank[d] = position
        preds.append([order[(rank[d] + devices - 1) % devices] for d in range(devices)])
        ranks.append(rank)
    return preds, ranks


def _rings(n: int, shards: int, group_size: int):
    """Permutations for ``shards`` rings; beyond the group size the rotations repeat."""
    group_size = group_size if group_size and n % group_size == 0 else n
    distinct = min(shards, group_size)
    preds, ranks = ring_permutations(n // group_size, distinct, list(range(group_size)))
    return [preds[s % distinct] for s in range(shards)], [ranks[s % distinct] for s in range(shards)]


def reduce_phase(n: int, shards: int = 1, group_size: int = 0):
    shards = max(shards, 1)  # 0 asks for the default: one sub-chunk
    preds, ranks = _rings(n, shards, group_size)
    count = n * shards
    rounds = []
    for t in range(n - 1):
        rounds.append(tuple(
            reduce_step(d, [preds[s][d]], *block(((ranks[s][d] + n - 2 - t) % n) * shards + s, count))
            for d in range(n) for s in range(shards)))
    owners = []
    for s in range(shards):
        for d in range(n):
            lo, hi = block(ranks[s][d] * shards + s, count)
            owners.append((lo, hi, d))
    return rounds, sorted(owners)


def _gather_rounds(n: int, shards: int, group_size: int = 0):
    preds, ranks = _rings(n, shards, group_size)
    count = n * shards
    return [tuple(
        copy_step(d, preds[s][d], *block(((ranks[s][d] + n - 1 - t) % n) * shards + s, count))
        for d in range(n) for s in range(shards)) for t in range(n - 1)]


def all_reduce(n: int, shards: int = 1, group_size: int = 0) -> Schedule:
    shards = max(shards, 1)
    rounds, _ = reduce_phase(n, shards, group_size)
    return concat("ring", Collective.ALL_REDUCE, n, rounds, _gather_rounds(n, shards, group_size))


def all_gather(n: int, shards: int = 1) -> Schedule:
    # Block p starts on participant p, which is ring rank p's segment with one sub-chunk.
    return concat("ring", Collective.ALL_GATHER, n, _gather_rounds(n, 1))


def broadcast(n: int, root: int, shards: int = 0) -> Schedule:
    """Pipelined chain root -> root+1 -> ...: ``n - 2 + k`` rounds of ``B / k`` bytes."""
    k = shards if shards > 0 else max(1, min(8, n))
    chain = [(root + i) % n for i in range(n)]
    rounds = []
    for t in range(n - 1 + k - 1):
        steps = []
        for i in range(n - 1):
            j = t - i  # chunk that hop i carries in round t
            if 0 <= j < k:
                steps.append(copy_step(chain[i + 1], chain[i], Fraction(j, k), Fraction(j + 1, k)))
        rounds.append(tuple(steps))
    return concat("ring", Collective.BROADCAST, n, rounds, root=root)

