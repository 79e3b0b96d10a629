"""PyTorch CUDA tensors through the multi-device API and back, by DLPack: results are
tensors on their inputs' devices, made from device memory (never copied through the host),
bitwise equal to the NumPy backend's. Skipped, with the reason, where PyTorch, its CUDA or
CuPy with a GPU is missing."""

from __future__ import annotations

import numpy as np
import pytest
from gpukit import gpu_reason, same_bits, torch_reason

import collectives
from collectives.tools.reference import exact_inputs

REASON = torch_reason() or gpu_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def _devices(n: int) -> list[int]:
    import torch

    return [p % torch.cuda.device_count() for p in range(n)]


def _tensors(values, devices):
    import torch

    return [torch.from_numpy(v).to(f"cuda:{d}") for v, d in zip(values, devices)]


@pytest.mark.parametrize("algorithm", ["auto", "ring", "one_device"])
def test_all_reduce_of_cuda_tensors_returns_cuda_tensors_on_their_devices(algorithm):
    import torch

    devices = _devices(2)
    values = exact_inputs(2, 1009, np.float32)
    tensors = _tensors(values, devices)
    before = [t.clone() for t in tensors]
    out = collectives.all_reduce(tensors, "sum", algorithm)
    expected = collectives.all_reduce(values, "sum", "ring")
    for o, t, e in zip(out, tensors, expected):
        assert isinstance(o, torch.Tensor) and o.device == t.device
        assert same_bits(e, o.cpu().numpy())
    assert all(torch.equal(t, b) for t, b in zip(tensors, before))  # inputs untouched


def test_cuda_tensors_in_and_out_share_device_memory():
    """The library reads the tensors' own memory and fills ``out`` in place: no host copy
    on either side."""
    import cupy
    import torch

    devices = _devices(2)
    values = exact_inputs(2, 4096, np.float32)
    tensors = _tensors(values, devices)
    outs = [torch.empty_like(t) for t in tensors]
    pointers = [o.data_ptr() for o in outs]
    assert cupy.from_dlpack(tensors[0]).data.ptr == tensors[0].data_ptr()
    got = collectives.all_reduce(tensors, "max", "ring", out=outs)
    assert [g.data_ptr() for g in got] == pointers and got[0] is outs[0]
    expected = np.maximum(values[0], values[1])
    assert all(same_bits(expected, g.cpu().numpy()) for g in got)


def test_bfloat16_and_float16_tensors():
    import torch

    pytest.importorskip("ml_dtypes", reason="CuPy takes bfloat16 only with ml_dtypes installed")

    devices = _devices(3)
    for dtype in (torch.bfloat16, torch.float16):
        tensors = [torch.full((257,), float(p + 1), dtype=dtype, device=f"cuda:{d}")
                   for p, d in enumerate(devices)]
        out = collectives.all_reduce(tensors, "sum")
        assert all(o.dtype == dtype and (o.float() == 6).all() for o in out)
