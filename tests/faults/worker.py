"""Runs a batch of fault cases and writes every rank's outcomes as JSON lines.

    python tests/faults/worker.py threads 3 OUTDIR CASE...        (thread ranks)
    python tests/faults/worker.py multi 3 OUTDIR CASE...          (multi-device, 3 devices)
    mpiexec -n 3 python tests/faults/worker.py mpi 3 OUTDIR CASE...

Each rank appends to ``OUTDIR/rank<r>.jsonl`` a ``{"begin": case}`` line before a case and a
``{"case", "rank", "seconds", "steps"}`` line after it (thread ranks and multi-device all write
from one process). A case that runs past its ``limit`` makes the process dump every thread's
stack to stderr and exit, so a hang ends the batch instead of stalling it; ``faults.harness``
then starts a new batch after that case. MPI ranks meet on ``COMM_WORLD`` between cases (the
library never touches it) and each case gets a fresh communicator, so a broken one stays behind.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import time
import warnings
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
for path in (TESTS.parent, TESTS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import collectives  # noqa: E402
from faults.kit import Case, Ctx, perform  # noqa: E402
from faults.table import find  # noqa: E402


def run_steps(target, case: Case, ctx: Ctx) -> tuple[list[dict], Exception | None]:
    """This rank's steps in order. An error the program does not catch ends its case, as an
    uncaught exception ends a real program: later steps are "skipped"."""
    records: list[dict] = []
    escaped: Exception | None = None
    for step in case.steps:
        call = step(ctx)
        if call is None:
            records.append({"kind": "absent"})
        elif escaped is not None:
            records.append({"kind": "skipped"})
        else:
            record, error = perform(target, call)
            records.append(record)
            if error is not None and not call.caught:
                escaped = error
    return records, escaped


class Output:
    def __init__(self, outdir: Path, rank: int):
        self.file = open(outdir / f"rank{rank}.jsonl", "a")

    def write(self, **item) -> None:
        self.file.write(json.dumps(item) + "\n")
        self.file.flush()


def run_threads(case: Case, size: int, out: Output) -> None:
    records: dict[int, list] = {}
    done = threading.Condition()

    def rank_body(comm):
        steps, escaped = run_steps(comm, case, Ctx(comm.rank, comm.size, "threads"))
        records[comm.rank] = steps
        with done:
            done.notify_all()
            if escaped is not None:
                raise escaped  # through collectives.run, which wakes the other ranks
            # A rank that returns has left, and its peers would hear so at once: as under
            # MPI (``meet``), a rank that stays away from a step stays alive until its peers
            # are through theirs, so that they wait for it as for a rank that never calls.
            done.wait_for(lambda: len(records) == size, timeout=case.limit)

    start = time.monotonic()
    try:
        collectives.run(rank_body, size, timeout=case.timeout, check=case.check)
    except Exception:  # noqa: BLE001, S110 - every rank's outcome is in its records
        pass
    took = round(time.monotonic() - start, 4)
    for rank in range(size):
        out.write(case=case.name, rank=rank, seconds=took, steps=records.get(rank))


def run_multi(case: Case, size: int, out: Output) -> None:
    start = time.monotonic()
    steps, _ = run_steps(collectives, case, Ctx(0, size, "multi"))
    out.write(case=case.name, rank=0, seconds=round(time.monotonic() - start, 4), steps=steps)


def main() -> None:
    warnings.simplefilter("ignore", RuntimeWarning)  # NaN and overflow cases warn by design
    transport, size, outdir, names = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
    cases = [find(transport, name) for name in names]
    if transport.startswith("mpi"):
        run_mpi(transport, cases, outdir)
        return
    out = Output(outdir, 0)
    for case in cases:
        out.write(begin=case.name)
        faulthandler.dump_traceback_later(case.limit, exit=True)
        (run_multi if transport == "multi" else run_threads)(case, size, out)
        faulthandler.cancel_dump_traceback_later()


def run_mpi(transport: str, cases: list[Case], outdir: Path) -> None:
    from collectives.backends import mpi
    from mpi4py import MPI

    world = MPI.COMM_WORLD

    def meet() -> None:
        """A barrier that polls, so waiting ranks leave the cores to the ranks still working."""
        request = world.Ibarrier()
        while not request.Test():
            time.sleep(0.002)

    out = Output(outdir, world.rank)
    for case in cases:
        out.write(begin=case.name)
        faulthandler.dump_traceback_later(case.limit, exit=True)
        start = time.monotonic()
        comm = mpi.init(timeout=case.timeout, check=case.check)
        steps, _ = run_steps(comm, case, Ctx(world.rank, world.size, transport))
        out.write(case=case.name, rank=world.rank, seconds=round(time.monotonic() - start, 4),
                  steps=steps)
        meet()
        faulthandler.cancel_dump_traceback_later()
    meet()
    sys.stdout.flush()
    sys.stderr.flush()
    # Broken communicators may still hold requests that MPI_Finalize would wait for forever.
    os._exit(0)


if __name__ == "__main__":
    main()
