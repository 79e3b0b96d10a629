"""TensorFlow values coming in: their per-replica components, and the checks TensorFlow makes."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops as tf_cdo
from tensorflow.python.distribute import values as values_lib

from collectives.ops import ReduceOp as CoreOp

__all__ = ["ReplicaDtypeError", "ReplicaShapeError", "check_reduce_op", "check_replicas",
           "components_of", "is_sparse", "sparse_kind", "static_dims"]


# Raised as ``Error(None, None, message)``: TensorFlow's error signature, which autograph needs
# to re-raise the error with its own type from inside a ``tf.function``.
class ReplicaDtypeError(tf.errors.InvalidArgumentError, TypeError):
    """Replicas of one value have different dtypes: TensorFlow's ``InvalidArgumentError`` (what
    it raises eagerly), and a ``TypeError`` (what it raises while tracing a ``tf.function``)."""


class ReplicaShapeError(tf.errors.InvalidArgumentError, ValueError):
    """Replicas of one value have different shapes: ``InvalidArgumentError`` and ``ValueError``."""


def check_reduce_op(reduce_op) -> CoreOp:
    # CrossDeviceOps take the enum only; the strategy layer is what upper-cases strings.
    if reduce_op is tf.distribute.ReduceOp.SUM:
        return CoreOp.SUM
    if reduce_op is tf.distribute.ReduceOp.MEAN:
        return CoreOp.MEAN
    raise ValueError("`reduce_op` must be Reduce.SUM or Reduce.MEAN.")


def components_of(value) -> tuple:
    if not isinstance(value, values_lib.DistributedValues):
        value = tf_cdo._make_tensor_into_per_replica(value)  # TF's own conversion
    components = tuple(value.values)
    if not components:
        raise ValueError("`per_replica_value` must be non-empty")
    return components


def check_replicas(components: Sequence, name: str) -> None:
    """Every replica of a dense value has one dtype, a number's, and (as far as known) one
    shape; raised while tracing, as TensorFlow's ``add_n`` does, rather than at the first
    step."""
    # Each .dtype / .shape of an eager tensor asks TensorFlow anew: read them once.
    dtype, shape = components[0].dtype, components[0].shape
    if not (dtype.is_floating or dtype.is_integer or dtype.is_complex) or dtype.is_quantized:
        # (bool and strings: the core's message named its own argument and offered MAX, which
        # cross-device ops cannot ask for; in tf.function it came at the first step)
        raise TypeError(f"{name} holds {dtype.name} tensors, which cross-device ops cannot sum "
                        "or average (nor can TensorFlow's); cast them to a number first, e.g. "
                        "tf.cast(value, tf.int32)")
    for i, c in enumerate(components[1:], 1):
        if c.dtype != dtype:
            raise ReplicaDtypeError(
                None, None, f"{name}: replica {i} (on {c.device or 'an unplaced device'}) is "
                f"{c.dtype.name} but replica 0 is {dtype.name}; every replica must hold a "
                "tensor of the same dtype")
        other = c.shape
        if other != shape and not other.is_compatible_with(shape):
            raise ReplicaShapeError(
                None, None, f"{name}: replica {i} (on {c.device or 'an unplaced device'}) has shape "
                f"{other} but replica 0 has {shape}; every replica must hold a tensor of the "
                "same shape")


def is_sparse(components: Sequence) -> bool:
    return all(isinstance(c, tf.IndexedSlices) for c in components)


def static_dims(shape: tf.TensorShape) -> tuple | None:
    return None if shape.rank is None else tuple(shape.as_list())


def sparse_kind(slices: tf.IndexedSlices) -> tuple:
    """What the workers agree on about an ``IndexedSlices`` value: its dtypes, and its table's
    shape where it is known (each worker's result takes its own ``dense_shape``: workers whose
    tables differed got results that differ), else its rows' shape (their count may differ).
    A table known only as the graph runs is agreed then (``concat``): its kind says so, so
    that every worker makes that agreement or none does."""
    table = None if slices.dense_shape is None else tf.get_static_value(slices.dense_shape)
    shape = (tuple(int(d) for d in table) if table is not None else
             (None,) + (static_dims(slices.values.shape[1:]) or ()))
    late = slices.dense_shape is not None and table is None
    return ("sparse (table at run time)" if late else "sparse",
            f"{slices.values.dtype.name}/{slices.indices.dtype.name}", shape)
