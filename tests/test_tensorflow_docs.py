"""docs/tensorflow.md's examples run as written (a module of its own, so that pytest-xdist can
run it beside tests/test_tensorflow.py's scenario, not after it on the same worker)."""

from __future__ import annotations

import importlib.util
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
    for i, block in enumerate(blocks):
        path = tmp_path / f"example{i}.py"
        path.write_text(block)
        proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, f"example {i} failed:\n{block}\n{proc.stderr[-3000:]}"
        if "mpiexec" not in block.splitlines()[0] or not can_launch:
            continue
        alone = proc.stdout.strip()
        assert alone.startswith("worker 0 of 1: loss "), alone
        proc = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(path)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, f"example {i} under mpiexec failed:\n{proc.stderr[-3000:]}"
        loss = alone.split("loss ")[1]
        assert sorted(proc.stdout.split("\n")[:-1]) == [f"worker 0 of 2: loss {loss}",
                                                         f"worker 1 of 2: loss {loss}"], proc.stdout
