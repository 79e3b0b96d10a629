"""What every cross-device-ops class of the adapter shares: one host call per batch.

A ``batch_reduce`` becomes one host call (one ``tf.numpy_function`` inside ``tf.function``)
that reduces every tensor of the batch through the core with the class's route (algorithm or
spec, packing, groups), and whose results are placed on each destination device. One
destination device gives a plain tensor, several a ``Mirrored`` in destination order, as in
TensorFlow. With a communicator, the local totals are then reduced across worker processes,
after the workers agree on the whole batch (``agreement``). Floating values on GPUs take the
device path instead (``device_path``: CuPy on the tensors' own memory, no host copies).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import collective_util, device_util
from tensorflow.python.distribute import cross_device_ops as tf_cdo

from collectives.compression import for_batch, requested, wire_name
from collectives.hints import Compression
from collectives.ops import ReduceOp as CoreOp
from collectives.runtime.refusals import BAD_INPUT

from . import concat, convert, device_path, host, marks
from .agreement import BatchAgreement, agree
from .host import Packing
from .routes import Route
from .values import check_reduce_op, check_replicas, components_of, is_sparse, sparse_kind, static_dims
from .world import Workers, call_timeout, open_communicator

__all__ = ["LibraryCrossDeviceOps", "Route"]

# what TensorFlow's and the adapter's argument checks raise (a shape error while tracing,
# or from an eager op, is TensorFlow's InvalidArgumentError)
_BAD_INPUT = (*BAD_INPUT, tf.errors.InvalidArgumentError)


def _devices_match(left: Sequence[str], right: Sequence[str]) -> bool:
    # TensorFlow compares device sets (order and repeats ignored).
    def canonical(devices):
        return {device_util.canonicalize(d) if d else d for d in devices}

    return canonical(left) == canonical(right)


@dataclass
class _Job:
    index: int  # position of the pair in the batch
    components: tuple
    destinations: tuple[str, ...]
    route: Route | None  # None: accumulation_fn in TF ops
    matches: bool = False  # the value's devices are its destinations
    kit: Any = None  # the device path's kit (kits), or None for the host path


class LibraryCrossDeviceOps(tf.distribute.CrossDeviceOps):
    """The machinery every public class shares; subclasses choose the route of each value
    (``route_for``).

    Attributes
    ----------
    route : Route
        The route of a dense value unless ``route_for`` says otherwise.
    workers : Workers
        What the paths that reduce across worker processes share (``world.Workers``).
    """

    def __init__(self, *, route: Route = Route(),  # noqa: B008 - a frozen dataclass
                 communicator=None, workers_sum: str = "mean",
                 reduce_to_device: str | None = None, accumulation_fn: Callable | None = None,
                 compression: Compression = None):
        super().__init__()  # sets _canonicalize_devices, which the base class reads
        if workers_sum not in ("mean", "sum"):
            raise ValueError(f"workers_sum={workers_sum!r} must be 'mean' or 'sum'")
        for_batch(compression, CoreOp.SUM, [])  # a bad name, or bf16 without ml_dtypes: now
        self.route = route
        # (by its wire type: workers that spell it "fp16" and "half" agree)
        self.workers = Workers(open_communicator(communicator), workers_sum,
                               wire_name(compression)
                               if isinstance(compression, str) and requested(compression)
                               else None)
        self.reduce_to_device = reduce_to_device
        self.accumulation_fn = accumulation_fn
        self._device_kit = None  # a kit for every device (kits.NUMPY: the device path on CPUs)

    # --- what TensorFlow's base class asks ----------------------------------------------

    @property
    def _num_between_graph_workers(self) -> int:
        # More than 1 turns off the base class's "one value: identity" shortcuts, which
        # would skip the reduction across processes.
        return self.num_workers

    @property
    def communicator(self):
        """The ``Communicator`` across worker processes, or None in a single process."""
        return self.workers.comm

    @property
    def num_workers(self) -> int:
        """How many worker processes reduce together (1 without a communicator)."""
        return self.workers.size

    @property
    def worker_rank(self) -> int:
        """This worker's rank among them, from 0 (0 without a communicator)."""
        return self.workers.rank

    def __deepcopy__(self, memo):
        # Strategies get deep-copied (distribute coordinator, Keras cloning); the copy must
        # keep talking through the same communicator and lock.
        clone = copy.copy(self)
        memo[id(self)] = clone
        return clone

    # TensorFlow's entry points: what its checks and ours find on this worker alone is refused
    # to the other workers (``Workers.refused_to_peers``)
    def reduce(self, reduce_op, per_replica_value, destinations, options=None):
        with self.workers.refused_to_peers("reduce", _BAD_INPUT):
            return super().reduce(reduce_op, per_replica_value, destinations, options)

    def batch_reduce(self, reduce_op, value_destination_pairs, options=None):
        """TensorFlow's ``batch_reduce``; an empty batch returns ``[]`` (TF raises IndexError),
        agreed across workers as any batch (``Workers.agree_on_empty``)."""
        with self.workers.refused_to_peers("batch_reduce", _BAD_INPUT):
            pairs = list(value_destination_pairs)
            if pairs:
                return super().batch_reduce(reduce_op, pairs, options)
            timeout = call_timeout(options)
            self.workers.agree_on_empty(check_reduce_op(reduce_op), timeout)
            return []

    def _gather(self, per_replica_value, destinations, axis, options=None):
        with self.workers.refused_to_peers("gather", _BAD_INPUT):
            return super()._gather(per_replica_value, destinations, axis, options)

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        return self._reduce_pairs(reduce_op, [(per_replica_value, destinations)], options,
                                  names=["per_replica_value"])[0]

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        pairs = list(value_destination_pairs)
        return self._reduce_pairs(reduce_op, pairs, options,
                                  names=[f"value_destination_pairs[{i}]" for i in range(len(pairs))])

    def broadcast_implementation(self, tensor, destinations):
        # TensorFlow's simple broadcast: a copy on each destination device (no data moves
        # between logical CPU devices). It stays within the process: initial weights across
        # workers go through broadcast_variables.
        devices = tf_cdo.get_devices_from(destinations, self._canonicalize_devices)
        return convert.mirrored([convert.place(tensor, d) for d in devices])

    def _gather_implementation(self, per_replica_value, destinations, axis, options):
        components = components_of(per_replica_value)
        devices = tuple(tf_cdo.get_devices_from(destinations, self._canonicalize_devices))
        with tf.device(self.reduce_to_device or devices[0]):
            joined = tf.concat(list(components), axis=axis)
        if self.num_workers > 1:
            joined = concat.gather_across_workers(self.workers, joined, axis, len(components),
                                                  options, self.reduce_to_device or devices[0])
        return convert.mirrored([convert.place(joined, d) for d in devices])

    # --- routing: the hook subclasses override ---------------------------------------------

    def route_for(self, value_devices: tuple[str, ...], destinations: tuple[str, ...],
                  matches: bool) -> Route:
        """The route of a dense value whose replicas are on ``value_devices`` and whose
        results go to ``destinations`` (``matches``: those are the same devices); by default
        ``self.route``. Every worker must answer alike for the same value."""
        return self.route

    # --- the work -------------------------------------------------------------------------

    def _reduce_pairs(self, reduce_op, pairs, options, names):
        op = check_reduce_op(reduce_op)
        options = options if options is not None else collective_util.Options()
        packing_override = (Packing(bytes_per_pack=options.bytes_per_pack)
                            if options.bytes_per_pack else None)
        results: list = [None] * len(pairs)
        dense: list[_Job] = []
        sparse: list[_Job] = []
        for i, (value, destinations) in enumerate(pairs):
            # A Mirrored value is reduced like any other (its copies may have diverged), as by
            # TensorFlow's cross-device ops; only the strategy's reduce_to skips MEAN of one.
            components = components_of(value)
            devices = tuple(tf_cdo.get_devices_from(destinations, self._canonicalize_devices))
            value_devices = tuple(c.device for c in components)
            # `value is destinations` is TF's test for graph values whose devices are unset.
            matches = value is destinations or _devices_match(value_devices, devices)
            if is_sparse(components):
                sparse.append(_Job(i, components, devices, None))
                continue
            # A mix of IndexedSlices and dense tensors is reduced dense, as in TensorFlow.
            components = tuple(tf.convert_to_tensor(c) for c in components)
            check_replicas(components, names[i])
            route = (None if self.accumulation_fn is not None
                     else self.route_for(value_devices, devices, matches))
            kit = None if route is None else device_path.kit_for(components, self._device_kit)
            dense.append(_Job(i, components, devices, route, matches, kit))
        agreement = (self._describe(op, dense, sparse, packing_override)
                     if self.num_workers > 1 else None)
        if dense and self._reduce_dense(op, dense, options, packing_override, results, agreement):
            agreement = None  # the dense host call agreed for the whole batch
        for job in sparse:
            results[job.index] = concat.reduce_sparse(
                self.workers, op, job, options, agreement,
                self.reduce_to_device or job.destinations[0])
            agreement = None
        return results

    def _describe(self, op: CoreOp, dense: list[_Job], sparse: list[_Job],
                  packing_override) -> BatchAgreement:
        """What the workers agree on before the batch's data moves: every pair, in order."""
        entries: dict[int, tuple] = {}  # pair -> (devices, route, tensors)
        for job in sparse:
            entries[job.index] = (len(job.components), None, sparse_kind(job.components[0]))
        for job in dense:
            first = job.components[0]
            route = None if job.route is None else job.route.key(packing_override)
            if job.kit is not None:  # the device path makes other calls than the host path
                assert route is not None  # (only a job with a route has a kit)
                route = (*route, "device")
            entries[job.index] = (len(job.components), route,
                                  ("dense", first.dtype.name, static_dims(first.shape)))
        devices, routes, tensors = zip(*(entries[i] for i in sorted(entries)))
        return BatchAgreement({"call": "batch_reduce", "op": op.name,
                               "workers_sum": self.workers.sum,
                               "compression": self.workers.compression, "devices": devices,
                               "route": routes, "tensors": tensors})

    def _reduce_dense(self, op: CoreOp, jobs: list[_Job], options, packing_override,
                      results: list, agreement: BatchAgreement | None) -> bool:
        """Reduce the dense values (floating values on GPUs through ``device_path``, the rest
        in one host call); True when a call was made (the first holds the agreement)."""
        for job in [j for j in jobs if j.route is None]:
            results[job.index] = self._accumulate_in_tf(op, job)
        on_device = [j for j in jobs if j.route is not None and j.kit is not None]
        for kit in dict.fromkeys(j.kit for j in on_device):
            device_path.reduce_dense(self, op, [j for j in on_device if j.kit is kit], options,
                                     packing_override, results, agreement)
            agreement = None  # the first call agreed for the whole batch
        jobs = [j for j in jobs if j.route is not None and j.kit is None]
        if not jobs:
            return bool(on_device)
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
        timeout = call_timeout(options)

        def run(*arrays):
            per_job, at = [], 0
            for count in counts:
                per_job.append(arrays[at:at + count])
                at += count
            outs: list = [None] * len(jobs)
            with self.workers.lock:
                if agreement is not None:
                    shapes = {job.index: np.shape(a[0]) for job, a in zip(jobs, per_job)}
                    agree(self.workers.comm, agreement.signature(shapes), timeout=timeout)
                for (route, _count), members in batches.items():
                    reduced = self._host_reduce(route, [per_job[k] for k in members], op,
                                                packing_override, timeout)
                    for k, r in zip(members, reduced):
                        outs[k] = convert.as_output(r, out_np[k], empty=convert.POOL.empty)
            return outs

        device = self.reduce_to_device or jobs[0].destinations[0]
        outputs = convert.host_call(marks.batch(run, self, op, jobs, "host"), inputs, out_dtypes,
                                    out_shapes, device=device,
                                    name="collectives_batch_reduce")
        placed = convert.place_all(
            (out, job.destinations,
             # The host call's output already sits on the first destination (unless the
             # destinations repeat a device, which needs distinct tensors): no identity there.
             bool(job.destinations[0]) and out.device == job.destinations[0]
             and job.destinations[0] not in job.destinations[1:])
            for job, out in zip(jobs, outputs))
        for job, per_device in zip(jobs, placed):
            results[job.index] = convert.mirrored(per_device)
        return True

    def _host_reduce(self, route: Route, values, op: CoreOp, packing_override, timeout):
        packing = packing_override or route.packing
        if self.num_workers > 1:
            workers = self.workers
            return host.reduce_batch_across_workers(values, op, list(route.spec), workers.comm,
                                                    packing=packing, workers_sum=workers.sum,
                                                    timeout=timeout, empty=convert.POOL.empty,
                                                    compression=workers.compression, agreed=True)
        return host.reduce_batch(values, op, list(route.spec), packing=packing,
                                 groups=route.groups, empty=convert.POOL.empty)

    def _accumulate_in_tf(self, op: CoreOp, job: _Job):
        # TensorFlow's ReductionToOneDevice with a user accumulation_fn: it takes tensors.
        assert self.accumulation_fn is not None  # (the jobs without a route are its)
        with tf.device(self.reduce_to_device or job.destinations[0]):
            total = self.accumulation_fn(list(job.components))
            if op is CoreOp.MEAN:
                total = total / len(job.components)
        return convert.mirrored([convert.place(total, d) for d in job.destinations])
