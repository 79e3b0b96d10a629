"""Getting NCCL going under mpiexec: devices, nodes, unique ids, communicators on demand.

* Each process takes the GPU of its local rank (``local_rank % device_count``; with
  ``CUDA_VISIBLE_DEVICES`` the CUDA runtime renumbers what it shows).
* Nodes come from ``MPI_Comm_split_type(COMM_TYPE_SHARED)``, or, where
  ``COLLECTIVES_RANKS_PER_NODE=k`` is set, from runs of ``k`` consecutive ranks: so one host
  can stand for several nodes, each process its own node, sharing one GPU.
* A NCCL communicator is created only when a call first needs it, for the group that call
  spans (all ranks for NCCL's own collectives and point-to-point, each node's ranks for the
  two-level path). Its unique id (128 opaque bytes) is made by the group's first rank and
  broadcast over MPI; every creation uses a fresh id.
* NCCL refuses two ranks of one communicator on one GPU: every rank publishes its (host,
  GPU) at start, and a group that would put two ranks on one GPU raises, naming them, before
  NCCL is asked.
"""

from __future__ import annotations

import socket
from typing import Any

import numpy as np

# (one reading of the variable for both transports: the MPI transport's)
from collectives.backends.mpi.groups import ENV_RANKS_PER_NODE, ranks_per_node  # noqa: F401


def node_of_ranks(comm: Any) -> tuple[tuple[int, ...], ...]:
    """The ranks of every node, in rank order (collective over ``comm``)."""
    from mpi4py import MPI

    size = comm.Get_size()
    k = ranks_per_node()
    if k is not None:
        return tuple(tuple(range(i, min(i + k, size))) for i in range(0, size, k))
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        leader = local.bcast(comm.Get_rank(), root=0)
    finally:
        local.Free()
    leaders = comm.allgather(leader)
    nodes: dict[int, list[int]] = {}
    for rank, first in enumerate(leaders):
        nodes.setdefault(first, []).append(rank)
    return tuple(tuple(members) for _, members in sorted(nodes.items()))


def broadcast_unique_id(comm: Any, root: int = 0, make=None) -> bytes:
    """A NCCL unique id made on ``root`` (``make()``, default NCCL's ``get_unique_id``),
    received by every rank of ``comm`` as the same 128 bytes (collective)."""
    buf = np.zeros(128, np.uint8)
    if comm.Get_rank() == root:
        if make is None:
            from collectives.backends.cupy.probe import nccl_module

            make = nccl_module().get_unique_id
        uid = bytes(make())
        if len(uid) != 128:
            raise ValueError(f"a NCCL unique id has 128 bytes, not {len(uid)}")
        buf[:] = np.frombuffer(uid, np.uint8)
    comm.Bcast(buf, root=root)
    return buf.tobytes()


def choose_device(local_rank: int, count: int | None = None) -> int:
    """The GPU of a process of this local rank."""
    if count is None:
        from collectives.backends.cupy.probe import require_gpu

        count = require_gpu().cuda.runtime.getDeviceCount()
    return local_rank % count


def device_identity(device: int) -> str:
    """``host/PCI bus id`` of a GPU: the same string for every process that uses it."""
    import cupy

    return f"{socket.gethostname()}/{cupy.cuda.runtime.deviceGetPCIBusId(device)}"


def shared_gpu(identities: list[str], members: tuple[int, ...]) -> tuple[int, int, str] | None:
    """Two members of a group on one GPU: ``(rank, other rank, GPU)``, else None."""
    seen: dict[str, int] = {}
    for rank in members:
        gpu = identities[rank]
        if gpu in seen:
            return seen[gpu], rank, gpu
        seen[gpu] = rank
    return None


class Communicators:
    """NCCL communicators of one process, created when a group first needs one.

    ``world``: the mpi4py communicator; ``identities[r]``: rank r's GPU (``device_identity``).
    Creation is collective over the group, so every rank must ask for a group at the same
    point of its call sequence (as every collective call does).
    """

    def __init__(self, world: Any, device: int, identities: list[str],
                 nodes: tuple[tuple[int, ...], ...]):
        self.world, self.device, self.identities, self.nodes = world, device, identities, nodes
        self.rank = world.Get_rank()
        self._made: dict[tuple[int, ...], Any] = {}
        self.generation = 0  # counts free(): what was made before is gone
        self._mpi: dict[str, Any] = {}

    def check_group(self, members: tuple[int, ...], what: str) -> None:
        """Raise, naming the ranks and the GPU, where two members share a GPU."""
        clash = shared_gpu(self.identities, members)
        if clash is not None:
            a, b, gpu = clash
            raise ValueError(
                f"rank {self.rank}: {what} needs a NCCL communicator over ranks {list(members)}, "
                f"but ranks {a} and {b} share GPU {gpu}: NCCL refuses two ranks of one "
                "communicator on one GPU. Give each rank its own GPU, or use the two-level path "
                f"(algorithm='two_level') with one rank per node ({ENV_RANKS_PER_NODE}=1)")

    def mpi_group(self, kind: str) -> Any:
        """``"node"``: this node's ranks; ``"cross"``: the ranks of this local rank on every
        node (collective over the world the first time)."""
        comm = self._mpi.get(kind)
        if comm is None:
            node = next(i for i, members in enumerate(self.nodes) if self.rank in members)
            local = self.nodes[node].index(self.rank)
            color, key = (node, local) if kind == "node" else (local, node)
            comm = self._mpi[kind] = self.world.Split(color, key)
        return comm

    def get(self, kind: str, what: str) -> Any:
        """The NCCL communicator of ``kind``: "world" or "node"."""
        members = (tuple(range(self.world.Get_size())) if kind == "world"
                   else next(m for m in self.nodes if self.rank in m))
        made = self._made.get(members)
        if made is not None:
            return made
        self.check_group(members, what)
        from collectives.backends.cupy.probe import nccl_module

        mpi = self.world if kind == "world" else self.mpi_group("node")
        uid = broadcast_unique_id(mpi)
        import cupy

        with cupy.cuda.Device(self.device):
            made = nccl_module().NcclCommunicator(len(members), uid, members.index(self.rank))
        self._made[members] = made
        return made

    def all(self) -> list:
        return list(self._made.values())

    def free(self) -> None:
        self.generation += 1  # (communicators held by a hot path are gone too)
        for comm in self._made.values():
            try:
                comm.destroy()
            except Exception:  # noqa: BLE001 - an aborted communicator may refuse: let it go
                pass
        self._made.clear()
        for comm in self._mpi.values():
            comm.Free()
        self._mpi.clear()
