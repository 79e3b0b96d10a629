"""A rank killed with SIGKILL (``faults/killed_rank.py``, one launch per case): the job never
hangs, and no survivor returns from a collective the dead rank was part of: it raises.

What survives is the launcher's choice (measured in docs/reliability.md): hydra's default ends
the whole job at once, and its proxy kills every rank as soon as it reaps one killed by a
signal, even with ``-disable-auto-cleanup``. So the survivors' side is tested with a rank that
ends at once without a signal (``os._exit``: no exit hook, no goodbye, as a crash looks to its
peers): every survivor must report, each an error naming the dead rank.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults.harness import HAVE_MPI, MPIEXEC, ROOT, environment

SCRIPT = Path(__file__).resolve().parent / "killed_rank.py"
RANKS = 3
TIMEOUT = 1.0
WALL = 20.0  # seconds a launch may take before it counts as a hang

# slow: MPI launches (left out of the quick subset)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and an mpiexec")]


def launch(when: str, *flags: str, how: str = "signal"
           ) -> tuple[subprocess.CompletedProcess, float, list[dict]]:
    command = [MPIEXEC, *flags, "-n", str(RANKS), sys.executable, str(SCRIPT), when, str(TIMEOUT),
               how]
    start = time.monotonic()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=WALL,
                              env=environment("mpi"), cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job was still running {WALL:g} s after a rank was killed")
    took = time.monotonic() - start
    # Ranks' lines can run into each other in mpiexec's output: decode each object where it starts.
    decoder = json.JSONDecoder()
    reports = [decoder.raw_decode(chunk)[0] for chunk in proc.stdout.split("SURVIVOR ")[1:]]
    return proc, took, reports


def assert_survivors_raised(reports: list[dict], output: str) -> None:
    """Each survivor raised a CollectiveError within a second of its timeout; a timeout names
    the dead rank, as the rank it waited for or at the end of the chain of waits it reports.
    (A PeerFailedError comes from MPI failing a transfer, and names the peer of that
    transfer, which need not be the dead rank: see docs/reliability.md.)"""
    dead = RANKS - 1
    for r in reports:
        assert r["error"] != "no error", f"rank {r['rank']} returned without an error:\n{output}"
        assert "CollectiveError" in r["bases"], r
        assert r["seconds"] <= TIMEOUT + 1.0, r
        if r["error"] == "CollectiveTimeoutError":  # (the dead rank, or the chain of waits
            # that leads to it: in a ring, rank 0 waits for rank 1, which waits for it)
            assert re.search(rf"waiting for rank\(s\) (\d+, )*{dead}\b", r["message"]), r
    # a survivor whose own MPI transfer failed tells the others, who then need not wait out
    # their timeouts (nor name it, busy reporting, beside the dead rank)
    early = [r for r in reports if "MPI failed" in r["message"]
             and "failed in call" not in r["message"] and r["seconds"] < TIMEOUT / 2]
    if early:
        for r in reports:
            assert r["seconds"] < TIMEOUT, (r, early[0])


@pytest.mark.parametrize("when", ["waiting", "mid-ring"])
def test_default_launcher_ends_the_job(when):
    proc, _, reports = launch(when)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert "signal 9" in output or "Killed" in output, output[-3000:]
    assert_survivors_raised(reports, output[-3000:])


@pytest.mark.parametrize("when", ["waiting", "native", "mid-ring"])
def test_survivors_raise(when):
    # (killed by a signal, the survivors were killed too on most launches, and a launch
    # without reports passed having checked nothing)
    proc, _, reports = launch(when, "-disable-auto-cleanup", how="exit")
    output = (proc.stdout + proc.stderr)[-3000:]
    assert sorted(r["rank"] for r in reports) == list(range(RANKS - 1)), output
    assert_survivors_raised(reports, output)
