"""GPU arrays of other libraries (PyTorch CUDA tensors, JAX GPU arrays, anything with
``__dlpack__`` on a CUDA device) as CuPy arrays, and results back, through DLPack: the same
device memory both ways, never a copy through the host.

DLPack's stream handshake orders the two libraries: ``cupy.from_dlpack(t)`` asks the
producer to make CuPy's current stream wait for its own (PyTorch records an event on its
current stream), and the producer's ``from_dlpack(result)`` asks CuPy to do the same for the
consumer's stream. Both run under the array's device, since CuPy records on the current
device's stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .probe import cupy_module


def device_of(x: Any) -> int:
    """The CUDA device ordinal of a DLPack producer's memory."""
    return int(x.__dlpack_device__()[1])


def adopt(x: Any, argument: str) -> Any:
    """A CuPy array on ``x``'s memory (``x``: a GPU array of another library)."""
    cupy = cupy_module()
    try:
        with cupy.cuda.Device(device_of(x)):
            return cupy.from_dlpack(x)
    except (TypeError, ValueError, BufferError, RuntimeError) as exc:
        if getattr(x, "requires_grad", False):
            raise TypeError(f"{argument} requires grad; pass {argument}.detach()") from exc
        raise TypeError(f"{argument} ({type(x).__module__}.{type(x).__name__} on GPU "
                        f"{device_of(x)}) cannot be shared with CuPy through DLPack: "
                        f"{exc}") from exc


def hand_back(result: Any, rebuild: Callable[[Any], Any]) -> Any:
    """``rebuild`` (the caller's library's ``from_dlpack``) over a result or a list of them,
    each under its own device."""
    cupy = cupy_module()
    if isinstance(result, list):
        return [hand_back(r, rebuild) for r in result]
    with cupy.cuda.Device(result.device.id):
        return rebuild(result)
