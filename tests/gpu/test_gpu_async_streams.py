"""The NCCL backend's asynchronous calls on a real GPU: issued on the default stream, waited
on under a side stream (``with torch.cuda.stream(side):``, ``with cupy_stream:``), read there;
the all-reduce starts late (the default stream spins first), so a side stream that ``wait()``
did not order reads the sentinel. Skipped, with the reason, where CuPy, NCCL, a GPU, MPI or
PyTorch with CUDA is missing, and under the NumPy stand-in for CuPy (which runs everything at
once, so no race can show: tests/test_gpu_streams.py checks the order there)."""

from __future__ import annotations

import pytest
from gpukit import STAND_IN, launch, nccl_reason, needs_gpu, needs_mpi, passed, torch_reason

pytestmark = [*needs_gpu, needs_mpi,
              pytest.mark.skipif(nccl_reason() is not None, reason=nccl_reason() or ""),
              pytest.mark.skipif(STAND_IN, reason="the NumPy stand-in for CuPy runs everything "
                                 "at once: a stream race needs a card")]


TORCH = torch_reason()


@pytest.mark.skipif(TORCH is not None, reason=TORCH or "")
def test_torch_tensor_waited_on_under_a_side_stream_is_read_there_after_the_all_reduce():
    out = passed(launch("nccl_side_streams.py", 1, "torch", timeout=240), "torch")
    assert "checked=6" in out


def test_cupy_array_waited_on_under_a_side_stream_is_read_there_after_the_all_reduce():
    out = passed(launch("nccl_side_streams.py", 1, "cupy", timeout=240), "cupy")
    assert "checked=6" in out
