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

# slow: MPI launches (left out of the quick subset)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and an mpiexec")]


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


def test_a_non_zero_sys_exit_ends_the_job_naming_the_rank_and_status():
    """Rank 1's ``sys.exit(3)`` while the others wait with ``timeout=60``: within seconds."""
    proc, took = launch("exit3", 3)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert "rank 1 exited with status 3: aborting the MPI job" in output, output[-3000:]
    assert took < 55, f"the job took {took:.0f} s: the others waited out their timeout"


@pytest.mark.parametrize("mode, says", [
    ("exit0", "rank 1 left after call 11: it exited (status 0) with every call through 11 "
              "finished,"),
    # (abort_on_error=False turned the exit's notice off too: the peers waited it out)
    ("keep-raise", "rank 1 left after call 1: it raised an uncaught RuntimeError: an error"),
])
def test_a_rank_that_leaves_before_a_call_fails_the_peers_waiting_in_it(mode, says):
    """Rank 1 leaves (``sys.exit(0)``; or, with the aborts off, an exception it does not
    catch) while the others wait in a call it will never join: they raise
    ``PeerFailedError`` naming it and why at once (uncaught, that would end the job)."""
    proc, took = launch(mode, 3)
    output = proc.stdout + proc.stderr
    said = sorted(line for line in proc.stdout.splitlines() if line.startswith("RANK"))
    assert [line[:21] for line in said] == ["RANK 0 PEER FAILED: r", "RANK 2 PEER FAILED: r"], \
        output[-3000:]
    for line in said:
        assert says in line, line
    assert took < 55, f"the job took {took:.0f} s: the others waited out their timeout"


def test_an_exit_after_the_last_call_leaves_the_peers_alone():
    """Rank 1 leaves with ``sys.exit(0)`` right after the last all-reduce, which the others
    join late: they get their results and the job succeeds."""
    proc, _ = launch("exit0-last", 3)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("RANK")) == [
        "RANK 0 GOT 3.0", "RANK 2 GOT 3.0"], output[-3000:]


def test_an_exit_with_a_bucket_in_flight_fails_the_peers_at_once():
    """Rank 1 leaves (``sys.exit(0)``) with a bucket of ``comm.buckets`` in flight: the calls
    it left in flight are lost with it, so the others' ``wait()`` raises naming rank 1 at once
    instead of waiting out its 60 s timeout."""
    proc, took = launch("exit0-inflight", 3)
    output = proc.stdout + proc.stderr
    said = sorted(line for line in proc.stdout.splitlines() if line.startswith("RANK"))
    assert [line.split(":")[0] for line in said] in [
        [f"RANK {r} {error}" for r in (0, 2)]
        for error in ("PeerFailedError", "CommunicatorBrokenError")], output[-3000:]
    assert all("rank 1 left after call" in line and "exited (status 0)" in line
               for line in said), output[-3000:]
    assert took < 55, f"the job took {took:.0f} s: the others waited out their timeout"
