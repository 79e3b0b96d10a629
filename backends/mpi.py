"""The MPI transport: one process per rank, launched with ``mpiexec -n N python train.py``.

``init()`` wraps any mpi4py communicator (``COMM_WORLD`` by default) in a ``Communicator`` whose
collectives run one of two ways:

* ``algorithm="native"`` (alias ``"mpi"``): MPI's own collective (``Allreduce``, ``Reduce``,
  ``Bcast``, ``Allgather``, ``Reduce_scatter``), where MPI defines the op for the dtype. MEAN
  moves as SUM and is divided once afterwards. Dtypes MPI lacks (float16, bfloat16, non-native
  byte order) go through the core's schedules instead;
* any schedule of the core (``ring``, ``rechd``, ``tree``, ``shuffle``, ``one_device``,
  ``"A/B"``), run over non-blocking point-to-point with receive buffers reused across calls;
* ``algorithm="shm"`` (all-reduce, every rank on one node): one pass through an MPI-3 shared
  window (``mpi_shm.py``).

``auto`` picks between them by size and rank count (crossovers measured, see ``docs/mpi.md``).
Library traffic runs on duplicates of the user's communicator, so it never matches user
messages. Every wait polls with a deadline: a peer that never arrives raises
``CollectiveTimeoutError`` naming it, and an MPI error talking to a peer raises
``PeerFailedError``; either leaves the communicator unusable (messages may still be in
flight), and later calls say so.

Device arrays (CuPy, anything with ``__cuda_array_interface__``) are staged through host
memory: the MPI wheels on PyPI are not CUDA-aware.
"""

from __future__ import annotations

import os
import pickle
import time
import zlib
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from collectives.communicator import Communicator
from collectives.errors import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    PeerFailedError,
)
from collectives.ops import ReduceOp
from collectives.schedule import Collective
from collectives.select import CostModel

if TYPE_CHECKING:  # pragma: no cover - typing only; mpi4py is imported lazily
    from mpi4py import MPI as _MPI

__all__ = ["MAX_COUNT", "MPICommunicator", "MPITransport", "NATIVE", "SHM", "chunks", "init",
           "native_types", "node_groups", "select_algorithm"]

NATIVE = "native"
NATIVE_NAMES = ("native", "mpi")
SHM = "shm"
SHM_NAMES = ("shm", "shared_memory")

# MPI counts are C ints in MPI < 4; mpi4py 4 over an MPI-4 library uses the large-count calls,
# but splitting every message at this many elements (bytes for point-to-point) costs nothing
# and keeps any MPI working. Tests lower it to exercise the split paths with small arrays.
MAX_COUNT = 2**31 - 1

# All-reduce payloads from this many bytes up run the ring schedule under "auto" (measured on
# the 2-vCPU machine with MPICH 5.0.2, benchmarks/mpi_compare.py; keyed by rank count, the
# last entry serving larger counts). Below, MPI's own Allreduce is faster.
RING_FROM_BYTES: dict[int, int] = {2: 16 << 20, 3: 16 << 20, 4: 16 << 20}

# All-reduces from this many bytes up run through shared memory under "auto" when every rank
# shares one node (backends/mpi_shm.py); None: only on request (algorithm="shm"), which is
# where the measurements put it on the 2-vCPU machine (see docs/mpi.md).
SHM_FROM_BYTES: int | None = None

# Native all-reduce of large payloads runs in pieces of this many bytes: MPICH mallocs a
# scratch buffer of half the message per call, and from 16 MiB up glibc serves it by mmap and
# page-faults it in every time (the "64 MiB cliff"); pieces stay on the heap and are reused.
NATIVE_PIECE_BYTES = 8 << 20

# Polling: spin on Test for the first microseconds (a peer a little late: a yield is a ~4 us
# system call here), then yield the core (4 ranks on 2 cores must let the peer run), then
# sleep once a wait is clearly long (a late peer, not a transfer in progress).
SPIN_SECONDS = 50e-6
YIELD_SECONDS = 1.0
SLEEP_SECONDS = 1e-3

# Point-to-point schedules cost about this much per round here (Python + MPICH shared memory).
COST_MODEL = CostModel(latency=15e-6, seconds_per_byte=1 / 4e9, reduce_seconds_per_byte=1 / 8e9)

ENV_RANKS_PER_NODE = "COLLECTIVES_RANKS_PER_NODE"

_MPI_MOD: Any = None


def _mpi():
    """mpi4py's MPI module, imported on first use (importing it initialises MPI)."""
    global _MPI_MOD
    if _MPI_MOD is None:
        from mpi4py import MPI

        _MPI_MOD = MPI
    return _MPI_MOD


# --- pure helpers (no MPI needed; unit-tested directly) -----------------------------------------

def chunks(count: int, limit: int | None = None) -> list[tuple[int, int]] | tuple:
    """Split ``[0, count)`` into consecutive ``(lo, hi)`` pieces of at most ``limit`` items.

    Every MPI call of this transport moves one piece, so no count passed to MPI exceeds
    ``limit`` (``MAX_COUNT`` by default) whatever the array's size.
    """
    limit = MAX_COUNT if limit is None else limit
    if 0 < count <= limit:
        return ((0, count),)  # the usual case, on every call: no list to build
    if limit < 1:
        raise ValueError(f"limit={limit} must be at least 1")
    if count < 0:
        raise ValueError(f"count={count} must be non-negative")
    return [(lo, min(lo + limit, count)) for lo in range(0, count, limit)]


@lru_cache(maxsize=256)
def native_types(dtype: np.dtype, op: ReduceOp | None):
    """``(MPI datatype, MPI op)`` for MPI's own collectives on ``dtype`` with ``op``, or None.

    None means MPI does not define the pair (float16, bfloat16, byte-swapped dtypes), and the
    call runs a schedule. Booleans map MAX/MIN to MPI's LOR/LAND, which MPI does define.
    ``op=None`` asks only for the datatype (broadcast, gather).
    """
    MPI = _mpi()
    dtype = np.dtype(dtype)
    if not dtype.isnative or dtype.kind not in "biufc" or dtype.itemsize not in (1, 2, 4, 8, 16):
        return None
    if dtype.kind == "b":
        ops = {ReduceOp.MAX: MPI.LOR, ReduceOp.MIN: MPI.LAND}
        if op is None:
            return MPI.C_BOOL, None
        return (MPI.C_BOOL, ops[op.wire_op]) if op.wire_op in ops else None
    datatype = {
        ("i", 1): MPI.INT8_T, ("i", 2): MPI.INT16_T, ("i", 4): MPI.INT32_T, ("i", 8): MPI.INT64_T,
        ("u", 1): MPI.UINT8_T, ("u", 2): MPI.UINT16_T, ("u", 4): MPI.UINT32_T,
        ("u", 8): MPI.UINT64_T, ("f", 4): MPI.FLOAT, ("f", 8): MPI.DOUBLE,
        ("c", 8): MPI.C_FLOAT_COMPLEX, ("c", 16): MPI.C_DOUBLE_COMPLEX,
    }.get((dtype.kind, dtype.itemsize))  # float16 and longdouble: MPI has no standard type
    if datatype is None or datatype == MPI.DATATYPE_NULL:
        return None
    if op is None:
        return datatype, None
    ops = {ReduceOp.SUM: MPI.SUM, ReduceOp.PROD: MPI.PROD, ReduceOp.MAX: MPI.MAX,
           ReduceOp.MIN: MPI.MIN}
    if dtype.kind == "c" and op.wire_op in (ReduceOp.MAX, ReduceOp.MIN):
        return None
    return datatype, ops[op.wire_op]


def canonical(algorithm: str) -> str:
    """``"native"`` (MPI's own), ``"shm"`` (shared memory) or the core's canonical name."""
    if isinstance(algorithm, str):
        return _canonical(algorithm)
    from collectives import algorithms

    return algorithms.canonical(algorithm)  # raises its TypeError


@lru_cache(maxsize=256)
def _canonical(algorithm: str) -> str:
    text = algorithm.strip().lower()
    if text in NATIVE_NAMES:
        return NATIVE
    if text in SHM_NAMES:
        return SHM
    from collectives import algorithms

    return algorithms.canonical(algorithm)


def select_algorithm(collective: Collective, size: int, nbytes: int, native_ok: bool,
                     shm_ok: bool = False) -> str:
    """What ``algorithm="auto"`` runs: ``"native"``, ``"shm"`` or a core schedule name.

    MPI's own collectives win below the measured crossover; large all-reduces run through
    shared memory where every rank shares the node (``shm_ok``), else the ring over reused
    buffers. Without a native path (float16, ...) the core's cost model chooses.
    """
    if size == 1:
        return "one_device"  # no messages at all
    if (collective is Collective.ALL_REDUCE and shm_ok and SHM_FROM_BYTES is not None
            and nbytes >= SHM_FROM_BYTES):
        return SHM
    if native_ok:
        if collective is Collective.ALL_REDUCE:
            limit = RING_FROM_BYTES.get(size, RING_FROM_BYTES[max(RING_FROM_BYTES)])
            return "ring" if nbytes >= limit else NATIVE
        return NATIVE
    from collectives import select

    return select.choose(collective, size, nbytes, COST_MODEL)


def groups_from_env(size: int, env: dict | None = None) -> tuple[tuple[int, ...], ...] | None:
    """Groups of ``k`` consecutive ranks when ``COLLECTIVES_RANKS_PER_NODE=k`` is set, else None."""
    env = os.environ if env is None else env
    text = env.get(ENV_RANKS_PER_NODE, "").strip()
    if not text:
        return None
    try:
        k = int(text)
    except ValueError:
        raise ValueError(f"{ENV_RANKS_PER_NODE}={text!r} must be a positive integer "
                         "(ranks per simulated node)") from None
    if k < 1:
        raise ValueError(f"{ENV_RANKS_PER_NODE}={text!r} must be a positive integer")
    return tuple(tuple(range(i, min(i + k, size))) for i in range(0, size, k))


def _tag(parts: tuple, modulus: int) -> int:
    """An MPI tag for an executor tag ``(seq, round, step)``.

    Tags only keep one collective's messages apart from another's; pairing within a round relies
    on MPI's non-overtaking order (both ends post a pair's messages in schedule order), so
    wrapping around the tag space is harmless.
    """
    seq, rnd, step = parts
    return (((seq & 0x1FFF) << 16) | ((rnd & 0xFF) << 8) | (step & 0xFF)) % modulus


def _as_bytes(buf: np.ndarray) -> np.ndarray:
    """The raw bytes of a contiguous array, so any dtype (bfloat16 too) travels as MPI.BYTE."""
    return buf.reshape(-1).view(np.uint8)


# --- requests ---------------------------------------------------------------------------------

class _Send:
    __slots__ = ("dst", "reqs")

    def __init__(self, reqs: list, dst: int):
        self.reqs, self.dst = reqs, dst


class _Recv:
    """A posted receive; ``wait()`` returns the array holding the peer's data."""

    __slots__ = ("data", "reqs", "scratch", "src", "transport")

    def __init__(self, transport: MPITransport, reqs: list, data: np.ndarray, src: int,
                 scratch: bool):
        self.transport, self.reqs, self.data, self.src = transport, reqs, data, src
        self.scratch = scratch

    def wait(self) -> np.ndarray:
        self.transport.wait_requests(self.reqs, lambda: [self.src])
        return self.data


class _Plan:
    """A collective whose algorithm depends on dtype and op, decided when the buffer is known."""

    __slots__ = ("algorithm", "collective", "groups", "nbytes", "root", "shards")

    def __init__(self, collective: Collective, algorithm: str, nbytes: int, root: int,
                 shards: int, groups):
        self.collective, self.algorithm, self.nbytes = collective, algorithm, nbytes
        self.root, self.shards, self.groups = root, shards, groups


class _FastPlan:
    """What a native all-reduce of one (shape, dtype, op, algorithm) needs on every call."""

    __slots__ = ("final", "op", "same_dtype", "signature", "types")

    def __init__(self, op: ReduceOp, final: np.dtype, same_dtype: bool, types: tuple,
                 signature: dict):
        self.op, self.final, self.same_dtype = op, final, same_dtype
        self.types, self.signature = types, signature


# --- the transport ----------------------------------------------------------------------------

class MPITransport:
    """Point-to-point, agreement and MPI's own collectives over an mpi4py communicator."""

    def __init__(self, comm: _MPI.Comm):
        MPI = _mpi()
        self.data = comm.Dup()  # schedule and native traffic
        self.ctrl = comm.Dup()  # agreements: never matched against data messages
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        from .mpi_shm import SharedAllReduce

        self.node = self.data.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.shm = SharedAllReduce(self, self.node)
        self.what = "collective"
        self.timeout = 300.0
        self.cost_model = COST_MODEL
        self.broken: str | None = None
        self._data_tags = self.data.Get_attr(MPI.TAG_UB) + 1
        self._ctrl_tags = self.ctrl.Get_attr(MPI.TAG_UB) + 1
        self._arena = np.empty(0, np.uint8)
        self._arena_used = 0
        self._outstanding = 0
        self._status = MPI.Status()
        self._sent: tuple | None = None

    # -- waiting ---------------------------------------------------------------------------

    def wait_requests(self, reqs: Sequence, missing: Callable[[], list],
                      timeout: float | None = None) -> None:
        """Poll ``reqs`` until all complete; raise naming ``missing()`` at the deadline."""
        MPI = _mpi()
        if not reqs:
            return
        test = reqs[0].Test if len(reqs) == 1 else (lambda: MPI.Request.Testall(reqs))
        try:
            if test():
                return
            start = time.monotonic()
            timeout = self.timeout if timeout is None else timeout
            deadline, spin_until = start + timeout, start + SPIN_SECONDS
            yield_until = start + YIELD_SECONDS
            while not test():
                now = time.monotonic()
                if now < spin_until:
                    continue
                if now >= deadline:
                    raise self._fail(CollectiveTimeoutError(self.what, missing(), timeout,
                                                            self.rank))
                if now < yield_until:
                    os.sched_yield()
                else:
                    time.sleep(SLEEP_SECONDS)
        except MPI.Exception as exc:
            raise self._fail(PeerFailedError(
                f"rank {self.rank}: {self.what} failed while waiting for rank(s) "
                f"{', '.join(map(str, sorted(set(missing()))))}: {exc.Get_error_string()}")) from exc

    def _fail(self, exc: CollectiveError) -> CollectiveError:
        self.broken = str(exc)
        return exc

    def check_usable(self) -> None:
        if self.broken is not None:
            raise CollectiveError(
                f"rank {self.rank}: this MPI communicator is unusable after an earlier failure "
                f"({self.broken}); messages of that collective may still be in flight")

    # -- point-to-point for the core's executor -----------------------------------------------

    def _scratch(self, nbytes: int) -> np.ndarray:
        """Receive space from an arena reused across calls (no per-call malloc of big buffers)."""
        start = -(-self._arena_used // 64) * 64
        if start + nbytes > len(self._arena):
            if self._outstanding:  # others still read the arena: a one-off buffer this time
                self._arena_used = len(self._arena) + nbytes  # and grow on the next reset
                return np.empty(nbytes, np.uint8)
            self._arena = np.empty(max(nbytes, self._arena_used, 2 * len(self._arena)), np.uint8)
            start = 0
        self._arena_used = start + nbytes
        return self._arena[start:start + nbytes]

    def _reset_scratch(self) -> None:
        if self._arena_used > len(self._arena):
            self._arena = np.empty(self._arena_used, np.uint8)
        self._arena_used = 0

    def isend(self, buf: np.ndarray, dst: int, tag: tuple) -> _Send:
        raw, t = _as_bytes(buf), _tag(tag, self._data_tags)
        return _Send([self.data.Isend([raw[a:b], _mpi().BYTE], dst, t)
                      for a, b in chunks(len(raw))], dst)

    def irecv(self, like: np.ndarray, src: int, tag: tuple) -> _Recv:
        data = self._scratch(like.nbytes).view(like.dtype)
        self._outstanding += 1
        return self._post_recv(data, src, tag, scratch=True)

    def irecv_into(self, dst: np.ndarray, src: int, tag: tuple) -> _Recv:
        """Receive straight into ``dst`` (a copy step needs no scratch and no second copy)."""
        return self._post_recv(dst, src, tag, scratch=False)

    def _post_recv(self, data: np.ndarray, src: int, tag: tuple, scratch: bool) -> _Recv:
        raw, t = _as_bytes(data), _tag(tag, self._data_tags)
        reqs = [self.data.Irecv([raw[a:b], _mpi().BYTE], src, t) for a, b in chunks(len(raw))]
        return _Recv(self, reqs, data, src, scratch)

    def release(self, request: _Recv) -> None:
        if request.scratch and self._outstanding:
            self._outstanding -= 1
            if not self._outstanding:
                self._reset_scratch()

    def waitall(self, requests: Sequence[_Send]) -> None:
        reqs = [r for s in requests for r in s.reqs]
        self.wait_requests(reqs, lambda: sorted({s.dst for s in requests
                                                 if not _mpi().Request.Testall(s.reqs)}))

    def abandon(self, receives: Sequence[_Recv]) -> None:
        """Cancel receives left posted by a failed collective, so they write nothing later,
        and give back the scratch arena they held."""
        requests = [req for recv in receives for req in recv.reqs]
        for req in requests:
            try:
                req.Cancel()
            except _mpi().Exception:  # already complete, or the library cannot cancel
                pass
        try:  # a cancelled request is freed only once completed
            _mpi().Request.Testall(requests)
        except _mpi().Exception:
            pass
        self._outstanding = 0
        self._reset_scratch()

    # -- agreement ---------------------------------------------------------------------------

    def agree(self, key, item, timeout: float) -> list:
        """Every rank's ``item`` in rank order; raises naming the ranks that never arrive.

        Each rank sends its pickled ``(kind, collective, item)`` to every other rank on the
        control communicator under a tag derived from the call's sequence number, then
        receives one message from each rank. Whoever has not sent by the deadline is missing.
        """
        MPI = _mpi()
        self.check_usable()
        kind = key[0] if isinstance(key, tuple) else key
        seq = (key[-1] if isinstance(key, tuple) and isinstance(key[-1], int)
               else zlib.crc32(repr(key).encode()))  # hash() differs between processes
        tag = seq % self._ctrl_tags
        envelope = (kind, self.what, item)
        if self._sent is not None and self._sent[0] is item and self._sent[1] == envelope[:2]:
            mine = self._sent[2]  # a fast-path call repeats its signature object: no pickling
        else:
            mine = pickle.dumps(envelope, protocol=pickle.HIGHEST_PROTOCOL)
            self._sent = (item, envelope[:2], mine)
        got: dict[int, bytes] = {self.rank: mine}
        if self.size > 1:
            sends = [self.ctrl.Isend([mine, MPI.BYTE], r, tag)
                     for r in range(self.size) if r != self.rank]
            status, ctrl = self._status, self.ctrl

            def arrived() -> bool:
                while True:
                    msg = ctrl.Improbe(MPI.ANY_SOURCE, tag, status)
                    if msg is None:
                        return len(got) == self.size
                    data = bytearray(status.Get_count(MPI.BYTE))
                    msg.Recv([data, MPI.BYTE])
                    got[status.Get_source()] = bytes(data)
                    if len(got) == self.size:
                        return True

            missing = lambda: [r for r in range(self.size) if r not in got]  # noqa: E731
            self.wait_requests([_Condition(arrived)], missing, timeout)
            self.wait_requests(sends, missing, timeout)
        if all(v == mine for v in got.values()):  # the usual case: nothing to decode
            return [item] * self.size
        decoded = [pickle.loads(got[r]) for r in range(self.size)]
        if len({(k, w) for k, w, _ in decoded}) > 1:
            by_rank = ", ".join(f"rank {r}: {w}" for r, (_, w, _) in enumerate(decoded))
            raise CollectiveMismatchError(
                f"rank {self.rank}: ranks called different collectives at the same point "
                f"({by_rank}); every rank must call the same collectives in the same order")
        return [d[2] for d in decoded]

    # -- MPI's own collectives ---------------------------------------------------------------

    def native_ok(self, collective: Collective, buf: np.ndarray, op: ReduceOp,
                  granule: int = 1) -> bool:
        """Whether MPI's own collective can run this call."""
        if collective in (Collective.BROADCAST, Collective.ALL_GATHER):
            return True  # they move raw bytes: any dtype travels
        if native_types(buf.dtype, op) is None:
            return False
        if collective is Collective.REDUCE_SCATTER:
            return len(buf) <= MAX_COUNT  # one call; its per-rank blocks are not split
        return True

    def native(self, collective: Collective, buf: np.ndarray, op: ReduceOp, *, root: int = 0,
               granule: int = 1) -> None:
        """MPI's own ``collective`` on flat ``buf`` in place, polled against the deadline."""
        MPI = _mpi()
        everyone = self._everyone
        if collective is Collective.BROADCAST:
            raw = _as_bytes(buf)
            for a, b in chunks(len(raw)):
                self.wait_requests([self.data.Ibcast([raw[a:b], MPI.BYTE], root)], everyone)
            return
        if collective is Collective.ALL_GATHER:
            self._all_gather(buf, granule, everyone)
            return
        datatype, mop = native_types(buf.dtype, op)
        if collective is Collective.ALL_REDUCE:
            self.all_reduce_into(buf, buf, (datatype, mop))
        elif collective is Collective.REDUCE:
            for a, b in chunks(len(buf)):
                send = MPI.IN_PLACE if self.rank == root else [buf[a:b], datatype]
                recv = [buf[a:b], datatype] if self.rank == root else None
                self.wait_requests([self.data.Ireduce(send, recv, mop, root)], everyone)
        elif collective is Collective.REDUCE_SCATTER:
            n, rows = self.size, (len(buf) // granule if granule else 0)
            starts = [i * rows // n * granule for i in range(n + 1)]
            counts = [starts[i + 1] - starts[i] for i in range(n)]
            lo, hi = starts[self.rank], starts[self.rank + 1]
            mine = self._scratch(buf[lo:hi].nbytes).view(buf.dtype)
            try:
                self.wait_requests([self.data.Ireduce_scatter(
                    [buf, datatype], [mine, datatype], counts, mop)], everyone)
                buf[lo:hi] = mine
            finally:
                self._reset_scratch()
        else:  # pragma: no cover - every Collective is handled above
            raise ValueError(f"no native {collective.value}")

    def all_reduce_into(self, src: np.ndarray, dst: np.ndarray, types: tuple, *,
                        aliased: bool = True) -> None:
        """MPI's Allreduce of flat ``src`` into flat ``dst``.

        Never the in-place form: MPI wants MPI_IN_PLACE on all ranks or none, and ranks reach
        this from different paths, so an aliased ``src`` is first copied to scratch. Large
        payloads go in ``NATIVE_PIECE_BYTES`` pieces, so MPICH's per-call scratch stays on the
        heap instead of being mmapped and page-faulted in on every call.
        """
        datatype, mop = types
        if not aliased and dst.nbytes <= NATIVE_PIECE_BYTES and len(dst) <= MAX_COUNT:
            request = self.data.Iallreduce([src, datatype], [dst, datatype], mop)
            self.wait_requests((request,), self._everyone)
            return
        if aliased and np.may_share_memory(src, dst):
            src = self._scratch(src.nbytes).view(src.dtype)
            np.copyto(src, dst)
        try:
            piece = min(MAX_COUNT, max(1, NATIVE_PIECE_BYTES // dst.itemsize))
            for a, b in chunks(len(dst), piece):
                request = self.data.Iallreduce([src[a:b], datatype], [dst[a:b], datatype], mop)
                self.wait_requests((request,), self._everyone)
        finally:
            if not self._outstanding:
                self._reset_scratch()

    def _everyone(self) -> list[int]:
        """Who a native collective waits for: MPI cannot say which peers are missing."""
        return [r for r in range(self.size) if r != self.rank]

    def _all_gather(self, buf: np.ndarray, granule: int, everyone) -> None:
        MPI = _mpi()
        raw = _as_bytes(buf)
        block = len(raw) // self.size
        if block <= MAX_COUNT:
            self.wait_requests([self.data.Iallgather(MPI.IN_PLACE, [raw, MPI.BYTE])], everyone)
            return
        # Blocks beyond one call's count: each rank broadcasts its block in pieces.
        for p in range(self.size):
            for a, b in chunks(block):
                self.wait_requests([self.data.Ibcast(
                    [raw[p * block + a:p * block + b], MPI.BYTE], p)], everyone)

    def free(self) -> None:
        """Free the duplicated communicators (collective: every rank must call it)."""
        self.shm.free()
        for comm in (self.node, self.data, self.ctrl):
            if comm != _mpi().COMM_NULL:
                comm.Free()


class _Condition:
    """Makes a Python predicate pollable like an MPI request (``Test()``)."""

    __slots__ = ("Test",)

    def __init__(self, test: Callable[[], bool]):
        self.Test = test


# --- device arrays ------------------------------------------------------------------------------

def _on_device(x) -> bool:
    return x is not None and hasattr(x, "__cuda_array_interface__")


def _to_host(x):
    if not _on_device(x):
        return x
    import cupy

    return cupy.asnumpy(x)


def _to_device(result, like, out=None):
    """Return ``result`` as a device array on ``like``'s device, or written into ``out``."""
    if result is None:
        return None
    import cupy

    if out is not None and _on_device(out):
        cupy.asarray(out)[...] = cupy.asarray(result)
        return out
    if out is not None:  # a host ``out`` for a device input: fill it as asked
        np.copyto(out, result)
        return out
    device = getattr(like, "device", None)  # CuPy's Device is a context manager
    with device if hasattr(device, "__enter__") else nullcontext():
        return cupy.asarray(result)


# --- the communicator -------------------------------------------------------------------------

class MPICommunicator(Communicator):
    """The SPMD ``Communicator`` over MPI, with MPI's own collectives as algorithm ``"native"``.

    ``groups`` (the ranks of each node) is the default of every two-level ``"A/B"`` call.
    ``last_algorithm`` names what the latest collective ran (``"native"`` or a schedule).
    """

    transport: MPITransport

    def __init__(self, transport: MPITransport, *, timeout: float = 300.0, check: bool = True,
                 groups=None):
        super().__init__(transport, timeout=timeout, check=check, name="mpi")
        self.groups = groups
        self.last_algorithm: str | None = None
        self._fast: dict = {}

    def __repr__(self) -> str:
        nodes = f", {len(self.groups)} node(s)" if self.groups else ""
        return f"<Communicator mpi rank {self.rank} of {self.size}{nodes}>"

    # --- hooks into the core's Communicator (see docs/mpi.md, "core hooks") ---------------

    def _begin(self, collective: str, timeout: float | None, signature: dict) -> list[dict]:
        self.transport.check_usable()
        return super()._begin(collective, timeout, signature)

    def _signature(self, collective, x=None, op=None, root=None, algorithm="auto", *args,
                   **kwargs) -> dict:
        name = canonical(algorithm)  # validates; the core's canonical() rejects "native"
        signature = super()._signature(collective, x, op, root,
                                       "auto" if name in (NATIVE, SHM) else algorithm, *args,
                                       **kwargs)
        signature["algorithm"] = name
        return signature

    def _schedule(self, collective: Collective, algorithm: str, nbytes: int, *, root: int = 0,
                  shards: int = 0, groups=None):
        groups = self.groups if groups is None else groups
        name = canonical(algorithm)
        if name == SHM and collective is not Collective.ALL_REDUCE:
            raise ValueError(f"algorithm={algorithm!r} has only all_reduce; use 'auto', "
                             "'native' or a schedule")
        if name in ("auto", NATIVE, SHM):  # the choice needs the dtype and op: made in _run
            return _Plan(collective, name, nbytes, root, shards, groups)
        return super()._schedule(collective, name, nbytes, root=root, shards=shards,
                                 groups=groups)

    def _run(self, schedule, buf: np.ndarray, op: ReduceOp, granule: int = 1) -> None:
        if isinstance(schedule, _Plan):
            plan = schedule
            native_ok = self.transport.native_ok(plan.collective, buf, op, granule)
            shm_ok = self.transport.shm.single_node
            if plan.algorithm == NATIVE and native_ok and self.size > 1:
                name = NATIVE
            elif plan.algorithm == SHM and shm_ok and self.size > 1:
                name = SHM
            else:
                name = select_algorithm(plan.collective, self.size, plan.nbytes, native_ok,
                                        shm_ok)
            if name == SHM:
                self.last_algorithm = SHM
                self.transport.shm.all_reduce(buf, op)
                return
            if name == NATIVE:
                self.last_algorithm = NATIVE
                self.transport.native(plan.collective, buf, op, root=plan.root, granule=granule)
                return
            schedule = super()._schedule(plan.collective, name, plan.nbytes, root=plan.root,
                                         shards=plan.shards, groups=plan.groups)
        self.last_algorithm = schedule.name
        super()._run(schedule, buf, op, granule)

    # --- collectives: device arrays are staged through the host -----------------------------

    def all_reduce(self, x, op: ReduceOp | str = "sum", algorithm: str = "auto", *, out=None,
                   shards: int = 0, groups=None, timeout: float | None = None):
        """Reduce ``x`` over all ranks; every rank gets the (bitwise identical) result."""
        if type(x) is np.ndarray and not shards and groups is None and not _on_device(out):
            plan = self._fast.get((x.shape, x.dtype, op, algorithm))
            if plan is None:
                plan = self._fast_plan(x, op, algorithm)
            if plan:
                return self._native_all_reduce(x, plan, out, timeout)
        if _on_device(x) or _on_device(out):
            result = super().all_reduce(_to_host(x), op, algorithm, shards=shards, groups=groups,
                                        timeout=timeout)
            return _to_device(result, x, out)
        return super().all_reduce(x, op, algorithm, out=out, shards=shards, groups=groups,
                                  timeout=timeout)

    # The fast path: an all-reduce that runs MPI's own Allreduce skips the core's per-call
    # bookkeeping (validation, signature, planning: ~30 us here, several times MPICH's 4 KiB
    # latency). Everything that depends only on (shape, dtype, op, algorithm) is computed once,
    # by the same core functions and so with the same errors, and cached.

    def _fast_plan(self, x: np.ndarray, op, algorithm: str):
        """The cached facts of a native all-reduce, or False when it runs another way."""
        from collectives.ops import result_dtype
        from collectives.validate import check_op

        key = (x.shape, x.dtype, op, algorithm)
        parsed = check_op(op, x.dtype, "x")
        name = canonical(algorithm)
        types = native_types(x.dtype, parsed)
        plan: Any = False
        if types is not None and self.size > 1 and (
                name == NATIVE or (name == "auto" and select_algorithm(
                    Collective.ALL_REDUCE, self.size, x.nbytes, True,
                    self.transport.shm.single_node) == NATIVE)):
            final = result_dtype(parsed, x.dtype)
            plan = _FastPlan(parsed, final, final == x.dtype, types,
                             self._signature("all_reduce", x, parsed, None, algorithm, 0))
        if len(self._fast) > 1024:  # programs use few distinct shapes; bound it anyway
            self._fast.clear()
        self._fast[key] = plan
        return plan

    def _native_all_reduce(self, x: np.ndarray, plan: _FastPlan, out, timeout):
        from collectives.ops import divide_for_mean

        if out is not None:
            from collectives.validate import check_out

            check_out(out, x.shape, plan.final)
        self._begin("all_reduce", timeout, plan.signature)
        src = x if x.flags.c_contiguous else np.ascontiguousarray(x)
        work = out if out is not None and plan.same_dtype else np.empty(x.shape, x.dtype)
        if x.ndim != 1:
            src, flat_work = src.reshape(-1), work.reshape(-1)
        else:
            flat_work = work
        aliased = work is out and (out is x or np.may_share_memory(src, flat_work))
        self.transport.all_reduce_into(src, flat_work, plan.types, aliased=aliased)
        self.last_algorithm = NATIVE
        if plan.op is ReduceOp.MEAN:
            return divide_for_mean(work, self.size, out=out if out is not None else
                                   (work if plan.same_dtype else None))
        return work

    def reduce(self, x, op: ReduceOp | str = "sum", root: int = 0, algorithm: str = "auto", *,
               shards: int = 0, timeout: float | None = None):
        """Reduce onto ``root``; returns the result there and None on every other rank."""
        result = super().reduce(_to_host(x), op, root, algorithm, shards=shards, timeout=timeout)
        return _to_device(result, x) if _on_device(x) else result

    def broadcast(self, x=None, root: int = 0, algorithm: str = "auto", *, out=None,
                  timeout: float | None = None):
        """Every rank gets root's ``x``; other ranks may pass None (or ``out`` to fill)."""
        if _on_device(x) or _on_device(out):
            result = super().broadcast(_to_host(x), root, algorithm, timeout=timeout)
            return _to_device(result, x if x is not None else out, out)
        return super().broadcast(x, root, algorithm, out=out, timeout=timeout)

    def all_gather(self, x, axis: int = 0, algorithm: str = "auto", *,
                   timeout: float | None = None):
        """Concatenation of every rank's ``x`` along ``axis``, in rank order."""
        result = super().all_gather(_to_host(x), axis, algorithm, timeout=timeout)
        return _to_device(result, x) if _on_device(x) else result

    def reduce_scatter(self, x, op: ReduceOp | str = "sum", algorithm: str = "auto", *,
                       shards: int = 0, timeout: float | None = None):
        """Reduce, then rank ``i`` keeps rows ``floor(i R / n)`` to ``floor((i+1) R / n)``."""
        result = super().reduce_scatter(_to_host(x), op, algorithm, shards=shards,
                                        timeout=timeout)
        return _to_device(result, x) if _on_device(x) else result

    def barrier(self, timeout: float | None = None) -> None:
        """Return once every rank has arrived (or raise naming those that did not)."""
        self.transport.check_usable()
        super().barrier(timeout)

    def free(self) -> None:
        """Release the library's duplicated communicators (every rank must call it)."""
        self.transport.free()

    def abort(self, code: int = 1) -> None:
        """End the whole MPI job now (``MPI_Abort``): the way out after a ``CollectiveError``,
        since ``MPI_Finalize`` at exit may wait forever for a dead or hung peer."""
        self.transport.data.Abort(code)


# --- entry point --------------------------------------------------------------------------------

def node_groups(comm: _MPI.Comm) -> tuple[tuple[int, ...], ...]:
    """The ranks of ``comm`` sharing each node (``COMM_TYPE_SHARED``), in rank order.

    ``COLLECTIVES_RANKS_PER_NODE=k`` instead simulates nodes of ``k`` consecutive ranks, so a
    single machine exercises the cross-node path of two-level algorithms. Collective.
    """
    size = comm.Get_size()
    simulated = groups_from_env(size)
    if simulated is not None:
        return simulated
    MPI = _mpi()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        node_leader = local.allreduce(comm.Get_rank(), op=MPI.MIN)
    finally:
        local.Free()
    leaders = comm.allgather(node_leader)
    groups: dict[int, list[int]] = {}
    for rank, leader in enumerate(leaders):
        groups.setdefault(leader, []).append(rank)
    return tuple(tuple(g) for _, g in sorted(groups.items()))


def init(comm: _MPI.Comm | None = None, *, timeout: float = 300.0, check: bool = True,
         groups: Sequence[Sequence[int]] | int | str | None = "node") -> MPICommunicator:
    """A ``Communicator`` over ``comm`` (default ``MPI.COMM_WORLD``). Collective: call on every rank.

    ``timeout`` is every call's default deadline in seconds; ``check=False`` skips the
    cross-rank argument check (one small exchange per call). ``groups`` is the default for
    two-level ``"A/B"`` algorithms: ``"node"`` (ranks sharing a node, or
    ``COLLECTIVES_RANKS_PER_NODE``), a group size, an explicit partition, or None.
    """
    MPI = _mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    if groups == "node":
        groups = node_groups(comm)
    elif isinstance(groups, str):
        raise ValueError(f"groups={groups!r}: use 'node', a group size, a list of groups or None")
    if groups is not None:
        from collectives.api import resolve_groups

        groups = resolve_groups(groups, comm.Get_size())
    return MPICommunicator(MPITransport(comm), timeout=timeout, check=check, groups=groups)
