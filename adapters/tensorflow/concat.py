"""Concatenations across replicas and workers: IndexedSlices, and gathers across workers.

TensorFlow reduces IndexedSlices by concatenating the replicas' slices; across workers the
concatenation (and ``gather``) goes through the ``Communicator`` in one host call, after the
workers agree on it (``agreement``). ``base.LibraryCrossDeviceOps`` calls these with its
``Workers`` (``world``) and the device the result is made on.
"""

from __future__ import annotations

import tensorflow as tf

from collectives.ops import ReduceOp as CoreOp

from . import convert, host
from .agreement import BatchAgreement, agree, signature
from .world import Workers, call_timeout

__all__ = ["gather_across_workers", "reduce_sparse"]


def reduce_sparse(workers: Workers, op: CoreOp, job, options,
                  agreement: BatchAgreement | None, device: str):
    """The replicas' IndexedSlices of ``job`` concatenated on ``device`` (and across workers),
    MEAN divided, placed on each of the job's destinations."""
    components = job.components
    index_dtypes = {c.indices.dtype for c in components}
    index_dtype = tf.int64 if len(index_dtypes) > 1 else index_dtypes.pop()
    with tf.device(device):
        values = tf.concat([c.values for c in components], axis=0)
        indices = tf.concat([tf.cast(c.indices, index_dtype) for c in components], axis=0)
        divisor = 1
        if workers.size > 1:
            values, indices = _gather_slices(workers, values, indices, options, device,
                                             agreement, _open_table(components[0]))
        if op is CoreOp.MEAN:
            divisor = len(components) * workers.size
        elif (workers.sum == "mean" and workers.size > 1
              and (values.dtype.is_floating or values.dtype.is_complex)):
            divisor = workers.size  # (as a dense total's: complex too)
        if divisor != 1:
            values = values / divisor
    result = tf.IndexedSlices(values, indices, components[0].dense_shape)
    return convert.mirrored([convert.place(result, d) for d in job.destinations])


def _open_table(slices: tf.IndexedSlices):
    """The ``dense_shape`` of ``slices`` where it is known only as the graph runs (None
    where it is known now, and the batch's agreement holds it: ``values.sparse_kind``)."""
    table = slices.dense_shape
    if table is None or tf.get_static_value(table) is not None:
        return None
    return tf.cast(table, tf.int64)


def _gather_slices(workers: Workers, values, indices, options, device,
                   agreement: BatchAgreement | None, table=None):
    """Every worker's slices, in worker order, in one host call. A table known only now
    (``table``) is agreed first: each worker's result takes its own table, and workers whose
    tables differed got results that differ (an index past the end of one's table), quietly."""
    timeout = call_timeout(options)
    np_values, np_indices = convert.numpy_dtype(values.dtype), convert.numpy_dtype(indices.dtype)

    def run(v, i, *known):
        with workers.lock:
            if agreement is not None:
                agree(workers.comm, agreement.signature(), timeout=timeout)
            for dims in known:
                kind = ("sparse", f"{v.dtype.name}/{i.dtype.name}", tuple(dims.tolist()))
                agree(workers.comm, signature({"call": "batch_reduce's IndexedSlices",
                                               "tensors": (kind,)}), timeout=timeout)
            return (convert.as_output(host.gather_ragged(workers.comm, v, 0, timeout=timeout),
                                      np_values),
                    convert.as_output(host.gather_ragged(workers.comm, i, 0, timeout=timeout),
                                      np_indices))

    shapes = [tf.TensorShape([None]).concatenate(values.shape[1:]), tf.TensorShape([None])]
    inputs = [values, indices] + ([] if table is None else [table])
    return convert.host_call(run, inputs, [values.dtype, indices.dtype], shapes,
                             device=device, name="collectives_gather_slices")


def gather_across_workers(workers: Workers, joined, axis: int, count: int, options,
                          device: str):
    """Every worker's ``joined`` (its ``count`` replicas concatenated along ``axis``) gathered
    along ``axis`` in worker order, in one host call on ``device``, after the workers agree."""
    timeout = call_timeout(options)
    np_dtype = convert.numpy_dtype(joined.dtype)

    def run(x):
        with workers.lock:
            dims = list(x.shape)
            dims[axis] = None  # the gathered axis may differ between workers
            agree(workers.comm, signature({"call": "gather", "devices": (count,), "axis": axis,
                                           "tensors": (("dense", x.dtype.name, tuple(dims)),)}),
                  timeout=timeout)
            return [convert.as_output(host.gather_ragged(workers.comm, x, axis, timeout=timeout),
                                      np_dtype)]

    shape = joined.shape
    if shape.rank is not None:
        dims = shape.as_list()
        dims[axis] = None
        shape = tf.TensorShape(dims)
    return convert.host_call(run, [joined], [joined.dtype], [shape], device=device,
                             name="collectives_gather")[0]
