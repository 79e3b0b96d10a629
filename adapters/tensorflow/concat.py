"""Concatenations across replicas and workers: IndexedSlices, and gathers across workers.

A mixin of ``base.LibraryCrossDeviceOps``: TensorFlow reduces IndexedSlices by concatenating
the replicas' slices; across workers the concatenation (and ``gather``) goes through the
``Communicator`` in one host call, after the workers agree on it (``agreement``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import tensorflow as tf

from collectives.ops import ReduceOp as CoreOp

from . import convert, host
from .agreement import BatchAgreement, agree, signature

__all__ = ["Concatenations"]


class Concatenations:
    """IndexedSlices and gathers; the class using it has ``_comm``, ``_lock``,
    ``num_workers``, ``_workers_sum`` and ``reduce_to_device``."""

    if TYPE_CHECKING:  # what the class using it has
        reduce_to_device: str | None
        _workers_sum: str

        @property
        def num_workers(self) -> int: ...

    def _reduce_sparse(self, op: CoreOp, job, options, agreement: BatchAgreement | None):
        components = job.components
        index_dtypes = {c.indices.dtype for c in components}
        index_dtype = tf.int64 if len(index_dtypes) > 1 else index_dtypes.pop()
        with tf.device(self.reduce_to_device or job.destinations[0]):
            values = tf.concat([c.values for c in components], axis=0)
            indices = tf.concat([tf.cast(c.indices, index_dtype) for c in components], axis=0)
            divisor = 1
            workers = self.num_workers
            if workers > 1:
                values, indices = self._gather_slices(
                    values, indices, options, self.reduce_to_device or job.destinations[0],
                    agreement)
            if op is CoreOp.MEAN:
                divisor = len(components) * workers
            elif self._workers_sum == "mean" and workers > 1 and values.dtype.is_floating:
                divisor = workers
            if divisor != 1:
                values = values / divisor
        result = tf.IndexedSlices(values, indices, components[0].dense_shape)
        return convert.mirrored([convert.place(result, d) for d in job.destinations])

    def _gather_slices(self, values, indices, options, device, agreement: BatchAgreement | None):
        timeout = options.timeout_seconds
        np_values, np_indices = convert.numpy_dtype(values.dtype), convert.numpy_dtype(indices.dtype)

        def run(v, i):
            with self._lock:
                if agreement is not None:
                    agree(self._comm, agreement.signature(), timeout=timeout)
                return (convert.as_output(host.gather_ragged(self._comm, v, 0, timeout=timeout),
                                          np_values),
                        convert.as_output(host.gather_ragged(self._comm, i, 0, timeout=timeout),
                                          np_indices))

        shapes = [tf.TensorShape([None]).concatenate(values.shape[1:]), tf.TensorShape([None])]
        return convert.host_call(run, [values, indices], [values.dtype, indices.dtype], shapes,
                                 device=device, name="collectives_gather_slices")

    def _gather_across_workers(self, joined, axis, count, options, device):
        timeout = options.timeout_seconds
        np_dtype = convert.numpy_dtype(joined.dtype)

        def run(x):
            with self._lock:
                dims = list(x.shape)
                dims[axis] = None  # the gathered axis may differ between workers
                agree(self._comm, signature({"call": "gather", "devices": (count,), "axis": axis,
                                             "tensors": (("dense", x.dtype.name, tuple(dims)),)}),
                      timeout=timeout)
                return [convert.as_output(host.gather_ragged(self._comm, x, axis, timeout=timeout),
                                          np_dtype)]

        shape = joined.shape
        if shape.rank is not None:
            dims = shape.as_list()
            dims[axis] = None
            shape = tf.TensorShape(dims)
        return convert.host_call(run, [joined], [joined.dtype], [shape], device=device,
                                 name="collectives_gather")[0]
