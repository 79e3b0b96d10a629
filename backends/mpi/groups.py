"""Node groups: which ranks share a node, for two-level algorithms and shared memory.

``MPI_Comm_split_type(COMM_TYPE_SHARED)`` finds the ranks of each node. On one machine every
rank shares the node, so ``COLLECTIVES_RANKS_PER_NODE=k`` simulates nodes of ``k``
consecutive ranks instead: two-level ``"A/B"`` algorithms then really cross "nodes", which is
how the tests exercise them without a cluster.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from collectives.algorithms.base import Layout
from collectives.runtime.validate import resolve_groups

ENV_RANKS_PER_NODE = "COLLECTIVES_RANKS_PER_NODE"


def ranks_per_node(env: Mapping[str, str] | None = None) -> int | None:
    """``COLLECTIVES_RANKS_PER_NODE`` as a positive integer (plain ASCII digits), or None
    where unset: the one reading of it, the MPI and NCCL transports' alike."""
    text = (os.environ if env is None else env).get(ENV_RANKS_PER_NODE, "").strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ValueError(f"{ENV_RANKS_PER_NODE}={text!r} must be a positive integer (ranks per "
                         "simulated node); unset it to use the real nodes")
    return int(text)


def groups_from_env(size: int, env: Mapping[str, str] | None = None
                    ) -> tuple[tuple[int, ...], ...] | None:
    """Groups of ``k`` consecutive ranks when ``COLLECTIVES_RANKS_PER_NODE=k`` is set, else None."""
    k = ranks_per_node(env)
    if k is None:
        return None
    return tuple(tuple(range(i, min(i + k, size))) for i in range(0, size, k))


def shared_nodes(comm: Any, node: Any) -> tuple[tuple[int, ...], ...]:
    """The ranks of ``comm`` on each node, given ``node`` = this rank's
    ``Split_type(COMM_TYPE_SHARED)`` part; in rank order, each group led by its lowest rank.
    Collective."""
    from mpi4py import MPI

    leader = node.allreduce(comm.Get_rank(), op=MPI.MIN)
    leaders = comm.allgather(leader)
    groups: dict[int, list[int]] = {}
    for rank, lead in enumerate(leaders):
        groups.setdefault(lead, []).append(rank)
    return tuple(tuple(g) for _, g in sorted(groups.items()))


def node_groups(comm: Any) -> tuple[tuple[int, ...], ...]:
    """The ranks of ``comm`` sharing each node (or ``COLLECTIVES_RANKS_PER_NODE``'s simulated
    nodes), in rank order. Collective."""
    from mpi4py import MPI

    simulated = groups_from_env(comm.Get_size())
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        real = shared_nodes(comm, node)
    finally:
        node.Free()
    return simulated if simulated is not None else real


def layout_for(groups: str | int | Sequence[Sequence[int]] | None, nodes, size: int
               ) -> Layout | None:
    """The transport's default layout for ``init(groups=...)``: ``"node"`` (the node groups,
    ``nodes``), a group size, an explicit partition, or None (no default)."""
    if isinstance(groups, str):
        if groups.strip().lower() != "node":
            raise ValueError(f"groups={groups!r}: use 'node', a group size, a list of groups, "
                             "or None")
        return Layout(nodes)
    resolved = resolve_groups(groups, size)
    return Layout(resolved) if resolved is not None else None


def local_place(groups: tuple[tuple[int, ...], ...], rank: int) -> tuple[int, int]:
    """``(local_rank, local_size)``: this rank's place in its group."""
    for group in groups:
        if rank in group:
            return group.index(rank), len(group)
    return 0, 1
