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

import numpy as np

from faults.cases_kinds import BOTH, COMM_TIMEOUT, KINDS, SIZES, run
from faults.kit import Call, Case, Ctx, raises
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

