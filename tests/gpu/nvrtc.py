"""Compile the backend's kernels with NVRTC, as CuPy would, without a GPU.

NVRTC is a compiler library: it needs no driver and no card. CuPy's ``ElementwiseKernel``
wraps an operation in a loop over ``CArray`` parameters and compiles the result with NVRTC;
:func:`elementwise_source` builds the same kind of translation unit from the same operation
and preamble, so a kernel that would not compile on a GPU fails here first.
"""

from __future__ import annotations

import os

import numpy as np


def nvrtc_ready() -> str | None:
    """None when NVRTC and the CUDA headers CuPy needs are installed, else why not."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot compile here"
        return (f"NVRTC is not loadable ({type(exc).__name__}: {exc}); pip install -e "
                "'.[cuda13]' (or '.[cuda12]')")
    if not find_nvidia_header_directory("cudart"):
        return "CUDA headers are missing; pip install -e '.[cuda13]' (or '.[cuda12]')"
    return None


def _typename(dtype: np.dtype) -> str:
    from cupy._core._scalar import get_typename

    return get_typename(np.dtype(dtype))


def elementwise_source(name: str, in_params: str, out_params: str, operation: str,
                       types: dict[str, np.dtype], preamble: str = "") -> str:
    """The translation unit CuPy generates for a 1-D contiguous ``ElementwiseKernel`` call.

    ``types`` gives the dtype of each type placeholder (``{"T": float32}``)."""
    params, loads = [], []
    for text, const in ((in_params, True), (out_params, False)):
        for param in filter(None, (p.strip() for p in text.split(","))):
            ctype, pname = param.split()
            c = ctype if len(ctype) == 1 else _typename(np.dtype(ctype))
            params.append(f"CArray<{c}, 1, true, true> _raw_{pname}")
            loads.append(f"{'const ' if const else ''}{c} &{pname} = _raw_{pname}[_ind.get()];")
    typedefs = "".join(f"typedef {_typename(d)} {t};\n" for t, d in types.items())
    # CuPy includes the bfloat16 class only for kernels with bfloat16 parameters
    extra = ("#include <cupy/bfloat16.cuh>\n"
             if any(np.dtype(d).name == "bfloat16" for d in types.values()) else "")
    return (
        "#include <cupy/complex.cuh>\n#include <cupy/carray.cuh>\n#include <cupy/float16.cuh>\n"
        f"{extra}{typedefs}{preamble}\n"
        f'extern "C" __global__ void {name}({", ".join(params)}, CIndexer<1, true> _ind) {{\n'
        "  CUPY_FOR(i, _ind.size()) {\n    _ind.set(i);\n"
        f"    {' '.join(loads)}\n    {operation}\n  }}\n}}\n")


def compile_source(source: str, arch: str = "90") -> None:
    """Compile with NVRTC as CuPy does (its headers, C++17, flush-to-zero); raise on error."""
    import cupy
    import cupy._core.core as core
    from cuda.pathfinder import find_nvidia_header_directory
    from cupy.cuda import compiler

    include = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
    options = (*core._get_cccl_include_options(), f"-I{include}",
               f"-I{find_nvidia_header_directory('cudart')}", "--std=c++17",
               f"-arch=compute_{arch}", "-ftz=true")
    compiler._NVRTCProgram(source, "collectives_check.cu").compile(options)
