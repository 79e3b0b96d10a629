"""Ways (a)-(d) and (g) of ``train_step.py``: a gradient list (backward order) all-reduced
bucket by bucket as its tensors become ready, each way as ``ready(k, g)`` and ``wait()``."""

from __future__ import annotations

import threading
import time

import numpy as np

FIRST_BUCKET = 1 << 20  # DDP's and the library's small first bucket


def runs(grads: list, bucket_bytes: int) -> list[list[int]]:
    """DDP's buckets: runs of consecutive tensors, the first at most 1 MiB, then ``bucket_bytes``."""
    groups: list[list[int]] = [[]]
    filled = 0
    for k, g in enumerate(grads):
        cap = min(FIRST_BUCKET, bucket_bytes) if len(groups) == 1 else bucket_bytes
        if groups[-1] and filled + g.nbytes > cap:
            groups.append([])
            filled = 0
        groups[-1].append(k)
        filled += g.nbytes
    return groups


class HandPacked:
    """Ways (c) and (d): each run's tensors copied into its buffer as they become ready; a
    complete buffer starts its all-reduce (``start(buf)`` returns its handle)."""

    def __init__(self, grads: list, bucket_bytes: int, start, finish):
        self.grads, self.groups = grads, runs(grads, bucket_bytes)
        self.bufs = [np.empty(sum(grads[k].size for k in g), np.float32) for g in self.groups]
        self.last = {g[-1]: b for b, g in enumerate(self.groups)}
        self.start, self.finish = start, finish
        self.handles: list = []

    def ready(self, k: int, x) -> None:
        if k in self.last:
            b = self.last[k]
            np.concatenate([self.grads[i].reshape(-1) for i in self.groups[b]], out=self.bufs[b])
            self.handles.append(self.start(self.bufs[b]))

    def wait(self) -> list:
        self.finish(self.handles)
        self.handles = []
        out = []
        for g, buf in zip(self.groups, self.bufs, strict=True):
            offset = 0
            for k in g:
                out.append(buf[offset:offset + self.grads[k].size].reshape(self.grads[k].shape))
                offset += self.grads[k].size
        return out


class Polled:
    """Way (g): MPI's own calls with the progress a caller could give them: the buckets'
    ``Iallreduce`` tested by a thread of their own every ``poll`` seconds until ``wait()``
    (MPICH moves data only inside MPI calls, so ``poll`` sets their pace: the table's
    communication-alone column shows whether it kept up with a blocking ``Waitall``, way (d)).
    What MPI and the kernel cost the cores beside a compute, with no library between."""

    def __init__(self, comm, poll: float = 2e-4):
        self.comm, self.poll = comm, poll
        self.requests: list = []
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stop = False

    def start(self, buf) -> None:
        from mpi4py import MPI

        with self.lock:
            self.requests.append(self.comm.Iallreduce(MPI.IN_PLACE, buf))
        if self.thread is None:
            self.stop = False
            self.thread = threading.Thread(target=self._drive, daemon=True)
            self.thread.start()

    def _drive(self) -> None:
        from mpi4py import MPI

        while not self.stop:
            with self.lock:
                MPI.Request.Testall(self.requests)
            time.sleep(self.poll)

    def finish(self, _handles) -> None:
        from mpi4py import MPI

        if self.thread is not None:
            self.stop = True
            self.thread.join()
            self.thread = None
        MPI.Request.Waitall(self.requests)
        self.requests = []


def numpy_ways(comm, world, grads: list, bucket_bytes: int, poll: float = 2e-4) -> dict:
    """Ways (a)-(d) and (g) (its thread testing every ``poll`` seconds): name ->
    (ready(k, g), wait() -> reduced list)."""
    from mpi4py import MPI

    mine = world.Dup()
    a = comm.buckets(grads, bucket_bytes=bucket_bytes)
    b = comm.buckets(grads, bucket_bytes=0)
    c = HandPacked(grads, bucket_bytes, lambda buf: comm.all_reduce(buf, out=buf, async_op=True),
                   lambda hs: [h.wait() for h in hs])
    d = HandPacked(grads, bucket_bytes, lambda buf: mine.Iallreduce(MPI.IN_PLACE, buf),
                   MPI.Request.Waitall)
    polled = Polled(mine.Dup(), poll)
    g = HandPacked(grads, bucket_bytes, polled.start, polled.finish)
    return {f"(a) buckets {bucket_bytes / 2**20:g} MiB": (a.ready, a.wait),
            "(b) buckets bucket_bytes=0": (b.ready, b.wait),
            "(c) hand-packed async all_reduce": (c.ready, c.wait),
            "(d) mpi4py Iallreduce + Waitall": (d.ready, d.wait),
            f"(g) mpi4py Iallreduce, tested every {poll * 1e3:g} ms": (g.ready, g.wait)}
