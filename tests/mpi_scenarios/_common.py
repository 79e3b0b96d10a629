"""Helpers shared by the scenario scripts that ``tests/test_mpi.py`` runs under ``mpiexec``.

Each script prints one ``SUMMARY`` line on rank 0 and exits non-zero on any failure, so a
script can also be run by hand: ``.venv/bin/mpiexec -n 4 .venv/bin/python tests/mpi_scenarios/matrix.py``.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time

import numpy as np

# Scripts run from a source checkout without installing it.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mpi4py import MPI  # noqa: E402

# Exact inputs and the float64 reference are the ones every test uses.
from collectives.reference import exact_inputs, random_inputs, reference  # noqa: E402

WORLD = MPI.COMM_WORLD

__all__ = ["WORLD", "Report", "digest", "exact_inputs", "random_inputs", "reference"]


def digest(x) -> str:
    """Shape, dtype and bytes of a result, hashed (None stays None)."""
    if x is None:
        return "None"
    x = np.ascontiguousarray(x)
    h = hashlib.blake2b(x.view(np.uint8).tobytes(), digest_size=12).hexdigest()
    return f"{x.dtype}{tuple(x.shape)}:{h}"


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
            WORLD.Barrier()
            sys.exit(code)
