"""benchmarks/gpu_run.sh, dry-run on a CPU in its --cpu mode under a NumPy stand-in for CuPy
(the same steps as on the GPU machine: venv over the interpreter's packages, carried wheels,
the checkout without a build, probe, a few GPU tests, every benchmark part at tiny sizes,
packing), so the script cannot rot between GPU runs. The stand-in comes from FAKECUPY=PATH,
or is the ``cupy`` this process imports when that is the stand-in. Skipped, saying so, where
neither gives one, or where mpiexec is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
dry_run = [
    pytest.mark.skipif(FAKECUPY is None, reason="no NumPy stand-in for CuPy: set FAKECUPY=PATH "
                       "(a folder holding cupy/) to dry-run benchmarks/gpu_run.sh --cpu"),
    pytest.mark.skipif(MPI_REASON is not None, reason=MPI_REASON or ""),
    pytest.mark.skipif(bool(os.environ.get("COLLECTIVES_GPU_RUN")),
                       reason="inside benchmarks/gpu_run.sh, whose run is this dry run")]
# one test under mpiexec: the tests find the run's mpiexec (a venv's, off PATH) as the
# benchmarks do, and run rather than skip
TESTS = ("tests/gpu/test_gpu_one_gpu.py::test_every_nccl_collective_over_one_device "
         "tests/gpu/test_gpu_nccl.py::test_one_rank_every_collective_op_and_dtype")


@pytest.mark.timeout(280)
@dry_run[0]
@dry_run[1]
@dry_run[2]
def test_cpu_dry_run_of_the_gpu_run(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FAKE_") and k not in ("PYTHONPATH", "COLLECTIVES_RANKS_PER_NODE")}
    # the machine's own PATH, without the venv this test runs in (as on the GPU machine)
    env.update(FAKE_GPUS="1", TMPDIR=str(tmp_path), PATH=os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep)
        if Path(p).resolve() != Path(sys.executable).parent.resolve()))
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_run.sh", "--cpu", "--fakecupy", str(FAKECUPY), "--out", str(out),
         "--tests", TESTS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=270)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "logs.tar.gz", "results.json",
                                                     "summary.txt"]
    summary = (out / "summary.txt").read_text()
    assert "nothing here ran on a GPU" in summary, summary
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "cpu" and results["command"].endswith("--cpu")
    steps = {s["step"]: s["status"] for s in results["steps"]}
    assert steps == dict.fromkeys(["setup", "probe", "peers-per-call", "peers-resnet50",
                                   "peers-multi-device", "peers-overlap", "tests", "copy",
                                   "devices", "one-rank", "two-level", "torch"], "ok"), (
        steps, summary)
    tests = results["tests"]
    assert tests["tests"] == 2 and not tests["failed"] and not tests["skip_reasons"], tests
    parts = results["parts"]
    for part in ("per-call", "resnet50", "multi-device", "overlap", "copy", "devices",
                 "one-rank", "two-level"):
        assert parts[part]["rows"], part
    # the peer benchmark measured the library (torch is not here: its columns are left out),
    # every row in at least 7 interleaved repeats, each kept
    first = parts["resnet50"]["rows"][0]
    assert first["library_cupy_us"] > 0 and len(first["repeats_us"]["library_cupy"]) >= 7
    assert parts["resnet50"]["tensors"] == 12 and parts["per-call"]["in_flight"]["calls"] == 64
    auto = parts["multi-device"]["rows"][0]["library_auto/library_ring"]
    assert auto["interval"][0] <= auto["ratio"] <= auto["interval"][1]
    # every reference ran (the fused kernel as adds and copies under the stand-in), no way
    # failed, and the summary judges each target of the peer benchmark
    rows = [r for part in ("per-call", "resnet50", "multi-device", "overlap")
            for r in parts[part]["rows"]]
    assert not [k for r in rows for k in r if k.endswith("_error")], summary
    listed = next(r for r in parts["multi-device"]["rows"] if r["kind"] == "gradient list")
    assert "library_batch/fused_per_tensor" in listed and "library_batch/fused_whole_list" in listed
    first_size = parts["multi-device"]["rows"][0]
    assert "library_auto/best_choice" in first_size and "library_auto_out/fused_kernel" in first_size
    choices = ("library_one_device", "library_ring", "library_rechd", "library_tree",
               "library_shuffle", "naive")
    fastest = min(choices, key=lambda w: first_size[f"{w}_us"])
    assert first_size["repeats_us"]["best_choice"] == first_size["repeats_us"][fastest]
    assert "targets (like for like" in summary and "auto beside the fastest" in summary
    assert "step/longer" in parts["overlap"]["rows"][0]
    checked = [r["wrong"] for r in parts["devices"]["rows"] if r["wrong"] is not None]
    assert checked and not any(checked)  # (the largest sizes are timed, not checked)
    assert parts["devices"]["rows"][0]["copy_fraction"] > 0
    assert parts["one-rank"]["rows"][0]["backend_ran"] == "native"
    assert "torch" in parts
    with tarfile.open(out / "logs.tar.gz") as logs:
        names = logs.getnames()
    assert "logs/tests.log" in names and "logs/two-level.log" in names


def test_a_stopped_test_step_still_reports_what_finished(tmp_path):
    """pytest stopped at the step's limit writes no JUnit file: the run makes one from the
    outcomes pytest -v printed (alone and under xdist), plus an error for the stop."""
    import importlib.util
    import xml.etree.ElementTree as ET

    spec = importlib.util.spec_from_file_location("gpu_summary",
                                                  ROOT / "benchmarks" / "gpu_summary.py")
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    log = tmp_path / "tests.log"
    log.write_text(
        "tests/gpu/test_a.py::test_one PASSED                     [ 10%]\n"
        "tests/gpu/test_a.py::test_two[own streams] FAILED        [ 20%]\n"
        "[gw1] [ 30%] SKIPPED tests/gpu/test_b.py::test_three[2-ring]\n"
        "[gw0] [ 40%] PASSED tests/gpu/test_b.py::test_four\n"
        "tests/gpu/test_c.py::test_hangs \n")
    junit = tmp_path / "junit.xml"
    got = summary.junit_from_log(log, junit)
    assert got == {"tests/gpu/test_a.py::test_one": "PASSED",
                   "tests/gpu/test_a.py::test_two[own streams]": "FAILED",
                   "tests/gpu/test_b.py::test_three[2-ring]": "SKIPPED",
                   "tests/gpu/test_b.py::test_four": "PASSED"}
    totals = summary.junit(junit)
    assert (totals["tests"], totals["failures"], totals["errors"], totals["skipped"]) == (5, 1, 1, 1)
    assert totals["failed"] == ["tests.gpu.test_a::test_two[own streams]", "gpu_run::tests"]
    assert "did not finish" in ET.parse(junit).getroot().find(".//error").get("message")


def test_the_summary_judges_each_target_by_its_interval():
    """A target is met where its ratio's interval lies at or below the mark, missed where it
    lies above, unresolved where it straddles the mark, and said to be unmeasured where its
    row or way is missing; a failed way is named with its error."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_summary",
                                                  ROOT / "benchmarks" / "gpu_summary.py")
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)

    def got(ratio, lo, hi):
        return {"ratio": ratio, "interval": [lo, hi], "repeats": 7}

    parts = {
        "per-call": {"rows": [{"kind": "overhead, in place", "size": 4096,
                               "library_cupy_us": 20.0, "torch_dist_us": 40.0,
                               "library_cupy/torch_dist": got(0.5, 0.45, 0.55),
                               "library_torch/torch_dist": got(1.2, 1.1, 1.3),
                               "library_cupy_async/torch_dist_async": got(1.0, 0.9, 1.1),
                               "library_torch_async_error": "RuntimeError: no"}]},
        "multi-device": {"rows": [{"kind": "one all-reduce", "size": 4096,
                                   "library_auto/best_choice": got(1.05, 1.0, 1.09)},
                                  {"kind": "one all-reduce", "size": 1 << 20,
                                   "library_auto/best_choice": got(1.3, 1.2, 1.4)}]}}
    lines = summary.target_lines(parts)
    text = "\n".join(lines)
    assert "per call, CuPy at 4 KiB (<= 1.0): yes, 0.50 [0.45, 0.55]" in text, text
    assert "per call, PyTorch at 4 KiB (<= 1.0): no, 1.20" in text, text
    assert "per call, async, CuPy at 4 KiB (<= 1.0): unresolved" in text, text
    assert "per call, async, PyTorch (<= 1.0): not measured" in text, text
    assert "fastest algorithm or naive sum at 4 KiB (<= 1.1): yes" in text, text
    assert "fastest algorithm or naive sum at 1024 KiB (<= 1.1): no" in text, text
    assert "gradient list, views, CuPy (<= 0.8): not measured" in text, text
    notes = "\n".join(summary.peer_notes(parts))
    assert "library_cupy 20.0 us, torch_dist 40.0 us" in notes, notes
    assert "library_torch_async FAILED: RuntimeError: no" in notes, notes
