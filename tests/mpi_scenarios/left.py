"""A rank that sends and then leaves (its program ends, status 0): its messages still arrive.

Rank 2 posts two messages to rank 0 on one tag and ends. Rank 0 takes the first, waits
0.5 s (rank 2 has left by then: its notice has come), then takes the second; a third receive
from it, a receive with another tag and a send to it raise ``PeerFailedError`` at once
(rank 2 sent nothing more: nothing would match them); ranks 0 and 1 still exchange
messages; a collective raises ``CommunicatorBrokenError`` at once, naming the exit. Rank 0
prints ``SUMMARY left PASS`` where every step went so.
"""

from __future__ import annotations

import time

import numpy as np

import collectives

comm = collectives.init(timeout=5)
LEAVER = 2


def attempt(call) -> tuple[str, float]:
    """What ``call`` raised (or "returned"), and after how many seconds."""
    start = time.monotonic()
    try:
        call()
        outcome = "returned"
    except collectives.CollectiveError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    return outcome, time.monotonic() - start


if comm.rank == LEAVER:
    comm.send(np.full(2, 6.0), 0, tag=8)
    comm.send(np.full(2, 7.0), 0, tag=8)
elif comm.rank == 1:
    got = comm.recv(np.empty(2), 0, tag=3).tolist()
    comm.send(np.full(2, 4.0), 0, tag=4)
    print(f"rank 1 got {got}", flush=True)
else:
    got = [comm.recv(np.empty(2), LEAVER, tag=8).tolist()]
    time.sleep(0.5)
    got.append(comm.recv(np.empty(2), LEAVER, tag=8).tolist())
    print("messages", got, flush=True)
    refused = [attempt(lambda: comm.recv(np.empty(2), LEAVER, tag=8)),
               attempt(lambda: comm.recv(np.empty(2), LEAVER, tag=9)),
               attempt(lambda: comm.send(np.ones(2), LEAVER, tag=8))]
    for outcome, seconds in refused:
        print(f"refused after {seconds:.2f} s: {outcome}", flush=True)
    comm.send(np.full(2, 3.0), 1, tag=3)
    exchanged = comm.recv(np.empty(2), 1, tag=4).tolist()
    print(f"rank 0 got {exchanged} from rank 1", flush=True)
    collective, seconds = attempt(lambda: comm.all_reduce(np.ones(2)))
    print(f"collective after {seconds:.2f} s: {collective}", flush=True)
    # (bounds, not timings: at once, not the communicator's 5 s, with room for load)
    ok = (got == [[6.0, 6.0], [7.0, 7.0]] and exchanged == [4.0, 4.0]
          and all(o.startswith("PeerFailedError") and f"rank {LEAVER} left" in o and s < 1.0
                  for o, s in refused)
          and collective.startswith("CommunicatorBrokenError") and "exited (status 0)" in
          collective and seconds < 1.0)
    print(f"SUMMARY left {'PASS' if ok else 'FAIL'}", flush=True)
