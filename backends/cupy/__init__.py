"""GPUs in one process: the multi-device backend for CuPy arrays.

``collectives.all_reduce([x0, x1, ...])`` with ``cupy.ndarray`` inputs runs here (the core's
registry sends CuPy arrays to :func:`devices`): each ``xi`` on its own GPU, or several on one
GPU as logical devices. Results come back on each input's GPU, ready for work enqueued on that
device's current stream; nothing in a call waits on the host.

The functions of this module (:func:`all_reduce`, :func:`reduce`, :func:`broadcast`,
:func:`all_gather`, :func:`reduce_scatter`, :func:`batch_all_reduce`) take the same
arguments plus ``async_op=True``, and run NCCL where it applies (``algorithm="nccl"``, the
``"nccl/X"`` names, and ``"auto"`` over distinct GPUs); see :mod:`.api`.

Importing this package needs neither CUDA nor CuPy; the first GPU call checks for both.
"""

from __future__ import annotations

from . import foreign
from .api import all_reduce, batch_all_reduce, nccl_request, reduce
from .api_moves import all_gather, broadcast, reduce_scatter
from .arrays import CupyArrays
from .bench_kit import bench_kit
from .devices import CupyDevices, devices, logical_streams
from .group import free_communicators
from .probe import GpuUnavailableError, NcclUnavailableError, nccl_version, require_gpu
from .work import DeviceWork

__all__ = ["CupyArrays", "CupyDevices", "DeviceWork", "GpuUnavailableError",
           "NcclUnavailableError", "all_gather", "all_reduce", "batch_all_reduce", "bench_kit",
           "broadcast", "devices", "foreign", "free_communicators", "logical_streams", "nccl_request",
           "nccl_version", "reduce", "reduce_scatter", "require_gpu"]
