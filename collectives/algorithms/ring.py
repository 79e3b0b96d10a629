"""Ring all-reduce with sub-chunks (TensorFlow's "xring", NCCL's ring).

The buffer is cut into ``n * S`` chunks (``S = shards`` sub-chunks per segment; chunk
``c = segment * S + s``). Sub-chunk ``s`` travels its own ring: TensorFlow's ring permutations
rotate the device order inside each group of ``G`` consecutive participants (the devices of
one worker; without groups the whole ring) by ``s * max(1, G // S)`` places, so with several
workers a device talks to up to ``S`` different neighbours at once.

1. reduce-scatter, ``n - 1`` rounds: in round ``t`` the participant at ring position ``r``
   adds its predecessor's copy of segment ``(r - 2 - t) mod n`` to its own; afterwards
   position ``r`` holds the total of segment ``r``;
2. all-gather, ``n - 1`` rounds: in round ``t`` it copies segment ``(r - 1 - t) mod n`` from
   its predecessor.

``2 (n - 1)`` rounds; each participant sends and receives ``2 (n - 1) B / n`` bytes, the
bandwidth optimum. It wins for large buffers; its ``2 (n - 1)`` latencies lose to the tree
for small ones. Broadcast is a pipelined chain ``root -> root+1 -> ...`` of ``k`` chunks
(``n - 2 + k`` rounds of ``B / k`` bytes).

Every participant's positions are computed arithmetically, so one participant's plan costs
``O(n S)``, the number of steps it takes.
"""

from __future__ import annotations

from .base import (
    EMPTY,
    Groups,
    Layout,
    Ownership,
    Phase,
    block,
    cached_ownership,
    concat,
    gather_to_root,
    scatter_to_blocks,
)
from .schedule import Collective, Round, Send, Step

NAME = "ring"
COLLECTIVES: frozenset[Collective] = frozenset(c for c in Collective
                                               if c not in (Collective.GATHER, Collective.SCATTER))
SHARDED = True


def uses_layout(layout: Layout) -> bool:
    """Sub-chunks rotate inside groups of equal consecutive participants (TensorFlow's ring
    permutations): only such groups change the plans."""
    return bool(layout.runs)


class Rings:
    """TensorFlow's ring permutations, arithmetically: position and neighbours per sub-chunk."""

    def __init__(self, n: int, shards: int, group_size: int = 0):
        self.n, self.shards = n, shards
        self.group = group_size if group_size and n % group_size == 0 else n
        distinct = min(shards, self.group)
        interval = max(1, self.group // distinct)
        # sub-chunk s uses the rotation of s mod distinct (beyond the group size they repeat)
        self.offsets = [(s % distinct) * interval for s in range(shards)]

    def position(self, s: int, d: int) -> int:
        g, off = self.group, self.offsets[s]
        return d - d % g + (d % g - off) % g

    def device(self, s: int, q: int) -> int:
        g, off = self.group, self.offsets[s]
        q %= self.n
        return q - q % g + (q % g + off) % g


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


def _segment_rounds(n: int, shards: int, group: int, rank: int, first: int, reduce: bool,
                    start: int = 0) -> Phase:
    """``n - 1`` rounds of the ring for ``rank``: reduce-scatter (``first=2``) or all-gather
    (``first=1``): in round ``t`` position ``r`` receives segment ``(r - first - t) mod n``.
    Round indices begin at ``start``."""
    rings = Rings(n, shards, group)
    if shards == 1:  # the common case, and the one large jobs run: one message each way
        r = rings.position(0, rank)
        preds, succ = (rings.device(0, r - 1),), rings.device(0, r + 1)
        rounds: list[Round] = []
        for t in range(n - 1):
            c = (r - first - t) % n  # received; the successor gets the segment after it
            d = c + 1 if c + 1 < n else 0
            rounds.append((start + t, ((succ, d, d + 1),), ((rank, preds, c, c + 1, reduce),)))
        return Phase(n, n - 1, tuple(rounds))
    mine = []
    for s in range(shards):
        r = rings.position(s, rank)
        mine.append((s, r, rings.device(s, r - 1), rings.device(s, r + 1)))
    rounds = []
    for t in range(n - 1):
        sends, recvs = [], []
        for s, r, pred, succ in mine:
            c = ((r - first - t) % n) * shards + s
            recvs.append((rank, (pred,), c, c + 1, reduce))
            c = ((r + 1 - first - t) % n) * shards + s
            sends.append((succ, c, c + 1))
        sends.sort(key=lambda x: (x[1], x[0]))
        recvs.sort(key=lambda x: x[2])
        rounds.append((start + t, tuple(sends), tuple(recvs)))
    return Phase(n * shards, n - 1, tuple(rounds))


def _pairwise(n: int, rank: int) -> Phase:
    """All-to-all as ``n - 1`` shifts: in round ``k`` participant ``r`` sends its block for
    ``r + k`` and receives the block of ``r - k`` for it (block (i, j) at position i n + j):
    one message each way per round, ``(n - 1) B / n`` bytes each way in all."""
    rounds = []
    for k in range(1, n):
        to, frm = (rank + k) % n, (rank - k) % n
        rounds.append((k - 1, ((to, rank * n + to, rank * n + to + 1),),
                       ((rank, (frm,), frm * n + rank, frm * n + rank + 1, False),)))
    return Phase(n * n, n - 1, tuple(rounds))


def _ownership(n: int, shards: int, group: int) -> Ownership:
    rings = Rings(n, shards, group)
    count = n * shards
    return Ownership(count, [(*block(rings.position(s, d) * shards + s, count, count), d)
                             for s in range(shards) for d in range(n)])


def _broadcast(n: int, rank: int, root: int, shards: int) -> Phase:
    k = shards if shards > 0 else max(1, min(8, n))
    c = (rank - root) % n
    rounds: list[Round] = []
    sends: tuple[Send, ...]
    recvs: tuple[Step, ...]
    for t in range(n - 2 + k):
        sends, recvs = (), ()
        j = t - (c - 1)  # the chunk arriving from the previous hop
        if c >= 1 and 0 <= j < k:
            recvs = ((rank, ((rank - 1) % n,), j, j + 1, False),)
        j = t - c  # the chunk leaving for the next hop
        if c <= n - 2 and 0 <= j < k:
            sends = (((rank + 1) % n, j, j + 1),)
        if sends or recvs:
            rounds.append((t, sends, recvs))
    return Phase(k, n - 2 + k, tuple(rounds))


def reduce_phase(n: int, rank: int, shards: int, group: int) -> Phase:
    return _segment_rounds(n, max(shards, 1), group, rank, 2, True)


def phase(collective: Collective, size: int, rank: int, *, root: int = 0, shards: int = 0,
          groups: Groups | None = None) -> Phase:
    if size == 1:
        return EMPTY
    # the ring rotates sub-chunks inside groups only when they are equal consecutive runs
    group = groups.runs if groups is not None else 0
    if collective is Collective.BROADCAST:
        return _broadcast(size, rank, root, shards)
    if collective is Collective.ALL_TO_ALL:
        return _pairwise(size, rank)
    if collective is Collective.ALL_GATHER:
        # Block p starts on participant p, which is ring position p's segment with one sub-chunk.
        return _segment_rounds(size, 1, 0, rank, 1, False)
    reduced = reduce_phase(size, rank, shards, group)
    if collective is Collective.ALL_REDUCE:
        # built in place rather than by concat: at thousands of rounds, re-indexing shows
        gather = _segment_rounds(size, max(shards, 1), group, rank, 1, False, start=size - 1)
        return Phase(reduced.den, 2 * (size - 1), reduced.rounds + gather.rounds)
    owners = cached_ownership(_ownership, size, max(shards, 1), group)
    if collective is Collective.REDUCE:
        return concat(reduced, gather_to_root(owners, size, rank, root))
    return concat(reduced, scatter_to_blocks(owners, size, rank))
