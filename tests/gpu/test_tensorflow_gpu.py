"""The TensorFlow adapter on GPU tensors, on a real GPU: DLPack both ways without copies,
NcclAllReduce's choice, and the device path's checks against TensorFlow's own results, eager
and in ``tf.function`` (``tests/tf_scenarios/gpu.py``, one process per configuration since
TensorFlow splits a GPU only once per process); two workers under ``mpiexec`` with NCCL
inside each and MPI between them (``tests/tf_scenarios/gpu_workers_mpi.py``).

Needs a TensorFlow with GPU support (``pip install 'tensorflow[and-cuda]'``; the project's
``tensorflow`` extra is CPU-only) and CuPy with NCCL (the ``cuda`` extra). Skipped, with the
reason, where any of them or a GPU is missing. The same checks run on logical CPUs with the
NumPy kit in ``tests/test_tensorflow.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpukit import MPI_REASON, MPIEXEC, gpu_count, gpu_reason

SCENARIOS = Path(__file__).resolve().parents[1] / "tf_scenarios"
ROOT = Path(__file__).resolve().parents[2]


def _reason() -> str | None:
    if importlib.util.find_spec("tensorflow") is None:
        return "TensorFlow is not installed (on a GPU machine: pip install 'tensorflow[and-cuda]')"
    return gpu_reason()


REASON = _reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def run_gpu_scenario(args: list[str], launcher: list[str] | None = None, reports: int = 1) -> dict:
    """Run a scenario of tests/tf_scenarios (under ``launcher``); skip with its reason when
    TensorFlow or CuPy sees no GPU, fail with its failures; the first report."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    command = [*(launcher or []), sys.executable, *args]
    proc = subprocess.run(command, cwd=SCENARIOS, env=env, capture_output=True, text=True,
                          timeout=900)
    found = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if len(found) < reports:
        pytest.fail(f"{' '.join(command)} exited {proc.returncode} with {len(found)} of "
                    f"{reports} reports:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    skipped = [r["skipped"] for r in found if "skipped" in r]
    if skipped:
        pytest.skip(skipped[0])
    failed = [f for r in found for f in r["failed"]]
    assert not failed, "\n".join(f"{f['name']}: {f['error']}\n{f['traceback']}" for f in failed)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return found[0]


@pytest.mark.timeout(960)
def test_two_logical_gpus_on_one_card():
    report = run_gpu_scenario(["gpu.py", "logical"])
    names = report["passed"]
    for name in ("logical: DLPack round trip", "logical: NcclAllReduce's choice",
                 "logical: results in GPU memory", "logical: graph_ops", "logical: keras",
                 "logical: workers", "logical: NcclAllReduce tf.function"):
        assert name in names, name


@pytest.mark.timeout(960)
@pytest.mark.skipif(gpu_count() < 2, reason=REASON or "needs two GPUs; this machine shows one")
def test_nccl_over_physical_gpus():
    report = run_gpu_scenario(["gpu.py", "physical"])
    assert "physical: NcclAllReduce's choice" in report["passed"]


@pytest.mark.timeout(960)
@pytest.mark.skipif(MPI_REASON is not None, reason=MPI_REASON or "")
def test_two_workers_under_mpiexec():
    """NCCL inside each worker, MPI between them, staged through pinned host memory."""
    report = run_gpu_scenario(["gpu_workers_mpi.py"], launcher=[MPIEXEC, "-n", "2"], reports=2)
    assert report["passed"] == ["gpu workers: reductions"]
