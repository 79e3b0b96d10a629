"""benchmarks/gpu_run.sh, dry-run on a CPU in its --cpu mode under a NumPy stand-in for CuPy
(the same steps as on the GPU machine: venv over the interpreter's packages, carried wheels,
the checkout without a build, probe, a few GPU tests, every benchmark part at tiny sizes,
packing), so the script cannot rot between GPU runs. The stand-in comes from FAKECUPY=PATH,
or is the ``cupy`` this process imports when that is the stand-in. Skipped, saying so, where
neither gives one, or where mpiexec is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from gpukit import MPI_REASON, ROOT, STAND_IN


def stand_in() -> Path | None:
    given = os.environ.get("FAKECUPY")
    if given:
        return Path(given) if (Path(given) / "cupy" / "__init__.py").exists() else None
    if STAND_IN:
        import cupy

        return Path(cupy.__file__).resolve().parents[1]
    return None


FAKECUPY = stand_in()
pytestmark = [
    pytest.mark.skipif(FAKECUPY is None, reason="no NumPy stand-in for CuPy: set FAKECUPY=PATH "
                       "(a folder holding cupy/) to dry-run benchmarks/gpu_run.sh --cpu"),
    pytest.mark.skipif(MPI_REASON is not None, reason=MPI_REASON or ""),
    pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid (util-linux)"),
    pytest.mark.skipif(bool(os.environ.get("COLLECTIVES_GPU_RUN")),
                       reason="inside benchmarks/gpu_run.sh, whose run is this dry run")]


@pytest.mark.timeout(280)
def test_cpu_dry_run_of_the_gpu_run(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FAKE_") and k not in ("PYTHONPATH", "COLLECTIVES_RANKS_PER_NODE")}
    env.update(FAKE_GPUS="1", TMPDIR=str(tmp_path))
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_run.sh", "--cpu", "--fakecupy", str(FAKECUPY), "--out", str(out),
         "--tests", "tests/gpu/test_gpu_one_gpu.py -k every_nccl"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=270)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "logs.tar.gz", "results.json",
                                                     "summary.txt"]
    summary = (out / "summary.txt").read_text()
    assert "nothing here ran on a GPU" in summary, summary
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "cpu" and results["command"].endswith("--cpu")
    steps = {s["step"]: s["status"] for s in results["steps"]}
    assert steps == dict.fromkeys(["setup", "probe", "tests", "copy", "devices", "one-rank",
                                   "two-level", "torch"], "ok"), (steps, summary)
    assert results["tests"]["tests"] >= 1 and not results["tests"]["failed"]
    parts = results["parts"]
    for part in ("copy", "devices", "one-rank", "two-level"):
        assert parts[part]["rows"], part
    checked = [r["wrong"] for r in parts["devices"]["rows"] if r["wrong"] is not None]
    assert checked and not any(checked)  # (the largest sizes are timed, not checked)
    assert parts["devices"]["rows"][0]["copy_fraction"] > 0
    assert parts["one-rank"]["rows"][0]["backend_ran"] == "native"
    assert "torch" in parts
    with tarfile.open(out / "logs.tar.gz") as logs:
        names = logs.getnames()
    assert "logs/tests.log" in names and "logs/two-level.log" in names
