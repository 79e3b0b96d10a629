"""What this process can use: CuPy, a visible GPU, NCCL. Each check raises a clear error.

Importing this package never needs CUDA: every check runs when a GPU path is first taken, so
the library imports, and every CPU path works, on machines without CUDA.
"""

from __future__ import annotations

import warnings
from functools import lru_cache
from typing import Any

INSTALL = "pip install -e '.[cuda]' from the checkout (cupy-cuda12x, nvidia-nccl-cu12, NVRTC)"


class GpuUnavailableError(RuntimeError):
    """CuPy is installed but no CUDA GPU is visible to this process."""


class NcclUnavailableError(RuntimeError):
    """CuPy cannot load NCCL (the ``nvidia-nccl-cu12`` wheel is missing)."""


def cupy_module() -> Any:
    """CuPy, or ImportError saying how to install it."""
    try:
        import cupy
    except ImportError as exc:
        raise ImportError(f"GPU arrays need CuPy, which is not installed: {INSTALL}") from exc
    return cupy


def require_gpu() -> Any:
    """CuPy with at least one visible GPU, or GpuUnavailableError saying why not."""
    cupy = cupy_module()
    if not cupy.cuda.is_available():
        try:
            cupy.cuda.runtime.getDeviceCount()
            reason = "the CUDA runtime reports no device"
        except Exception as exc:  # noqa: BLE001 - its name and text are the diagnosis
            reason = f"{type(exc).__name__}: {exc}"
        raise GpuUnavailableError(
            f"no CUDA GPU is visible to this process ({reason}); check the NVIDIA driver "
            "(nvidia-smi) and CUDA_VISIBLE_DEVICES")
    return cupy


@lru_cache(maxsize=1)
def nccl_module() -> Any:
    """``cupy.cuda.nccl`` with the library loaded, or NcclUnavailableError naming the wheel."""
    cupy_module()
    with warnings.catch_warnings():  # CuPy warns on import when libnccl is missing
        warnings.simplefilter("ignore")
        from cupy.cuda import nccl
    missing = [f for f in ("get_unique_id", "groupStart", "groupEnd", "NcclCommunicator")
               if not hasattr(nccl, f)]
    if not getattr(nccl, "available", False) or missing:
        raise NcclUnavailableError(
            "CuPy cannot load NCCL (libnccl.so.2), which algorithm='nccl' and the nccl backend "
            "need: pip install nvidia-nccl-cu12 (or the whole GPU extra: "
            f"{INSTALL})")
    return nccl


def nccl_version() -> int | None:
    """NCCL's version (e.g. 23203) where it loads, else None."""
    try:
        return int(nccl_module().get_version())
    except (ImportError, NcclUnavailableError):
        return None
