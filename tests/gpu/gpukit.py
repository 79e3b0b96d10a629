"""Helpers of the GPU tests: why they skip, moving exact inputs to devices, comparing bits.

GPU tests run on a real GPU and skip, with the reason, where CuPy is missing or no GPU is
visible. They also run under a NumPy stand-in for CuPy put first on ``PYTHONPATH`` (its
``cupy.__version__`` ends in "-fake"): it checks the plumbing (API use, which device each
piece of work goes to) on a CPU, proves nothing about a GPU, and does not model bfloat16 in
NCCL or NaN in bfloat16 kernels, so those cases skip under it (:data:`STAND_IN_GAP`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).parent / "scenarios"


def install_line() -> str:
    from collectives.backends.cupy.probe import install_line

    return install_line()


def gpu_reason() -> str | None:
    """None where a GPU test can run, else why not."""
    if importlib.util.find_spec("cupy") is None:
        return f"CuPy is not installed ({install_line()})"
    import cupy

    if not cupy.cuda.is_available():
        return "no CUDA GPU is visible (cupy.cuda.is_available() is False)"
    return None


def nccl_reason() -> str | None:
    """None where CuPy loads NCCL, else why not (GPU or not)."""
    if importlib.util.find_spec("cupy") is None:
        return f"CuPy is not installed ({install_line()})"
    from collectives.backends.cupy.probe import NcclUnavailableError, nccl_module

    try:
        nccl_module()
    except (ImportError, NcclUnavailableError) as exc:
        return str(exc)
    return None


def stand_in() -> bool:
    """Whether ``cupy`` is the NumPy stand-in rather than CuPy."""
    if importlib.util.find_spec("cupy") is None:
        return False
    import cupy

    return str(getattr(cupy, "__version__", "")).endswith("-fake")


STAND_IN = stand_in()
STAND_IN_GAP = "the CuPy stand-in models neither NCCL's bfloat16 nor NaN in bfloat16 kernels"


def is_bfloat16(dtype) -> bool:
    return np.dtype(dtype).name == "bfloat16"


def gpu_count() -> int:
    if gpu_reason() is not None:
        return 0
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


GPU = gpu_reason()
needs_gpu = [pytest.mark.gpu, pytest.mark.skipif(GPU is not None, reason=GPU or "")]
needs_gpus = pytest.mark.skipif(gpu_count() < 2, reason=GPU or "needs two GPUs; this "
                                "machine shows one")


def torch_reason() -> str | None:
    """Why PyTorch cannot run a CUDA test here (None: it can). Without a card, the card's
    reason, without asking PyTorch (whose import costs seconds)."""
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed (the GPU machine's own torch runs these)"
    if GPU is not None:
        return GPU
    import torch

    return None if torch.cuda.is_available() else f"PyTorch {torch.__version__} sees no CUDA GPU"


def find_mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


MPIEXEC = find_mpiexec()
MPI_REASON = (None if importlib.util.find_spec("mpi4py") and MPIEXEC
              else "needs mpi4py and mpiexec (pip install -e '.[mpi]')")
needs_mpi = pytest.mark.skipif(MPI_REASON is not None, reason=MPI_REASON or "")


def launch(script: str, n: int, *args: str, env: dict | None = None,
           timeout: float = 240) -> subprocess.CompletedProcess:
    """``mpiexec -n n python scenarios/script args`` from the checkout."""
    full = {k: v for k, v in os.environ.items() if k != "COLLECTIVES_RANKS_PER_NODE"}
    # the checkout first, then whatever the caller's path holds (a stand-in CuPy, say)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    full.update({"PYTHONPATH": path, "OMP_NUM_THREADS": "1", **(env or {})})
    cmd = [MPIEXEC, "-n", str(n), sys.executable, str(SCENARIOS / script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full,
                          cwd=ROOT)


def passed(proc: subprocess.CompletedProcess, name: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-6000:]}"
    assert f"SUMMARY {name} PASS" in out, out[-6000:]
    return out


def on_devices(values, devices):
    """``values[i]`` copied to GPU ``devices[i]``."""
    import cupy

    out = []
    for v, d in zip(values, devices):
        with cupy.cuda.Device(d):
            out.append(cupy.asarray(v))
    return out


def host(x) -> np.ndarray:
    import cupy

    return cupy.asnumpy(x)


def same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
