"""What the adapter's device path needs from an array library: a kit per library.

The device path (``device_path``) reduces tensors where they are, in the arrays of a library
that lives on their device, with ``collectives.all_reduce``/``reduce``/``batch_all_reduce``
(which hand CuPy arrays to the CuPy backend), and hands the results back to TensorFlow on
their devices. A kit says how a tensor becomes an array and back, how to wait for the other
side's work, and how arrays are staged through host memory for a ``Communicator`` across
workers.

* ``CUPY`` (GPUs): the arrays of ``collectives.backends.cupy`` (NCCL where
  ``algorithm="nccl"`` and every device has a GPU of its own), tensors through DLPack
  (``dlpack``), staging through pinned host memory (``PinnedBuffer``).
* ``NUMPY``: the core's NumPy backend on logical CPU devices. The adapter itself reduces
  CPU tensors on its host path (``host``, one ``numpy_function`` per batch); this kit runs the
  device path's TensorFlow side on a machine without a GPU.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import lru_cache

import numpy as np
import tensorflow as tf

from . import convert, dlpack
from .pinned import PinnedBuffer

__all__ = ["CUPY", "DTYPES", "NUMPY", "CupyKit", "NumpyKit", "PinnedBuffer", "gpu_unavailable"]

#: Dtypes the device path takes (others, and empty batches, keep the host path).
DTYPES = (tf.float16, tf.float32, tf.float64)


@lru_cache(maxsize=1)
def gpu_unavailable() -> str | None:
    """Why CuPy cannot reduce on GPUs in this process, or None when it can."""
    try:
        from collectives.backends.cupy import GpuUnavailableError, require_gpu

        require_gpu()
    except ImportError as exc:
        return str(exc)
    except GpuUnavailableError as exc:
        return str(exc)
    return None


class NumpyKit:
    """The core's NumPy backend: the device path's kit for logical CPU devices."""

    name = "numpy"
    extra_names: tuple[str, ...] = ()  # the core reads "nccl" as its own name

    @property
    def arrays(self):
        from collectives.arrays import NUMPY as arrays

        return arrays

    def wait_for_tensorflow(self, devices) -> None:
        """CPU kernels have finished when their outputs exist."""

    def from_tensor(self, tensor):
        return convert.to_numpy(tensor)

    def finish(self, arrays) -> None:
        """NumPy's work is done when it returns."""

    def aligned(self, array):
        """``convert.to_tensor`` aligns what it hands over itself."""
        return array

    def to_tensor(self, array, device: str):
        return convert.to_tensor(array)

    def home(self, array):
        return nullcontext()

    def nccl_unavailable(self, arrays) -> str | None:
        """None: the core runs the name "nccl" as it always does (its ring)."""
        return None

    def stage(self, arrays, buffer: PinnedBuffer) -> list:
        """Host copies of ``arrays`` for a ``Communicator`` (NumPy arrays are host memory)."""
        return list(arrays)

    def unstage(self, host, like):
        return host

    def divide(self, array, count: int):
        return np.true_divide(array, count, out=array, casting="unsafe")


class CupyKit:
    """``collectives.backends.cupy`` on TensorFlow's GPUs."""

    name = "cupy"
    extra_names = ("nccl",)  # the CuPy backend runs NCCL itself for "nccl"

    @property
    def arrays(self):
        from collectives.backends import cupy as backend

        return backend.devices().arrays

    def wait_for_tensorflow(self, devices) -> None:
        dlpack.sync_tensorflow(devices)

    def from_tensor(self, tensor):
        return dlpack.tensor_to_cupy(tensor)

    def finish(self, arrays) -> None:
        """Wait for the work queued on the streams of the arrays' GPUs (TensorFlow reads them
        next, on streams of its own). Each under its own device: the current stream there is
        where the library left the results ready, and a null stream handle means "the
        current device's", whichever GPU TensorFlow's thread sits on."""
        import cupy

        for device in dict.fromkeys(a.device.id for a in arrays):
            with cupy.cuda.Device(device):
                cupy.cuda.get_current_stream().synchronize()

    def aligned(self, array):
        """``array``, or a copy where it does not start on a 64-byte boundary (a result
        unpacked from a pack): TensorFlow's GPU kernels assume aligned tensors."""
        if array.data.ptr % convert.ALIGNMENT == 0 and array.flags.c_contiguous:
            return array
        with array.device:
            return array.copy()

    def to_tensor(self, array, device: str):
        return dlpack.cupy_to_tensor(array, device)

    def home(self, array):
        return array.device

    def nccl_unavailable(self, arrays) -> str | None:
        """Why NCCL cannot reduce ``arrays`` (one per device), or None when it can."""
        gpus = [a.device.id for a in arrays]
        if len(set(gpus)) < len(gpus):
            return ("NCCL needs a GPU of its own for every device, and the devices share "
                    f"GPUs (CUDA devices {gpus})")
        return self.nccl_missing()

    def nccl_missing(self) -> str | None:
        """Why CuPy cannot load NCCL, or None when it can."""
        from collectives.backends.cupy import NcclUnavailableError
        from collectives.backends.cupy.probe import nccl_module

        try:
            nccl_module()
        except (ImportError, NcclUnavailableError) as exc:
            return str(exc)
        return None

    def stage(self, arrays, buffer: PinnedBuffer) -> list:
        """Copies of ``arrays`` in ``buffer``'s pinned host memory, for a ``Communicator``
        whose transport reads host memory (the copies are complete when this returns)."""
        hosts = buffer.views(arrays)
        for a, host in zip(arrays, hosts):
            with a.device:  # on the stream the reduction used; waits for the copy
                a.get(out=host)
        return hosts

    def unstage(self, host, like):
        """``host`` copied into ``like`` (a device array of its shape and dtype)."""
        with like.device:
            like.set(np.ascontiguousarray(host, dtype=like.dtype).reshape(like.shape))
        return like

    def divide(self, array, count: int):
        with array.device:
            array /= count
        return array


NUMPY = NumpyKit()
CUPY = CupyKit()
