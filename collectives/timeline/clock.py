"""Ranks' clocks lined up: each rank's offset from rank 0's clock, measured by ping-pong.

Processes of one host read one clock (``CLOCK_MONOTONIC``), so their offset is zero and
nothing is measured. A rank on another host than rank 0 exchanges ``ROUNDS`` ping-pongs with
rank 0 (NTP's estimate: the offset is the rank's time minus the midpoint of rank 0's send and
receive) and keeps the one with the shortest round trip, whose half bounds the error. The
offset goes into the rank's file; ``collectives timeline merge`` subtracts it.
"""

from __future__ import annotations

import socket
from typing import Any

import numpy as np

from . import recorder

ROUNDS = 8
TAG = 32111  # a point-to-point tag of the library's own (users' tags count separately)


def probe() -> tuple[str, bool, str]:
    """What every rank tells the others at ``init``: its host, whether it records, and its
    run token (rank 0's becomes the job's: ``recorder.set_run``)."""
    return socket.gethostname(), recorder.ON, recorder.RUN


def align(comm: Any, probes: list | None = None) -> float:
    """Measure this rank's clock offset from rank 0's (microseconds) and record it.

    Collective over ``comm`` (a ``Communicator``). ``probes``: every rank's
    ``probe``, where the caller gathered them already (``collectives.init`` does).
    Nothing moves unless some rank records."""
    if probes is None:
        probes = comm.all_gather_object(probe())
    if len(probes[0]) > 2:  # (every rank's file of this job says rank 0's run)
        if recorder.ON:
            recorder.set_run(probes[0][2])
        else:  # (a recording started later says it)
            recorder.RUN = probes[0][2]
    if comm.size < 2 or not any(on for _, on, *_ in probes):
        return 0.0
    far = [r for r in range(1, comm.size) if probes[r][0] != probes[0][0]]
    was_on = recorder.ON
    recorder.ON = False  # the exchange itself is not part of the trace
    try:
        if comm.rank == 0:
            for r in far:
                comm.send(np.array(_measure(comm, r), np.int64), r, TAG)
            offset, rtt = 0, 0
        elif comm.rank in far:
            for _ in range(ROUNDS):
                comm.recv(np.zeros(1, np.int64), 0, TAG)
                comm.send(np.array([recorder.now()], np.int64), 0, TAG)
            result = comm.recv(np.zeros(2, np.int64), 0, TAG)
            offset, rtt = int(result[0]), int(result[1])
        else:
            offset, rtt = 0, 0
    finally:
        recorder.ON = was_on
    place = comm.trace_place  # (its row: a dup or split records on its world's)
    if recorder.ON:
        recorder.set_clock(offset, rtt, place[0])
    return offset / 1e3


def _measure(comm: Any, peer: int) -> tuple[int, int]:
    best: tuple[int, int] | None = None
    reply = np.zeros(1, np.int64)
    for _ in range(ROUNDS):
        sent = recorder.now()
        comm.send(np.array([sent], np.int64), peer, TAG)
        comm.recv(reply, peer, TAG)
        back = recorder.now()
        sample = (back - sent, int(reply[0]) - (sent + back) // 2)
        if best is None or sample[0] < best[0]:
            best = sample
    assert best is not None  # ROUNDS > 0 samples
    rtt, offset = best
    return offset, rtt
