"""TensorFlow GPU tensors <-> CuPy arrays through DLPack: the same device memory, no copy.

* **In**: ``tf.experimental.dlpack.to_dlpack(tensor)`` gives a capsule that ``cupy.from_dlpack``
  adopts (CuPy's ``from_dlpack(tensor)`` cannot be used: TensorFlow's ``__dlpack__`` refuses
  the ``stream`` argument CuPy passes). The capsule holds a reference to TensorFlow's buffer
  for as long as the CuPy array lives.
* **Out**: ``tf.experimental.dlpack.from_dlpack(array.__dlpack__())``: TensorFlow adopts
  CuPy's memory and returns it to CuPy's pool when the tensor is freed. ``__dlpack__()``
  without ``max_version`` gives the unversioned capsule TensorFlow reads (CuPy's deprecated
  ``toDlpack()`` exports a versioned one by default in its current source).
* **Device numbers**: a capsule's device id is TensorFlow's *logical* GPU index on the way out
  of TensorFlow and is read as one on the way in, while CuPy reads it as a CUDA device ordinal.
  They differ where a GPU is split into logical GPUs (``GPU:1`` may live on CUDA device 0) or
  where ``tf.config.set_visible_devices`` hides GPUs. So the id is rewritten in the capsule:
  to the CUDA device that holds the memory (asked of CUDA) on the way in, to the logical GPU
  the tensor should live on on the way out.
* **Streams**: TensorFlow runs a GPU's kernels on its own streams, which nothing here can wait
  on, so ``sync_tensorflow`` waits for each GPU's TensorFlow work (TensorFlow's
  ``SyncDevice``) before CuPy reads its memory, and the caller synchronises CuPy's streams
  before TensorFlow reads results.
* **Lifetime**: TensorFlow frees a tensor once its last reader is *enqueued* on its own
  stream; memory CuPy lent it would then go back to CuPy's pool at once, and CuPy could hand
  it out again (and write it) before TensorFlow's readers ran. So a result is lent as a view
  whose owner, when TensorFlow lets go, *retires* the array instead of freeing it, and the
  next ``sync_tensorflow`` of its GPU (which waits for every reader TensorFlow had
  enqueued by then) frees what was retired before it began.

Only floating dtypes take this path: TensorFlow keeps int32 "GPU" tensors in host memory.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque

import tensorflow as tf

__all__ = ["capsule_fields", "cupy_to_tensor", "cuda_device_of", "lend", "logical_index",
           "release_retired", "retired_since", "set_capsule_device", "sync_tensorflow",
           "tensor_to_cupy"]

_CPU, _CUDA = 1, 2  # DLDeviceType


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):  # DLManagedTensor (the unversioned capsule "dltensor")
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _managed(capsule) -> _Managed:
    if not _is_valid(capsule, b"dltensor"):
        raise ValueError("not an unconsumed unversioned DLPack capsule (name 'dltensor')")
    return _Managed.from_address(_get_pointer(capsule, b"dltensor"))


def capsule_fields(capsule) -> tuple[int, int, int]:
    """``(data pointer, DLPack device type, device id)`` of an unconsumed DLPack capsule."""
    tensor = _managed(capsule).dl_tensor
    return tensor.data or 0, tensor.device.device_type, tensor.device.device_id


def set_capsule_device(capsule, device_id: int) -> None:
    """Rewrite the device id of an unconsumed capsule (its memory stays where it is)."""
    _managed(capsule).dl_tensor.device.device_id = int(device_id)


def logical_index(device: str) -> int:
    """TensorFlow's index of a device name (``.../device:GPU:1`` -> 1)."""
    spec = tf.DeviceSpec.from_string(device)
    return int(spec.device_index or 0)


_ordinals: dict[str, int] = {}
_lock = threading.Lock()


def _canonical(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    return f"{(spec.device_type or 'CPU').upper()}:{spec.device_index or 0}"


def _pointer_device(pointer: int) -> int:
    import cupy

    return int(cupy.cuda.runtime.pointerGetAttributes(pointer).device)


def cuda_device_of(device: str, pointer: int = 0) -> int:
    """The CUDA device ordinal behind TensorFlow's GPU ``device`` (cached per device).

    Learnt from ``pointer`` (memory of a tensor on ``device``) when given, else from a
    one-element tensor made there.
    """
    key = _canonical(device)
    known = _ordinals.get(key)
    if known is not None:
        return known
    if not pointer:
        with tf.init_scope(), tf.device(device):
            probe = tf.zeros([1], tf.float32)
        pointer = capsule_fields(tf.experimental.dlpack.to_dlpack(probe))[0]
    ordinal = _pointer_device(pointer)
    with _lock:
        _ordinals[key] = ordinal
    return ordinal


# CUDA device -> arrays whose tensors TensorFlow has freed; appended from any thread that
# drops a tensor (deque.append is atomic: no lock where a finalizer may run)
_retired: dict[int, deque] = {}


class _Lender:
    """The owner of the memory a lent view names: it holds the array, and when TensorFlow
    drops the view (and so this), it retires the array instead of freeing it."""

    __slots__ = ("array", "ordinal")

    def __init__(self, array, ordinal: int):
        self.array, self.ordinal = array, ordinal

    def __del__(self):
        queue = _retired.get(self.ordinal)
        if queue is not None:  # (None only while the interpreter shuts down)
            queue.append(self.array)


def lend(array):
    """A view of ``array`` (a CuPy array) for TensorFlow to adopt; the array is retired, not
    freed, when the view dies, until ``release_retired`` of its device."""
    import cupy

    ordinal = array.device.id
    with _lock:
        _retired.setdefault(ordinal, deque())
    memory = cupy.cuda.UnownedMemory(array.data.ptr, array.nbytes, _Lender(array, ordinal),
                                     ordinal)
    return cupy.ndarray(array.shape, array.dtype, cupy.cuda.MemoryPointer(memory, 0))


def retired_since(ordinal: int) -> int:
    """How many arrays of CUDA device ``ordinal`` wait to be freed (a mark for release)."""
    return len(_retired.get(ordinal, ()))


def release_retired(ordinal: int, count: int) -> None:
    """Free the first ``count`` retired arrays of CUDA device ``ordinal`` (those retired
    before a sync of the device began: every reader of them has finished)."""
    queue = _retired.get(ordinal)
    if queue is None:
        return
    for _ in range(min(count, len(queue))):
        queue.popleft()


def sync_tensorflow(devices) -> None:
    """Wait until the TensorFlow work queued so far on each GPU of ``devices`` has finished;
    then free the memory lent to TensorFlow on those GPUs that it had let go of before."""
    from tensorflow.python.eager import context
    from tensorflow.python.ops import gen_sync_ops

    marks: dict[int, int]  # CUDA device -> its retired arrays before the sync
    done, marks = set(), {}
    for device in devices:
        key = _canonical(device)
        if key in done or not key.startswith("GPU"):
            continue
        done.add(key)
        if _retired:
            ordinal = cuda_device_of(device)
            marks.setdefault(ordinal, retired_since(ordinal))
        with tf.device(device):
            gen_sync_ops.sync_device()
    context.async_wait()
    for ordinal, count in marks.items():
        release_retired(ordinal, count)


def tensor_to_cupy(tensor):
    """A CuPy array on ``tensor``'s memory (an eager GPU tensor whose work has finished)."""
    import cupy

    if tensor.shape.num_elements() == 0:  # no memory to share (its pointer may be null)
        with cupy.cuda.Device(cuda_device_of(tensor.device)):
            return cupy.empty(tuple(tensor.shape), tensor.dtype.as_numpy_dtype)
    capsule = tf.experimental.dlpack.to_dlpack(tensor)
    pointer, kind, _ = capsule_fields(capsule)
    if kind != _CUDA:
        raise ValueError(f"a tensor on {tensor.device} is not in GPU memory; only floating "
                         "tensors on GPUs take the adapter's GPU path")
    set_capsule_device(capsule, cuda_device_of(tensor.device, pointer))
    return cupy.from_dlpack(capsule)


def cupy_to_tensor(array, device: str):
    """An eager tensor on TensorFlow's GPU ``device`` holding ``array``'s memory (no copy).

    ``array`` must lie on the CUDA device behind ``device`` and its work must have finished.
    """
    ordinal = cuda_device_of(device)
    if array.device.id != ordinal:
        raise ValueError(f"the result lies on CUDA device {array.device.id} but {device} is "
                         f"CUDA device {ordinal}; TensorFlow can adopt memory only on its own GPU")
    if array.size == 0:
        with tf.device(device):
            return tf.zeros(array.shape, tf.as_dtype(array.dtype))
    capsule = lend(array).__dlpack__()  # unversioned: no max_version
    set_capsule_device(capsule, logical_index(device))
    return tf.experimental.dlpack.from_dlpack(capsule)
