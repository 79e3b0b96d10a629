"""Helpers shared by the scenario scripts that ``tests/test_mpi.py`` runs under ``mpiexec``.

Each script prints one ``SUMMARY`` line on rank 0 and exits non-zero on any failure, so a
script can also be run by hand: ``.venv/bin/mpiexec -n 4 .venv/bin/python tests/mpi_scenarios/matrix.py``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

# Scripts run from a source checkout without installing it.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mpi4py import MPI  # noqa: E402

WORLD = MPI.COMM_WORLD

__all__ = ["WORLD", "Report", "environment", "meet"]


@contextmanager
def environment(env: dict | None) -> Iterator[None]:
    """Inside, the environment with ``env`` set (a value of None unsets the variable); as it
    was, after."""
    saved = {name: os.environ.get(name) for name in env or {}}
    for name, value in (env or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def meet() -> None:
    """A barrier on the user's communicator that polls gently (ranks that wait leave the
    cores to the ranks still working)."""
    request = WORLD.Ibarrier()
    while not request.Test():
        time.sleep(0.002)


class Report:
    """Failures collected on every rank, summarised on rank 0."""

    def __init__(self, name: str):
        self.name = name
        self.failures: list[str] = []
        self.cases = 0
        self.start = time.monotonic()

    def check(self, ok: bool, what: str) -> bool:
        self.cases += 1
        if not ok:
            self.failures.append(f"rank {WORLD.rank}: {what}")
        return ok

    def finish(self, extra: str = "") -> None:
        """Gather failures to rank 0, print the summary there, exit non-zero on failure."""
        failures = WORLD.gather(self.failures, root=0)
        cases = WORLD.gather(self.cases, root=0)
        code = 0
        if WORLD.rank == 0:
            flat = [f for fs in failures for f in fs]
            for f in flat[:40]:
                print("FAIL", f, flush=True)
            if len(flat) > 40:
                print(f"... and {len(flat) - 40} more failures", flush=True)
            status = "PASS" if not flat else "FAIL"
            print(f"SUMMARY {self.name} {status} ranks={WORLD.size} checks={sum(cases)} "
                  f"failures={len(flat)} seconds={time.monotonic() - self.start:.1f} {extra}",
                  flush=True)
            code = 1 if flat else 0
        code = WORLD.bcast(code, root=0)
        sys.stdout.flush()
        if code:
            sys.exit(code)
