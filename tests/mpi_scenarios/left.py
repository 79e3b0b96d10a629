"""A rank that sends and then leaves (its program ends, status 0): its messages still arrive.

Rank 1 sends two messages on one tag and ends. Rank 0 takes the first, waits 0.5 s (rank 1
has left by then: its notice has come), then takes the second; a receive of a message rank
1 never sent times out within its own timeout; a collective raises at once, naming the exit.
Rank 0 prints ``SUMMARY left PASS`` where every step went so.
"""

from __future__ import annotations

import time

import numpy as np

import collectives

comm = collectives.init(timeout=5)
if comm.rank == 1:
    comm.send(np.full(2, 6.0), 0, tag=8)
    comm.send(np.full(2, 7.0), 0, tag=8)
else:
    got = [comm.recv(np.empty(2), 1, tag=8).tolist()]
    time.sleep(0.5)
    got.append(comm.recv(np.empty(2), 1, tag=8).tolist())
    print("messages", got, flush=True)
    start, never = time.monotonic(), "received"
    try:
        comm.recv(np.empty(2), 1, tag=9, timeout=0.5)
    except collectives.CollectiveTimeoutError:
        never = "timed out"
    waited = time.monotonic() - start
    print(f"never sent: {never} after {waited:.1f} s", flush=True)
    start, collective = time.monotonic(), "ran"
    try:
        comm.all_reduce(np.ones(2))
    except collectives.CommunicatorBrokenError as exc:
        collective = f"broken: {exc}"
    refused = time.monotonic() - start
    print(f"collective: {collective} (after {refused:.1f} s)", flush=True)
    # (bounds, not timings: its own timeout plus load; at once, not the communicator's 5 s)
    ok = (got == [[6.0, 6.0], [7.0, 7.0]] and never == "timed out" and waited < 3.0
          and "exited (status 0)" in collective and refused < 1.0)
    print(f"SUMMARY left {'PASS' if ok else 'FAIL'}", flush=True)
