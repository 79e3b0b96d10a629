"""The embedded transport: NumPy arrays in one process, nothing to install.

* Multi-device: the "devices" are logical CPU devices sharing this process's memory. Steps
  run tile by tile on a small pool of worker threads (NumPy releases the GIL inside its
  kernels, so the cores really work in parallel).
* SPMD: ranks are threads. A send posts a view of the sender's buffer and a receive reads
  straight out of it (zero copies); the sender's round ends when every receiver is done.
  Waits time out with ``CollectiveTimeoutError`` naming the ranks that never came, and a
  rank that fails wakes the others with ``PeerFailedError`` instead of leaving them hanging.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from collectives.communicator import Communicator
from collectives.errors import CollectiveTimeoutError, PeerFailedError
from collectives.ops import accumulate, combine_into
from collectives.select import CostModel

TILE_BYTES = 512 * 1024  # a tile of every buffer of a few participants stays in L2
PARALLEL_BYTES = 1 << 20  # below this, handing work to threads costs more than it saves


class NumpyDevices:
    """Multi-device backend for NumPy arrays (logical CPU devices in one address space)."""

    cost_model = CostModel(latency=1e-6, shared_memory=True)

    def __init__(self, workers: int | None = None):
        self.workers = workers or min(os.cpu_count() or 1, 8)
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="collectives")

    def empty_like(self, like, shape, dtype):
        return np.empty(shape, dtype)

    def empty_on(self, device, like, shape, dtype):
        return np.empty(shape, dtype)

    def copy(self, dst, src) -> None:
        np.copyto(dst, src)

    def combine(self, op, dst, srcs) -> None:
        accumulate(op, dst, srcs)

    def combine_into(self, op, dst, first, srcs) -> None:
        combine_into(op, dst, first, srcs)

    def concatenate(self, stacked, axis):
        return np.concatenate(list(stacked), axis=axis)

    def map_parallel(self, fn: Callable[[int, int], None], length: int, itemsize: int) -> None:
        """Call ``fn(a, b)`` over tiles covering ``[0, length)``, spread over the workers."""
        tile = max(1, TILE_BYTES // itemsize)
        if length * itemsize < PARALLEL_BYTES or self.workers == 1:
            for a in range(0, max(length, 1), tile):
                fn(a, min(a + tile, length))
            return
        tiles = [(a, min(a + tile, length)) for a in range(0, length, tile)]
        share = -(-len(tiles) // self.workers)
        groups = [tiles[i:i + share] for i in range(0, len(tiles), share)]

        def run(group):
            for a, b in group:
                fn(a, b)

        futures = [self._pool.submit(run, g) for g in groups[1:]]
        run(groups[0])
        for f in futures:
            f.result()


@lru_cache(maxsize=1)
def devices() -> NumpyDevices:
    return NumpyDevices()


# --- SPMD: ranks as threads -------------------------------------------------------------------

class _Send:
    __slots__ = ("data", "done", "dst")

    def __init__(self, data, dst):
        self.data, self.dst, self.done = data, dst, False


class _Recv:
    __slots__ = ("key", "src", "send")

    def __init__(self, key, src):
        self.key, self.src, self.send = key, src, None


class ThreadWorld:
    """State shared by the thread ranks of one ``run``: mailboxes and arrival tables."""

    def __init__(self, size: int, timeout: float):
        self.size, self.timeout = size, timeout
        self.lock = threading.Lock()
        # One condition per rank over one lock: a message wakes only the rank it is for.
        self.conds = [threading.Condition(self.lock) for _ in range(size)]
        self.mail: dict = {}
        self.tables: dict = {}
        self.failed: dict[int, BaseException] = {}

    def wake_all(self) -> None:
        for cond in self.conds:
            cond.notify_all()

    def fail(self, rank: int, exc: BaseException) -> None:
        with self.lock:
            self.failed.setdefault(rank, exc)
            self.wake_all()

    def wait_for(self, ready: Callable[[], bool], rank: int, what: str, missing: Callable[[], list],
                 timeout: float) -> None:
        deadline = time.monotonic() + timeout
        cond = self.conds[rank]
        with self.lock:
            while not ready():
                others = {r: e for r, e in self.failed.items() if r != rank}
                causes = {r: e for r, e in others.items() if not isinstance(e, PeerFailedError)}
                others = causes or others
                if others:
                    who, exc = min(others.items())
                    raise PeerFailedError(f"rank {rank}: {what} cannot finish because rank {who} "
                                          f"failed: {type(exc).__name__}: {exc}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeoutError(what, missing(), timeout, rank)
                cond.wait(min(left, 0.5))


class ThreadTransport:
    """One rank's endpoint in a ``ThreadWorld``."""

    def __init__(self, world: ThreadWorld, rank: int):
        self.world, self.rank, self.size = world, rank, world.size
        self.what = "collective"
        self.timeout = world.timeout

    def isend(self, buf, dst, tag):
        send = _Send(buf, dst)
        with self.world.lock:
            self.world.mail[(self.rank, dst, tag)] = send
            self.world.conds[dst].notify()
        return send

    def irecv(self, like, src, tag):
        return _Recv((src, self.rank, tag), src)

    def wait(self, req: _Recv):
        mail = self.world.mail
        self.world.wait_for(lambda: req.key in mail, self.rank, self.what,
                            lambda: [req.src], self.timeout)
        with self.world.lock:
            req.send = mail.pop(req.key)
        return req.send.data

    def release(self, req: _Recv) -> None:
        with self.world.lock:
            req.send.done = True
            self.world.conds[req.src].notify()

    def waitall(self, sends: Sequence[_Send]) -> None:
        self.world.wait_for(lambda: all(s.done for s in sends), self.rank, self.what,
                            lambda: sorted({s.dst for s in sends if not s.done}), self.timeout)

    def agree(self, key, item, timeout: float) -> list:
        """Every rank posts ``item`` under ``key``; returns all ranks' items in rank order."""
        world = self.world
        with world.lock:
            entry = world.tables.setdefault(key, ({}, set()))
            items, readers = entry
            items[self.rank] = item
            world.wake_all()
        world.wait_for(lambda: len(items) == self.size, self.rank, self.what,
                       lambda: [r for r in range(self.size) if r not in items], timeout)
        with world.lock:
            readers.add(self.rank)
            if len(readers) == self.size:  # the last reader clears the table
                del world.tables[key]
        return [items[r] for r in range(self.size)]


class _RecvRequest:
    """Adapter so the executor can call ``req.wait()`` on a thread receive."""

    __slots__ = ("transport", "recv")

    def __init__(self, transport, recv):
        self.transport, self.recv = transport, recv

    def wait(self):
        return self.transport.wait(self.recv)


class ThreadPointToPoint(ThreadTransport):
    def irecv(self, like, src, tag):
        return _RecvRequest(self, super().irecv(like, src, tag))

    def release(self, req) -> None:
        super().release(req.recv)


def run(fn: Callable[[Communicator], object], size: int, *, timeout: float = 60.0,
        args: tuple = (), check: bool = True) -> list:
    """Call ``fn(comm, *args)`` on ``size`` thread ranks; return their results in rank order.

    An exception in any rank is re-raised here (the lowest failing rank's; the others are
    told a peer failed instead of hanging).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size={size!r} must be a positive number of ranks")
    world = ThreadWorld(size, timeout)
    results: list = [None] * size
    errors: dict[int, BaseException] = {}

    def body(rank: int) -> None:
        comm = Communicator(ThreadPointToPoint(world, rank), timeout=timeout, check=check,
                            name="local")
        try:
            results[rank] = fn(comm, *args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller below
            errors[rank] = exc
            world.fail(rank, exc)

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True)
               for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        # Prefer the root cause over the "a peer failed" echoes of it.
        primary = {r: e for r, e in errors.items() if not isinstance(e, PeerFailedError)} or errors
        raise primary[min(primary)]
    return results
