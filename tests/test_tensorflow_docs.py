"""docs/tensorflow.md's examples run as written (a module of its own, so that pytest-xdist can
run it beside tests/test_tensorflow.py's scenario, not after it on the same worker)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import find_mpiexec, tf_lean

needs_tf = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                              reason="tensorflow is not installed")


DOCS = Path(__file__).parent.parent / "docs" / "tensorflow.md"
RUN_SCRIPTS = Path(__file__).parent / "run_scripts.py"


# A block that splits the CPU into logical devices runs in a process of its own (its devices
# are not the others'); the rest share one process (tests/run_scripts.py: each as __main__ in a
# fresh namespace), where TensorFlow starts once, not once a block (about 6 s of CPU each).
# TensorFlow takes set_memory_growth only before it starts its devices: such a block runs
# first there.
OWN_DEVICES = re.compile(r"set_logical_device_configuration|set_visible_devices")
FIRST = re.compile(r"set_memory_growth")


def run_blocks(paths: list[Path], env: dict, tmp_path: Path) -> dict[Path, tuple[int, str, str]]:
    """Each block's (exit status, stdout, stderr), the shared ones run in one process."""
    shared = [p for p in paths if not OWN_DEVICES.search(p.read_text())]
    shared.sort(key=lambda p: not FIRST.search(p.read_text()))
    results = {}
    for path in paths:
        if path not in shared:
            proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=240)
            results[path] = (proc.returncode, proc.stdout, proc.stderr)
    if shared:
        plan = tmp_path / "shared.json"
        plan.write_text(json.dumps([{"label": p.stem, "script": str(p)} for p in shared]))
        proc = subprocess.run([sys.executable, str(RUN_SCRIPTS), str(plan), str(tmp_path)],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=240 * len(shared))
        for p in shared:
            status = tmp_path / f"{p.stem}.status"
            assert status.exists(), (f"the shared process ended (exit {proc.returncode}) before "
                                     f"{p.name} finished:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
            results[p] = (int(status.read_text()), (tmp_path / f"{p.stem}.out").read_text(),
                          (tmp_path / f"{p.stem}.err").read_text())
    return results


@needs_tf
@pytest.mark.slow
def test_doc_examples_run_as_written(tmp_path):
    """Every Python block of docs/tensorflow.md runs under plain python; the multi-worker one
    (its first line names mpiexec) also under ``mpiexec -n 2``, where both workers print the
    loss that the plain run printed."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    assert len(blocks) >= 3, "docs/tensorflow.md lost its examples"
    # the examples use neither JAX nor matplotlib, which TensorFlow's import pulls in
    env = tf_lean(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    can_launch = importlib.util.find_spec("mpi4py") is not None and find_mpiexec() is not None
    paths = []
    for i, block in enumerate(blocks):
        paths.append(tmp_path / f"example{i}.py")
        paths[-1].write_text(block)
    results = run_blocks(paths, env, tmp_path)
    for i, (block, path) in enumerate(zip(blocks, paths)):
        status, stdout, stderr = results[path]
        assert status == 0, f"example {i} failed:\n{block}\n{stderr[-3000:]}"
        if "mpiexec" not in block.splitlines()[0] or not can_launch:
            continue
        alone = stdout.strip()
        assert alone.startswith("worker 0 of 1: loss "), alone
        # (a crash prints each thread's Python stack: one run in many ended with signal 11 and
        # no word but TensorFlow's start-up lines, which are left out of the message)
        proc = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(path)],
                              cwd=tmp_path, env=dict(env, PYTHONFAULTHANDLER="1"),
                              capture_output=True, text=True, timeout=240)
        said = "\n".join(line for line in proc.stderr.splitlines()
                         if "oneDNN" not in line and "absl::InitializeLog" not in line)
        assert proc.returncode == 0, (f"example {i} under mpiexec failed (exit "
                                      f"{proc.returncode}):\n{proc.stdout[-2000:]}\n{said[-6000:]}")
        loss = alone.split("loss ")[1]
        assert sorted(proc.stdout.split("\n")[:-1]) == [f"worker 0 of 2: loss {loss}",
                                                         f"worker 1 of 2: loss {loss}"], proc.stdout
