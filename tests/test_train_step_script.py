"""``benchmarks/train_step.py`` runs end to end on 2 MPI ranks at a tiny scale.

The script has no other caller, so a change in the library's buckets, async calls or the DDP
adapter that breaks it shows here: it must exit with 0, print a row for every way, and write
the JSON with every phase timed, an efficiency per way and a trace of way (a)'s buckets.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # an MPI launch

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or not MPIEXEC.exists(),
                    reason="needs mpi4py and the mpiexec beside this Python")
def test_train_step_runs_at_a_tiny_scale(tmp_path):
    out = tmp_path / "train.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/train_step.py", "--scale", "0.01", "--bucket-mb", "0.25",
         "--modes", "idle", "--compute-ms", "3", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    with_torch = importlib.util.find_spec("torch") is not None
    ways = ["(a) buckets 0.25 MiB", "(b) buckets", "(c) hand-packed", "(d) mpi4py",
            "(g) mpi4py Iallreduce, tested"]
    ways += ["(e) DDP gloo", "(f) DDP library hook", "(h) DDP mpi4py hook"] if with_torch else []
    for way in ways:
        assert f"| {way}" in proc.stdout, (way, text[-3000:])
    result = json.loads(out.read_text())
    idle = result["modes"]["idle"]
    assert [r["way"].split()[0] for r in idle["rows"]] == [w.split()[0] for w in ways]
    for row in idle["rows"]:
        assert row["compute_ms"] > 0 and row["comm_ms"] > 0 and row["overlapped_ms"] > 0, row
        low, high = row["interval"]
        assert low <= high, row
    assert len(idle["repeats_s"]["numpy|compute"]) >= 7
    trace = idle["bucket_trace"]
    assert sum(r["bytes"] for r in trace[:-1]) == result["bytes"]
    assert all(r["done_ms"] >= r["started_ms"] for r in trace[:-1])
    if with_torch:
        assert idle["ratios"]["(f)/(e) overlapped"]["ratio"] > 0
        assert idle["ratios"]["(h)/(e) overlapped"]["ratio"] > 0
