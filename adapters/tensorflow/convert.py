"""TensorFlow values <-> NumPy buffers, kept apart from communication.

What crosses the boundary, and why it is done this way (measured with TF 2.21 on CPU):

* **In**: ``np.asarray(eager_tensor)`` and the arrays a ``tf.numpy_function`` receives are views
  of the tensors' buffers: no copy. They are never written.
* **Out**: TensorFlow aliases a NumPy array only when it is 64-byte aligned (Eigen's alignment);
  anything else it copies, slowly (about 1 GB/s for a fresh 64 MiB output). So every result
  is written into (or copied once into) an ``aligned_empty`` buffer. In eager mode it
  becomes a tensor through DLPack (no copy; ``tf.convert_to_tensor`` would copy); inside
  ``tf.function`` the ``numpy_function`` output aliases it.
* **Graph mode**: ``host_call`` wraps the host work in ONE ``tf.numpy_function`` per call
  site. The Python of a cross-device op runs once, at trace time; only the host function runs
  at every step. The op is stateful, gets the static shapes of its outputs, and is chained
  (control dependency) after the previous host call of the same graph, so every process issues
  its collectives in the same order.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import distribute_utils
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.ops import control_flow_util

from .pool import ALIGNMENT, BufferPool, aligned_empty

__all__ = [
    "ALIGNMENT",
    "POOL",
    "BufferPool",
    "aligned_empty",
    "as_output",
    "host_call",
    "mean_dtype",
    "mirrored",
    "numpy_dtype",
    "place",
    "previous_calls",
    "record_call",
    "to_numpy",
    "to_tensor",
]

def numpy_dtype(dtype) -> np.dtype:
    """The NumPy dtype of a TF dtype (bfloat16 comes from ml_dtypes, which TF depends on)."""
    return np.dtype(tf.as_dtype(dtype).as_numpy_dtype)


def mean_dtype(dtype) -> tf.DType:
    """The dtype of TF's MEAN (true division): small integers -> float32, others -> float64."""
    dtype = tf.as_dtype(dtype)
    if dtype in (tf.int8, tf.int16, tf.uint8, tf.uint16):
        return tf.float32
    if dtype.is_integer:
        return tf.float64
    return dtype


#: Where results handed to TensorFlow come from (bounded: ``POOL.limit(max_bytes=...)``).
POOL = BufferPool()


def _aligned(x: np.ndarray) -> bool:
    return x.ctypes.data % ALIGNMENT == 0 and x.flags.c_contiguous


def as_output(x, dtype, shape=None, empty: Callable = aligned_empty) -> np.ndarray:
    """``x`` as an aligned, contiguous array of ``dtype`` (and ``shape``), copying only if needed."""
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    if shape is not None and tuple(x.shape) != tuple(shape):
        x = x.reshape(shape)
    if x.dtype == dtype and _aligned(x) and x.flags.writeable:
        return x
    out = empty(x.shape, dtype)
    np.copyto(out, x, casting="unsafe")
    return out


def to_numpy(tensor) -> np.ndarray:
    """A read-only NumPy view of an eager tensor (a host copy for device tensors). A 0-d
    tensor's is its ``numpy()``, a copy: a 0-d bfloat16 tensor's ``__array__`` gives an
    ``ml_dtypes`` scalar, which NumPy refuses as an array ("object __array__ method not
    producing an array")."""
    if tensor.shape.rank == 0:
        return np.asarray(tensor.numpy())
    return np.asarray(tensor)


def to_tensor(x: np.ndarray, dtype=None) -> tf.Tensor:
    """An eager tensor holding ``x`` without copying it where TF allows (aligned: DLPack)."""
    dtype = tf.as_dtype(dtype) if dtype is not None else tf.as_dtype(np.asarray(x).dtype)
    x = as_output(x, numpy_dtype(dtype))
    if x.size and dtype not in (tf.bool, tf.bfloat16, tf.string):
        try:
            return tf.experimental.dlpack.from_dlpack(x.__dlpack__())
        except (BufferError, TypeError, ValueError, tf.errors.InvalidArgumentError):
            pass  # a dtype DLPack does not carry here: TF's own (copying) conversion
    return tf.convert_to_tensor(x, dtype=dtype)


def place(tensor, device: str):
    """``tensor`` (or IndexedSlices) on ``device``; between logical CPU devices no data moves."""
    with tf.device(device):
        if isinstance(tensor, tf.IndexedSlices):
            shape = tensor.dense_shape
            return tf.IndexedSlices(tf.identity(tensor.values), tf.identity(tensor.indices),
                                    None if shape is None else tf.identity(shape))
        return tf.identity(tensor)


def place_all(jobs: Iterable[tuple[Any, Sequence[str], bool]]) -> list[list]:
    """Each ``(tensor, devices, first_there)``'s tensor on every device of ``devices``
    (``first_there``: the tensor itself is the first device's), as ``place`` would, with one
    ``identity_n`` per CPU device for every tensor bound there (one identity per tensor
    cost 6 ms eagerly for a 161-tensor gradient list on 4 devices). A device a tensor lists
    twice gets a distinct tensor each time; other devices, an identity each."""
    jobs = list(jobs)
    placed: list[list] = [[None] * len(devices) for _, devices, _ in jobs]
    groups: dict[tuple[str, int], list[tuple[int, int, Any]]] = {}
    for j, (tensor, devices, first_there) in enumerate(jobs):
        seen: dict[str, int] = {}
        for i, device in enumerate(devices):
            if i == 0 and first_there:
                placed[j][0] = tensor
                continue
            if not _on_cpu(device):
                placed[j][i] = place(tensor, device)
                continue
            k = seen[device] = seen.get(device, -1) + 1
            groups.setdefault((device, k), []).append((j, i, tensor))
    for (device, _), items in groups.items():
        with tf.device(device):
            copies = tf.identity_n([tensor for _, _, tensor in items])
        for (j, i, _), copy in zip(items, copies):
            placed[j][i] = copy
    return placed


def _on_cpu(device: str) -> bool:
    return bool(device) and tf.DeviceSpec.from_string(device).device_type == "CPU"


def mirrored(per_device: Sequence):
    """TF's result wrapping: one device -> the value itself, several -> ``Mirrored`` in order."""
    return distribute_utils.regroup(tuple(per_device), wrap_class=values_lib.Mirrored)


# The last host call created in each graph: the next one gets a control dependency on it.
_LAST_CALL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def previous_calls() -> list:
    """The ops of the last library call in the current graph (none yet: an empty list)."""
    return list(_LAST_CALL.get(tf.compat.v1.get_default_graph()) or [])


def record_call(ops: Sequence) -> None:
    """Order the next library call of the current graph after ``ops``."""
    _LAST_CALL[tf.compat.v1.get_default_graph()] = list(ops)


def host_call(fn: Callable[..., Sequence[np.ndarray]], inputs: Sequence, out_dtypes: Sequence,
              out_shapes: Sequence, *, device: str | None = None,
              name: str = "collectives") -> list:
    """Run ``fn(*arrays) -> arrays`` on NumPy views of ``inputs``; outputs as tensors.

    Eager: ``fn`` runs now and its results become tensors without a copy. In a graph: one
    stateful ``tf.numpy_function`` runs ``fn`` at every step, ordered after the previous host
    call of the same graph; ``out_shapes`` (TensorShapes, possibly partial) are set on the
    outputs. ``fn`` must return aligned arrays of exactly ``out_dtypes`` (see ``as_output``).
    """
    out_dtypes = [tf.as_dtype(d) for d in out_dtypes]
    if not out_dtypes:
        raise ValueError("host_call needs at least one output to order later calls after it")
    if tf.executing_eagerly():
        results = fn(*[to_numpy(t) for t in inputs])
        return [to_tensor(r, d) for r, d in zip(results, out_dtypes)]

    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        # (XLA compiles no tf.numpy_function: its own error came when the function first ran,
        # naming a PyFunc kernel; MirroredStrategy on CPU devices reduces here under XLA)
        raise NotImplementedError(
            f"{name}: the collectives cross-device ops run on the host (a tf.numpy_function), "
            "which XLA cannot compile; drop jit_compile=True from the tf.function that "
            "reduces (its other work can stay compiled in a function of its own), or use "
            "TensorFlow's own cross-device ops where the step must be compiled whole")

    def run(*arrays):
        return tuple(fn(*arrays))

    with tf.device(device), tf.control_dependencies(previous_calls()):
        outputs = tf.numpy_function(run, list(inputs), Tout=out_dtypes, stateful=True, name=name)
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    outputs = list(outputs)
    for out, shape in zip(outputs, out_shapes):
        out.set_shape(shape)
    record_call([outputs[0].op])
    return outputs
