"""The library as ``tf.distribute`` cross-device ops: drop-in classes for ``MirroredStrategy``.

Every class here subclasses ``tf.distribute.CrossDeviceOps`` and runs its reductions through
the core (``collectives``): a ``batch_reduce`` becomes one host call (one ``tf.numpy_function``
inside ``tf.function``) that reduces every tensor of the batch with the class's algorithm or
spec and packing, and whose results are placed on each destination device. One destination
device gives a plain tensor, several a ``Mirrored`` in destination order, as in TensorFlow.

TensorFlow's semantics are kept (MEAN divisors, IndexedSlices as the concatenation of the
replicas' slices, the errors for bad arguments), except where TensorFlow has a known bug; see
``docs/tensorflow.md`` for the list of differences.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import collective_util, device_util, distribute_utils
from tensorflow.python.distribute import cross_device_ops as tf_cdo
from tensorflow.python.distribute import values as values_lib

from collectives.ops import ReduceOp as CoreOp
from collectives.registry import load_backend
from collectives.spec import SpecRange, parse_spec
from collectives.validate import check_shards

from . import convert, host
from .host import Packing

__all__ = [
    "AllReduceCrossDeviceOps",
    "CrossDeviceOps",
    "HierarchicalCopyAllReduce",
    "NcclAllReduce",
    "ReductionToOneDevice",
]

logger = logging.getLogger("collectives.adapters.tensorflow")
_LOGGED: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.warning(message)


@dataclass(frozen=True)
class Route:
    """How one group of values is reduced: spec ranges (with shards), packing, groups."""

    spec: tuple[SpecRange, ...] = (SpecRange("auto", 1, -1),)
    packing: Packing = Packing()
    groups: Any = None  # a group size, a partition, or a callable n -> groups


ONE_DEVICE = Route((SpecRange("one_device", 1, -1),))


def _check_reduce_op(reduce_op) -> CoreOp:
    # CrossDeviceOps take the enum only; the strategy layer is what upper-cases strings.
    if reduce_op is tf.distribute.ReduceOp.SUM:
        return CoreOp.SUM
    if reduce_op is tf.distribute.ReduceOp.MEAN:
        return CoreOp.MEAN
    raise ValueError("`reduce_op` must be Reduce.SUM or Reduce.MEAN.")


def _components(value) -> tuple:
    if not isinstance(value, values_lib.DistributedValues):
        value = tf_cdo._make_tensor_into_per_replica(value)  # TF's own conversion
    components = tuple(value.values)
    if not components:
        raise ValueError("`per_replica_value` must be non-empty")
    return components


def _is_sparse(components: Sequence) -> bool:
    return all(isinstance(c, tf.IndexedSlices) for c in components)


@dataclass
class _Job:
    index: int  # position of the pair in the batch
    components: tuple
    destinations: tuple[str, ...]
    route: Route | None  # None: accumulation_fn in TF ops


class _Library(tf.distribute.CrossDeviceOps):
    """The machinery every public class shares; subclasses choose the route of each value."""

    def __init__(self, *, route: Route = Route(), communicator=None, workers_sum: str = "mean",
                 reduce_to_device: str | None = None, accumulation_fn: Callable | None = None):
        super().__init__()  # sets _canonicalize_devices, which the base class reads
        if workers_sum not in ("mean", "sum"):
            raise ValueError(f"workers_sum={workers_sum!r} must be 'mean' or 'sum'")
        self._route = route
        self._comm = communicator
        self._workers_sum = workers_sum
        self.reduce_to_device = reduce_to_device
        self.accumulation_fn = accumulation_fn
        # One batch at a time per process: collectives between processes must not interleave.
        self._lock = threading.Lock()
        self._checked_devices: set[int] = set()

    # --- what TensorFlow's base class asks ----------------------------------------------

    @property
    def _num_between_graph_workers(self) -> int:
        # More than 1 turns off the base class's "one value: identity" shortcuts, which
        # would skip the reduction across processes.
        return self._comm.size if self._comm is not None else 1

    @property
    def communicator(self):
        """The ``Communicator`` across worker processes, or None in a single process."""
        return self._comm

    def __deepcopy__(self, memo):
        # Strategies get deep-copied (distribute coordinator, Keras cloning); the copy must
        # keep talking through the same communicator and lock.
        clone = copy.copy(self)
        memo[id(self)] = clone
        return clone

    def batch_reduce(self, reduce_op, value_destination_pairs, options=None):
        """TensorFlow's ``batch_reduce``; an empty batch returns ``[]`` (TF raises IndexError)."""
        pairs = list(value_destination_pairs)
        if not pairs:
            return []
        return super().batch_reduce(reduce_op, pairs, options)

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        return self._reduce_pairs(reduce_op, [(per_replica_value, destinations)], options)[0]

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        return self._reduce_pairs(reduce_op, list(value_destination_pairs), options)

    def broadcast_implementation(self, tensor, destinations):
        # TensorFlow's simple broadcast: a copy on each destination device (no data moves
        # between logical CPU devices). It stays within the process: initial weights across
        # workers go through broadcast_variables.
        devices = tf_cdo.get_devices_from(destinations, self._canonicalize_devices)
        return convert.mirrored([convert.place(tensor, d) for d in devices])

    def _gather_implementation(self, per_replica_value, destinations, axis, options):
        components = _components(per_replica_value)
        devices = tuple(tf_cdo.get_devices_from(destinations, self._canonicalize_devices))
        with tf.device(self.reduce_to_device or devices[0]):
            joined = tf.concat(list(components), axis=axis)
        if self._workers() > 1:
            joined = self._gather_across_workers(joined, axis, options,
                                                 self.reduce_to_device or devices[0])
        return convert.mirrored([convert.place(joined, d) for d in devices])

    # --- routing: subclasses override ---------------------------------------------------

    def _route_for(self, value_devices: tuple[str, ...], destinations: tuple[str, ...],
                   matches: bool) -> Route:
        """The route of a dense value; ``matches``: its devices are its destinations."""
        return self._route

    # --- the work -------------------------------------------------------------------------

    def _workers(self) -> int:
        return self._comm.size if self._comm is not None else 1

    def _reduce_pairs(self, reduce_op, pairs, options):
        op = _check_reduce_op(reduce_op)
        options = options if options is not None else collective_util.Options()
        results: list = [None] * len(pairs)
        dense: list[_Job] = []
        sparse: list[_Job] = []
        for i, (value, destinations) in enumerate(pairs):
            components = _components(value)
            devices = tuple(tf_cdo.get_devices_from(destinations, self._canonicalize_devices))
            if op is CoreOp.MEAN and distribute_utils.is_mirrored(value):
                # The mean of identical copies is the value itself (and exactly so).
                results[i] = self._place_mirrored(value, devices)
                continue
            value_devices = tuple(c.device for c in components)
            # `value is destinations` is TF's test for graph values whose devices are unset.
            matches = value is destinations or _devices_match(value_devices, devices)
            if _is_sparse(components):
                sparse.append(_Job(i, components, devices, None))
                continue
            # A mix of IndexedSlices and dense tensors is reduced dense, as in TensorFlow.
            components = tuple(tf.convert_to_tensor(c) for c in components)
            route = (None if self.accumulation_fn is not None
                     else self._route_for(value_devices, devices, matches))
            dense.append(_Job(i, components, devices, route))
        if dense:
            self._reduce_dense(op, dense, options, results)
        for job in sparse:
            results[job.index] = self._reduce_sparse(op, job, options)
        return results

    def _place_mirrored(self, value, devices):
        by_device = {c.device: c for c in value.values}
        primary = value.values[0]
        return convert.mirrored([convert.place(by_device.get(d, primary), d) for d in devices])

    def _reduce_dense(self, op: CoreOp, jobs: list[_Job], options, results: list) -> None:
        by_fn = [j for j in jobs if j.route is None]
        for job in by_fn:
            results[job.index] = self._accumulate_in_tf(op, job)
        jobs = [j for j in jobs if j.route is not None]
        if not jobs:
            return
        in_dtypes = [job.components[0].dtype for job in jobs]
        out_dtypes = [convert.mean_dtype(d) if op is CoreOp.MEAN else d for d in in_dtypes]
        out_np = [convert.numpy_dtype(d) for d in out_dtypes]
        out_shapes = [job.components[0].shape for job in jobs]
        counts = [len(job.components) for job in jobs]
        # Tensors with the same route and device count are reduced as one core batch.
        batches: dict[tuple, list[int]] = {}
        for k, job in enumerate(jobs):
            batches.setdefault((job.route, counts[k]), []).append(k)
        inputs = [c for job in jobs for c in job.components]
        packing_override = (Packing(bytes_per_pack=options.bytes_per_pack)
                            if options.bytes_per_pack else None)
        timeout = options.timeout_seconds

        def run(*arrays):
            per_job, at = [], 0
            for count in counts:
                per_job.append(arrays[at:at + count])
                at += count
            outs: list = [None] * len(jobs)
            with self._lock:
                for (route, _count), members in batches.items():
                    reduced = self._host_reduce(route, [per_job[k] for k in members], op,
                                                packing_override, timeout)
                    for k, r in zip(members, reduced):
                        outs[k] = convert.as_output(r, out_np[k], empty=convert.POOL.empty)
            return outs

        device = self.reduce_to_device or jobs[0].destinations[0]
        outputs = convert.host_call(run, inputs, out_dtypes, out_shapes, device=device,
                                    name="collectives_batch_reduce")
        for job, out in zip(jobs, outputs):
            # The host call's output already sits on the first destination (unless the
            # destinations repeat a device, which needs distinct tensors): no identity there.
            first, rest = job.destinations[0], job.destinations[1:]
            head = out if first and out.device == first and first not in rest else \
                convert.place(out, first)
            results[job.index] = convert.mirrored([head] + [convert.place(out, d) for d in rest])

    def _host_reduce(self, route: Route, values, op: CoreOp, packing_override, timeout):
        packing = packing_override or route.packing
        if self._workers() > 1:
            self._check_device_count(len(values[0]), timeout)
            return host.reduce_batch_across_workers(values, op, list(route.spec), self._comm,
                                                    packing=packing,
                                                    workers_sum=self._workers_sum,
                                                    timeout=timeout, empty=convert.POOL.empty)
        return host.reduce_batch(values, op, list(route.spec), packing=packing,
                                 groups=route.groups, empty=convert.POOL.empty)

    def _check_device_count(self, n: int, timeout) -> None:
        # MEAN divides by workers x local devices: every worker must bring as many devices.
        if n in self._checked_devices:
            return
        counts = self._comm.all_gather(np.array([n], np.int64), timeout=timeout)
        if len(set(counts.tolist())) > 1:
            raise ValueError(f"workers hold different numbers of devices ({counts.tolist()}, by "
                             "rank); every worker must run the same number of replicas")
        self._checked_devices.add(n)

    def _accumulate_in_tf(self, op: CoreOp, job: _Job):
        # TensorFlow's ReductionToOneDevice with a user accumulation_fn: it takes tensors.
        with tf.device(self.reduce_to_device or job.destinations[0]):
            total = self.accumulation_fn(list(job.components))
            if op is CoreOp.MEAN:
                total = total / len(job.components)
        return convert.mirrored([convert.place(total, d) for d in job.destinations])

    def _reduce_sparse(self, op: CoreOp, job: _Job, options):
        components = job.components
        index_dtypes = {c.indices.dtype for c in components}
        index_dtype = tf.int64 if len(index_dtypes) > 1 else index_dtypes.pop()
        with tf.device(self.reduce_to_device or job.destinations[0]):
            values = tf.concat([c.values for c in components], axis=0)
            indices = tf.concat([tf.cast(c.indices, index_dtype) for c in components], axis=0)
            divisor = 1
            workers = self._workers()
            if workers > 1:
                values, indices = self._gather_slices(
                    values, indices, options, self.reduce_to_device or job.destinations[0])
            if op is CoreOp.MEAN:
                divisor = len(components) * workers
            elif self._workers_sum == "mean" and workers > 1 and values.dtype.is_floating:
                divisor = workers
            if divisor != 1:
                values = values / divisor
        result = tf.IndexedSlices(values, indices, components[0].dense_shape)
        return convert.mirrored([convert.place(result, d) for d in job.destinations])

    def _gather_slices(self, values, indices, options, device):
        timeout = options.timeout_seconds
        np_values, np_indices = convert.numpy_dtype(values.dtype), convert.numpy_dtype(indices.dtype)

        def run(v, i):
            with self._lock:
                return (convert.as_output(host.gather_ragged(self._comm, v, 0, timeout=timeout),
                                          np_values),
                        convert.as_output(host.gather_ragged(self._comm, i, 0, timeout=timeout),
                                          np_indices))

        shapes = [tf.TensorShape([None]).concatenate(values.shape[1:]), tf.TensorShape([None])]
        return convert.host_call(run, [values, indices], [values.dtype, indices.dtype], shapes,
                                 device=device, name="collectives_gather_slices")

    def _gather_across_workers(self, joined, axis, options, device):
        timeout = options.timeout_seconds
        np_dtype = convert.numpy_dtype(joined.dtype)

        def run(x):
            with self._lock:
                return [convert.as_output(host.gather_ragged(self._comm, x, axis, timeout=timeout),
                                          np_dtype)]

        shape = joined.shape
        if shape.rank is not None:
            dims = shape.as_list()
            dims[axis] = None
            shape = tf.TensorShape(dims)
        return convert.host_call(run, [joined], [joined.dtype], [shape], device=device,
                                 name="collectives_gather")[0]


def _halves(n: int):
    """Hierarchical copy's two groups, the second one taking the odd device."""
    if n < 2:
        return None
    h = n // 2
    return (tuple(range(h)), tuple(range(h, n)))


def _devices_match(left: Sequence[str], right: Sequence[str]) -> bool:
    # TensorFlow compares device sets (order and repeats ignored).
    def canonical(devices):
        return {device_util.canonicalize(d) if d else d for d in devices}

    return canonical(left) == canonical(right)


class ReductionToOneDevice(_Library):
    """TensorFlow's ``ReductionToOneDevice``: reduce on one device, then copy to each destination.

    The reduction runs on ``reduce_to_device`` (default: the first destination device).
    ``accumulation_fn`` (e.g. ``tf.math.add_n``) is called with the list of per-device tensors
    and must return their sum, in TensorFlow ops; without it the library's ``one_device``
    algorithm sums them (the same left-to-right n-ary sum as ``tf.math.add_n``). MEAN divides by
    the number of values.
    """

    def __init__(self, reduce_to_device: str | None = None,
                 accumulation_fn: Callable | None = None):
        super().__init__(route=ONE_DEVICE, reduce_to_device=reduce_to_device,
                         accumulation_fn=accumulation_fn)


def nccl_unavailable(devices: Sequence[str]) -> str | None:
    """Why NCCL cannot run over ``devices`` here, or None when it can."""
    if not devices or any("gpu" not in d.lower() for d in devices):
        return f"the devices are not all GPUs ({', '.join(d or '<unplaced>' for d in devices)})"
    try:
        load_backend("nccl")
    except ValueError:
        return "the library's NCCL transport (collectives.backends.nccl) is not installed"
    return None


class AllReduceCrossDeviceOps(_Library):
    """TensorFlow's ``AllReduceCrossDeviceOps``: NCCL (``"nccl"``) or hierarchical copy (any other).

    Like TensorFlow it does not validate its arguments: any ``all_reduce_alg`` other than
    ``"nccl"`` means hierarchical copy, and a negative ``num_packs`` means no packing. A value
    whose destinations are not its own devices is reduced as by ``ReductionToOneDevice``.
    """

    def __init__(self, all_reduce_alg: str = "nccl", num_packs: int = 1):
        self._all_reduce_alg = all_reduce_alg
        self._num_packs = num_packs
        packing = Packing(num_packs=max(int(num_packs), 0))
        if all_reduce_alg == "nccl":
            route = Route((SpecRange("nccl", 1, -1),), packing)
        else:
            # TF's hierarchical copy: sum each half of the devices on one of its devices, add
            # the two totals, copy back. Here an odd device joins the second half instead of
            # being dropped.
            route = Route((SpecRange("one_device/one_device", 1, -1),), packing, groups=_halves)
        super().__init__(route=route)

    def _route_for(self, value_devices, destinations, matches):
        if not matches:
            return ONE_DEVICE  # not an all-reduce: TensorFlow reduces to one device
        if self._all_reduce_alg == "nccl":
            reason = nccl_unavailable(value_devices)
            if reason is not None:
                _log_once(f"NcclAllReduce falls back to ReductionToOneDevice because {reason}.")
                return ONE_DEVICE
        return self._route


class NcclAllReduce(AllReduceCrossDeviceOps):
    """TensorFlow's ``NcclAllReduce``; without GPUs and NCCL it falls back to
    ``ReductionToOneDevice`` (and logs once why)."""

    def __init__(self, num_packs: int = 1):
        if num_packs < 0:
            raise ValueError(f"NCCL all-reduce requires num_packs >= 0, but {num_packs} is specified")
        super().__init__(all_reduce_alg="nccl", num_packs=num_packs)


class HierarchicalCopyAllReduce(AllReduceCrossDeviceOps):
    """TensorFlow's ``HierarchicalCopyAllReduce``, correct for odd device counts too."""

    def __init__(self, num_packs: int = 1):
        if num_packs < 0:
            raise ValueError(f"HierarchicalCopy requires num_packs >= 0, but {num_packs} is specified")
        super().__init__(all_reduce_alg="hierarchical_copy", num_packs=num_packs)


class CrossDeviceOps(_Library):
    """Every algorithm and spec of the core as cross-device ops.

    ``algorithm``: a name (``"auto"``, ``"ring"``, ``"rechd"``, ``"tree"``, ``"shuffle"``,
    ``"one_device"``, TensorFlow's ``"xring"``, ``"pscpu"``, ``"nccl"``, ...), a two-level
    ``"A/B"`` (with ``groups``), or a spec: ``(alg, shards, limit)`` tuples or a string like
    ``"pscpu:2k:pscpu#2:64k:xring"`` (limits in elements). ``num_packs``,
    ``agg_small_grads_max_bytes``/``agg_small_grads_max_group`` and ``bytes_per_pack`` pack a
    batch's tensors into few buffers (``CommunicationOptions.bytes_per_pack`` overrides them).
    ``communicator``: a ``collectives.Communicator`` to reduce across worker processes as well
    (see ``MultiWorkerAllReduce``), or None for one process.
    """

    def __init__(self, algorithm="auto", *, num_packs: int = 0, agg_small_grads_max_bytes: int = 0,
                 agg_small_grads_max_group: int = 10, bytes_per_pack: int | None = None,
                 shards: int = 0, groups=None, communicator=None, workers_sum: str = "mean"):
        packing = Packing(num_packs, agg_small_grads_max_bytes, agg_small_grads_max_group,
                          bytes_per_pack)
        host.check_packing(packing)  # errors now, not at the first step
        self.algorithm = algorithm
        super().__init__(route=Route(spec_ranges(algorithm, shards), packing,
                                     groups=_hashable_groups(groups)),
                         communicator=communicator, workers_sum=workers_sum)


def spec_ranges(spec, shards: int = 0) -> tuple[SpecRange, ...]:
    """A checked, hashable spec; ``shards`` replaces the shards of a plain algorithm name."""
    ranges = parse_spec(spec)
    check_shards(shards)
    if shards:
        if not (isinstance(spec, str) and ":" not in spec and "#" not in spec):
            raise ValueError(f"shards={shards} conflicts with the all-reduce spec {spec!r}, "
                             "which sets its own shards; put them in the spec (e.g. 'xring#2')")
        ranges = [ranges[0]._replace(shards=int(shards))]
    return tuple(ranges)


def _hashable_groups(groups):
    if isinstance(groups, (list, tuple)):
        return tuple(tuple(g) for g in groups)
    return groups
