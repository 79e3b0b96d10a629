"""An uncaught exception on one rank of a job launched the plain way (``mpiexec -n 3 python
script.py``, no ``-m mpi4py``): the library aborts the job, so the other ranks, waiting in a
collective with the default 300 s timeout, end within seconds (``faults/uncaught_rank.py``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults.harness import HAVE_MPI, MPIEXEC, ROOT, environment

SCRIPT = Path(__file__).resolve().parent / "uncaught_rank.py"
WALL = 120.0  # seconds before the job counts as hanging: it ends in about one, but three
# Python processes may take tens of seconds to start on a loaded 2-core machine; the default
# timeout the ranks would otherwise wait out is 300 s

pytestmark = pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and an mpiexec")


def launch(mode: str, ranks: int) -> tuple[subprocess.CompletedProcess, float]:
    command = [MPIEXEC, "-n", str(ranks), sys.executable, str(SCRIPT), mode]
    start = time.monotonic()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=WALL,
                              env=environment("mpi"), cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job was still running {WALL:g} s after a rank raised")
    return proc, time.monotonic() - start


def test_an_uncaught_exception_aborts_the_job():
    proc, took = launch("raise", 3)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert "RuntimeError: an error this program does not catch" in output, output[-3000:]
    assert "rank 1 raised an uncaught RuntimeError: aborting the MPI job" in output, output[-3000:]


def test_abort_on_error_false_leaves_exceptions_alone():
    proc, _ = launch("keep", 2)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("RANK")) == [
        "RANK 0 ABORTS False", "RANK 1 ABORTS False"], output[-3000:]
