"""A bad argument on one rank in the training step's first call, over every call kind.

A tensor list of one shape and dtype, never reduced before: its calls (asynchronous calls, a
batch's buckets, ``comm.buckets``, prepared calls) share one new signature, several in flight
at once. Rank 0 passes a bad ``op``; every rank must raise within a second (rank 0 its
``ValueError``, its peers ``PeerFailedError`` naming rank 0), and, since no data moved, the
communicator must stay usable: the next step's sums are right on every rank. (Calls issued
before their signature's verdict took it as agreed and moved their data; the refusal then
broke the communicator: ``collectives.runtime.pending_verdict``. Rank 0 comes 0.2 s late,
so that its peers issue every call of the list before it refuses.)
"""

from __future__ import annotations

import time

import numpy as np

from faults.cases_kinds import BOTH, COMM_TIMEOUT, KINDS, SIZES, run
from faults.kit import Call, Case, Ctx, ok, raises
from faults.steps import peer_failed

CASES: list[Case] = []
SAME = [(3, 2), (3, 2), (3, 2)]  # one signature for every call of the list
NEXT = [(5,)]  # the step after: a plain all-reduce, right on every rank


def _bad_op_first(kind: str):
    def step(ctx: Ctx) -> Call:
        xs = [np.full(s, float(ctx.rank + 1 + k), np.float32) for k, s in enumerate(SAME)]
        if ctx.rank == 0:
            # (0.2 s late: its peers have issued every call of the list before it refuses)
            return Call(lambda comm: KINDS[kind](comm, xs, op="median"), caught=True,
                        delay=0.2, expect=raises("ValueError", match="median", within=1.0))
        return Call(lambda comm: KINDS[kind](comm, xs), expect=peer_failed(0, "median"),
                    caught=True)
    return step


for kind in KINDS:
    CASES.append(Case(f"first-step-{kind}-bad-arg-one-rank-then-usable",
                      (_bad_op_first(kind), run("plain", NEXT)),
                      where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))



def _bad_op_in_the_middle(collective: str):
    """Four asynchronous calls of a new signature, rank 1's third with a bad op, rank 0 0.3 s
    late (so it hears the refusal before it issues anything): calls 1, 2 and 4 right on every
    rank, call 3 refused on every rank, nothing broken. (Rank 1's fourth call once waited
    only for its second, the last one of its signature there, and moved, while its peers'
    waited for their third, refused, and agreed again: on MPI a reduce's leaf then finished
    it alone, a mismatch, and the communicator broke.)"""
    def step(ctx: Ctx) -> Call:
        total = float(sum(range(1, ctx.size + 1)))
        # (a reduce's leaves get None; one_device: every rank but the root is a leaf)
        right = None if collective == "reduce" and ctx.rank != 0 else [total] * 6
        refused = "ValueError" if ctx.rank == 1 else "PeerFailedError"
        want = [right, right, refused, right]

        def body(comm):
            if ctx.rank == 0:
                time.sleep(0.3)
            x = np.full(6, float(ctx.rank + 1))
            handles = []
            for k in range(4):
                op = "median" if ctx.rank == 1 and k == 2 else "sum"
                if collective == "reduce":
                    handles.append(comm.reduce(x, op, root=0, algorithm="one_device",
                                               async_op=True))
                else:
                    handles.append(comm.all_reduce(x, op, async_op=True))
            got = []
            for handle in handles:
                try:
                    result = handle.wait()
                    got.append(None if result is None else result.tolist())
                except Exception as exc:  # noqa: BLE001 - judged below
                    got.append(type(exc).__name__)
            return got, comm.calls.engine.broken

        def judged(outcome):
            got, broken = outcome
            return None if (got, broken) == (want, None) else f"{got}, broken: {broken}"
        return Call(body, expect=ok(check=judged, within=2.0), same=False)
    return step


for collective in ("all_reduce", "reduce"):
    CASES.append(Case(f"first-step-{collective}-bad-arg-in-the-middle-on-one-rank",
                      (_bad_op_in_the_middle(collective), run("plain", NEXT)),
                      where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))


def _bad_op_late_in_a_stream(ctx: Ctx) -> Call:
    """Five asynchronous all-reduces of a new signature with values ``rank + 1 + k``; rank
    1's fourth has a bad op. A call may return only the right sum: MPI's native all-reduces
    pair by order, and rank 1's fifth once paired with its peers' fourth (taken as agreed),
    both returning a wrong sum, the check riding with them alike. Rank 1's fifth now waits
    for its fourth's verdict; a call its peers had moved before the refusal breaks the
    communicator, and every call from it on raises."""
    def body(comm):
        handles = [comm.all_reduce(np.full(4, float(ctx.rank + 1 + k)),
                                   "median" if ctx.rank == 1 and k == 3 else "sum",
                                   async_op=True) for k in range(5)]
        got = []
        for handle in handles:
            try:
                got.append(handle.wait().tolist())
            except Exception as exc:  # noqa: BLE001 - judged below
                got.append(type(exc).__name__)
        return got

    def judged(got):
        sums = [[float(sum(p + 1 + k for p in range(ctx.size)))] * 4 for k in range(5)]
        wrong = [(k + 1, g) for k, g in enumerate(got) if isinstance(g, list) and g != sums[k]]
        if wrong or not isinstance(got[3], str):
            return f"wrong sums or call 4 returned: {got}"
        return None
    return Call(body, expect=ok(check=judged, within=2.0), same=False, caught=True)


CASES.append(Case("first-step-all-reduce-bad-arg-late-in-a-stream-returns-no-wrong-sum",
                  (_bad_op_late_in_a_stream,), where=BOTH, sizes=SIZES,
                  timeout=COMM_TIMEOUT, limit=20.0))
