"""Point-to-point channels: what the SPMD executor sends and receives over MPI.

A channel owns a duplicate of the user's communicator (the ``data``, ``control`` and ``p2p``
channels own one each, so their messages never match each other's or the user's own MPI
calls'). ``p2p`` carries the communicator's ``send``/``recv``, tagged with the user's tag. Sends and receives
are ``Isend``/``Irecv`` of raw bytes (any dtype travels), split at ``MAX_COUNT`` bytes.
Receives land in place where the executor asks, else in a scratch arena that is reused from
call to call (it grows to the largest set of receives outstanding at once, and stays).

Ranks that disagree never pair up silently: a tag carries the call's check bits, so a
receive never matches a message of another call; a receive that has waited a couple of
milliseconds probes for a message from its source with the same sequence bits but other
check bits and raises ``CollectiveMismatchError``. A message of the wrong
size (``check=False``: nothing agreed on the lengths) raises the same error, from the
receive's status or MPI's truncation error.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from collectives.arrays import NUMPY
from collectives.errors import CollectiveMismatchError, PeerFailedError

from . import leftovers, tuning
from .tags import TagSpace

if TYPE_CHECKING:
    from collectives.runtime.execute.spmd import Request

PROBE_AFTER = 2e-3  # a receive waiting this long looks for a mismatched message
PROBE_EVERY = 4  # polls between two such looks (few: a wait older than 2 ms sleeps between polls)


class Arena:
    """Receive buffers reused across calls: a bump allocator reset whenever nothing is held."""

    __slots__ = ("buf", "held", "used", "want")

    def __init__(self) -> None:
        self.buf = np.empty(0, np.uint8)
        self.used = self.held = self.want = 0

    def take(self, nbytes: int) -> np.ndarray:
        start = (self.used + 63) & ~63
        if start + nbytes > len(self.buf):
            if self.held:  # others still read the arena: a one-off buffer, and grow later
                self.want = max(self.want, start + nbytes)
                self.held += 1
                return np.empty(nbytes, np.uint8)
            self.buf = np.empty(max(nbytes, self.want, 2 * len(self.buf)), np.uint8)
            start = 0
        self.used = start + nbytes
        self.held += 1
        return self.buf[start:start + nbytes]

    def give(self) -> None:
        self.held -= 1
        if self.held <= 0:
            self.held = self.used = 0
            if self.want > len(self.buf):
                self.buf = np.empty(self.want, np.uint8)
            self.want = 0

    def abandon(self) -> None:
        """Receives were withdrawn: their memory may still be written, so keep it, unused
        (until the process ends: ``leftovers``)."""
        leftovers.keep(self.buf)
        self.buf = np.empty(0, np.uint8)
        self.used = self.held = self.want = 0


def _bytes(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint8)


class _Send:
    __slots__ = ("buf", "channel", "dst", "reqs", "seq")
    data = None

    def __init__(self, channel: MPIChannel, reqs: list, buf: np.ndarray | tuple[np.ndarray, ...],
                 dst: int, seq: int):
        self.channel, self.reqs, self.buf, self.dst, self.seq = channel, reqs, buf, dst, seq

    def done(self) -> bool:
        reqs = self.reqs
        try:
            while reqs:
                if not reqs[0].Test():
                    return False
                reqs.pop(0)
        except MPI.Exception as exc:
            raise self.channel.failed("sending to", self.dst, self.seq, exc) from exc
        return True


class _Recv:
    __slots__ = ("channel", "data", "pieces", "polls", "reqs", "scratch", "seq", "since", "src",
                 "status", "tag")

    def __init__(self, channel: MPIChannel, data: np.ndarray, src: int, seq: int, tag: int,
                 scratch: bool):
        self.channel, self.data, self.src, self.seq, self.tag = channel, data, src, seq, tag
        self.scratch = scratch
        raw = _bytes(data)
        self.pieces = list(tuning.chunks(len(raw), tuning.MAX_COUNT))
        comm = channel.comm
        self.reqs = [comm.Irecv([raw[a:b], MPI.BYTE], src, tag) for a, b in self.pieces]
        self.status = MPI.Status()
        self.polls = 0
        self.since = 0.0

    def done(self) -> bool:
        reqs, status = self.reqs, self.status
        while reqs:
            try:
                complete = reqs[0].Test(status)
            except MPI.Exception as exc:
                raise self.channel.failed("receiving from", self.src, self.seq, exc) from exc
            if not complete:
                self.polls += 1
                if self.polls % PROBE_EVERY == 0:
                    self.channel.look(self)
                return False
            a, b = self.pieces.pop(0)
            reqs.pop(0)
            got = status.Get_count(MPI.BYTE)
            if got != b - a:
                raise self.channel.wrong_size(self, got, b - a)
        return True


class MPIChannel:
    """One point-to-point channel over its own communicator."""

    arrays = NUMPY

    def __init__(self, comm: Any, tags: TagSpace, name: str, *, probe: bool):
        self.comm, self.tags, self.name, self.probe = comm, tags, name, probe
        self.what = "message tag" if name == "p2p" else "call"  # what a tag's number is
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.arena = Arena()
        self.withdrew = False  # receives were withdrawn: their senders may still send
        self._status = MPI.Status()

    def send(self, data: np.ndarray, dst: int, tag: tuple) -> _Send:
        seq, check = tag[0], tag[1]
        t = self.tags.tag(seq, check)
        raw = _bytes(data)
        comm = self.comm
        reqs = [comm.Isend([raw[a:b], MPI.BYTE], dst, t)
                for a, b in tuning.chunks(len(raw), tuning.MAX_COUNT)]
        return _Send(self, reqs, raw, dst, seq)

    def recv(self, into: np.ndarray, src: int, tag: tuple, *, in_place: bool) -> Request:
        seq, check = tag[0], tag[1]
        if in_place:
            data, scratch = into, False
        else:
            data, scratch = self.arena.take(into.nbytes).view(into.dtype), True
        return _Recv(self, data, src, seq, self.tags.tag(seq, check), scratch)

    def release(self, request: _Recv) -> None:
        if request.scratch:
            request.scratch = False
            self.arena.give()


    def cancel(self, requests: list) -> None:
        """Withdraw a failed call's messages. A receive MPI has matched already cannot be
        cancelled (a large message's data is still on its way), and a send a late peer has
        not taken yet still reads its buffer: their memory is kept (``leftovers``), or a
        late peer's data would land in a buffer the pool hands out again, and a late peer
        would read one that holds another call's data."""
        withdrawn = False
        for request in requests:
            if isinstance(request, _Send):
                if request.reqs:
                    leftovers.keep((request.reqs, request.buf))
                continue
            if not isinstance(request, _Recv):
                continue
            active = []
            for req in request.reqs:
                try:
                    req.Cancel()
                    if not req.Test():  # (a cancelled request is freed once tested)
                        active.append(req)
                except MPI.Exception:
                    pass  # already complete, or the library cannot cancel it
            if active and not request.scratch:  # (the arena keeps scratch: ``abandon``)
                leftovers.keep((active, request.data))
            withdrawn = withdrawn or (request.scratch and bool(request.reqs))
            self.withdrew = self.withdrew or bool(request.reqs)
            request.reqs = []
            self.release(request)
        if withdrawn:
            self.arena.abandon()

    # --- errors -------------------------------------------------------------------------

    def look(self, request: _Recv) -> None:
        """A receive is slow: is its source sending a message of another call instead?"""
        if not self.probe:
            return
        now = time.perf_counter()
        if not request.since:
            request.since = now
            return
        if now - request.since < PROBE_AFTER:
            return
        status = self._status
        if self.comm.Iprobe(request.src, MPI.ANY_TAG, status):
            tag = status.Get_tag()
            if tag != request.tag and self.tags.same_call(tag, request.tag):
                raise CollectiveMismatchError(
                    f"rank {self.rank}: {self.what} {request.seq}: rank {request.src} sent a message of a "
                    "call with other arguments (ranks called different collectives, or the same "
                    "one with different arguments); every rank must make the same calls in the "
                    "same order")

    def wrong_size(self, request: _Recv, got: int, expected: int) -> CollectiveMismatchError:
        return CollectiveMismatchError(
            f"rank {self.rank}: {self.what} {request.seq}: rank {request.src} sent {got} bytes where "
            f"{expected} were expected: ranks passed different shapes or dtypes (with "
            "check=False nothing compares them first; pass check=True to be told which)")

    def failed(self, what: str, peer: int, seq: int, exc: MPI.Exception) -> Exception:
        if exc.Get_error_class() == MPI.ERR_TRUNCATE:
            return CollectiveMismatchError(
                f"rank {self.rank}: {self.what} {seq}: rank {peer} sent more bytes than this rank "
                "expects: ranks passed different shapes or dtypes (with check=False nothing "
                "compares them first; pass check=True to be told which)")
        return PeerFailedError(f"rank {self.rank}: {self.what} {seq}: MPI failed {what} rank "
                               f"{peer}: {exc.Get_error_string()}", seen_here=True)

    def free(self) -> None:
        self.arena = Arena()
