"""The NCCL backend's asynchronous calls on a real GPU: issued on the default stream, waited
on under a side stream (``with torch.cuda.stream(side):``, ``with cupy_stream:``), read there;
the all-reduce starts late (the default stream spins first), so a side stream that ``wait()``
did not order reads the sentinel. Skipped, with the reason, where CuPy, NCCL, a GPU, MPI or
PyTorch with CUDA is missing, and under the NumPy stand-in for CuPy (which runs everything at
once, so no race can show: tests/test_gpu_streams.py checks the order there)."""

from __future__ import annotations

import importlib.util

import pytest
from gpukit import GPU, STAND_IN, launch, nccl_reason, needs_gpu, needs_mpi, passed

pytestmark = [*needs_gpu, needs_mpi,
              pytest.mark.skipif(nccl_reason() is not None, reason=nccl_reason() or ""),
              pytest.mark.skipif(STAND_IN, reason="the NumPy stand-in for CuPy runs everything "
                                 "at once: a stream race needs a card")]


def _torch_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed (the GPU machine's own torch runs this)"
    if GPU is not None:  # (no card: nothing to ask PyTorch, whose import costs seconds)
        return GPU
    import torch

    return None if torch.cuda.is_available() else f"PyTorch {torch.__version__} sees no GPU"


@pytest.mark.skipif(_torch_reason() is not None, reason=_torch_reason() or "")
def test_torch_tensor_waited_on_under_a_side_stream_is_read_there_after_the_all_reduce():
    out = passed(launch("nccl_side_streams.py", 1, "torch", timeout=240), "torch")
    assert "checked=6" in out


def test_cupy_array_waited_on_under_a_side_stream_is_read_there_after_the_all_reduce():
    out = passed(launch("nccl_side_streams.py", 1, "cupy", timeout=240), "cupy")
    assert "checked=6" in out
