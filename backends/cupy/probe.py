"""What this process can use: CuPy 14 or later, a visible GPU, NVRTC, NCCL. Each check raises
a clear error that ends with the one ``pip install`` that brings the missing piece, for the
CUDA line of the CuPy installed (``cupy-cuda12x`` or ``cupy-cuda13x``), or of the driver where
CuPy is missing.

Importing this package never needs CUDA: every check runs when a GPU path is first taken, so
the library imports, and every CPU path works, on machines without CUDA.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import re
import warnings
from functools import lru_cache
from typing import Any

MIN_CUPY = 14  # get_unique_id() returns bytes, and NcclCommunicator takes them, since 14.0
LINES = (13, 12)  # the CUDA lines with an extra: cuda13, cuda12 ('cuda' is cuda12)
# per CUDA line: (NCCL wheel, NVRTC wheel)
WHEELS = {12: ("nvidia-nccl-cu12", "nvidia-cuda-nvrtc-cu12"),
          13: ("nvidia-nccl-cu13", "'nvidia-cuda-nvrtc==13.*'")}


class GpuUnavailableError(RuntimeError):
    """CuPy is installed but no CUDA GPU is visible to this process."""


class NcclUnavailableError(RuntimeError):
    """CuPy cannot load NCCL (its ``nvidia-nccl-cu12``/``-cu13`` wheel is missing)."""


def driver_cuda_line() -> int | None:
    """The CUDA major version the NVIDIA driver supports (12, 13, ...), None without one."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if driver.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return version.value // 1000 or None


def cupy_wheel() -> tuple[str, int] | None:
    """``(distribution, CUDA line)`` of the installed CuPy wheel, e.g. ("cupy-cuda13x", 13)."""
    for line in LINES:
        name = f"cupy-cuda{line}x"
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return name, line
    return None


def cuda_line() -> int:
    """The CUDA line whose wheels fit here: the installed CuPy's, else the driver's (12 where
    neither says; its wheels run on any driver from CUDA 12 on)."""
    wheel = cupy_wheel()
    if wheel is not None:
        return wheel[1]
    driver = driver_cuda_line()
    return driver if driver in LINES else 12


def install_line() -> str:
    """The pip command that installs the GPU extra for this machine's CUDA line."""
    return f"pip install -e '.[cuda{cuda_line()}]' from the checkout"


def _major(version: str) -> int:
    found = re.match(r"(\d+)", version)
    return int(found.group(1)) if found else 0


@lru_cache(maxsize=1)
def cupy_module() -> Any:
    """CuPy 14 or later, or ImportError saying how to install it (found once: every call of
    the GPU backends asks)."""
    try:
        import cupy
    except ImportError as exc:
        raise ImportError(f"GPU arrays need CuPy {MIN_CUPY} or later, which is not installed: "
                          f"{install_line()}") from exc
    version = str(getattr(cupy, "__version__", "0"))
    if _major(version) < MIN_CUPY:
        wheel = cupy_wheel()
        name = wheel[0] if wheel is not None else f"cupy-cuda{cuda_line()}x"
        raise ImportError(f"CuPy {version} is installed; the GPU backends need CuPy "
                          f"{MIN_CUPY} or later (NCCL unique ids as bytes): "
                          f"pip install -U '{name}>={MIN_CUPY}'")
    return cupy


def require_gpu() -> Any:
    """CuPy with at least one visible GPU and a loadable NVRTC, or an error saying why not."""
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
    _require_nvrtc()
    return cupy


@lru_cache(maxsize=1)
def _require_nvrtc() -> None:
    """NVRTC compiles every kernel of this backend: a missing one is said here, not at the
    first launch."""
    try:
        nvrtc = importlib.import_module("cupy.cuda.nvrtc")
    except ImportError:
        return  # a CuPy without the module (a stand-in): nothing to compile with, or check
    try:
        nvrtc.getVersion()
    except Exception as exc:  # noqa: BLE001 - CuPy's message names the library it looked for
        raise ImportError(f"CuPy cannot load NVRTC, which compiles the GPU kernels "
                          f"({type(exc).__name__}: {exc}): "
                          f"pip install {WHEELS[cuda_line()][1]}") from exc


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
            f"need: pip install {WHEELS[cuda_line()][0]}")
    return nccl


def nccl_version() -> int | None:
    """NCCL's version (e.g. 23203) where it loads, else None."""
    try:
        return int(nccl_module().get_version())
    except (ImportError, NcclUnavailableError):
        return None


def describe() -> str:
    """One line: CuPy, its CUDA line, the driver's, NCCL (for logs and benchmark records)."""
    wheel = cupy_wheel()
    try:
        cupy = cupy_module()
        have = f"CuPy {cupy.__version__} ({wheel[0] if wheel else 'not from a cupy-cuda wheel'})"
    except ImportError as exc:
        have = str(exc)
    return (f"{have}; driver CUDA {driver_cuda_line() or 'none'}; NCCL "
            f"{nccl_version() or 'not loadable'}")
