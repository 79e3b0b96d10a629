"""The adapter's device path against TensorFlow's own results (suite ``device`` of run.py, and
``gpu.py`` on GPUs).

The device path reduces values in the arrays of a kit on the tensors' own memory, through
``tf.py_function`` ops inside ``tf.function``. On GPUs the adapter takes it by itself (CuPy);
on this suite's logical CPUs it takes it with the NumPy kit (``kits.NUMPY``, the core's NumPy
backend), so everything but CuPy and DLPack's GPU side runs on any machine: TensorFlow's
fixtures for a dozen classes (``fixtures``), the ops each call becomes in a graph, shapes
unknown while tracing (and empty at a step), replica-context ``all_reduce``, Keras ``fit``, and
two workers (threads) reducing across a ``Communicator``.
"""

from __future__ import annotations

import fixtures
import keras_fit
import numpy as np
import tensorflow as tf
from collectives.adapters import tensorflow as ctf
from common import per_replica
from tensorflow.python.distribute import values as values_lib

import collectives

SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN

CLASSES = ["ReductionToOneDevice", "ReductionToOneDevice(reduce_to_device=last)", "NcclAllReduce",
           "NcclAllReduce(num_packs=2)", "HierarchicalCopyAllReduce",
           "AllReduceCrossDeviceOps('ring', 2)", "MultiWorkerAllReduce",
           "MultiWorkerAllReduce('nccl/xring', shards 2)", "CrossDeviceOps('nccl')",
           "CrossDeviceOps('ring/tree', groups=2)",
           "CrossDeviceOps('pscpu:2k:pscpu#2:64k:xring', num_packs=2)",
           "CrossDeviceOps('rechd', agg_small_grads)", "CrossDeviceOps('tree', bytes_per_pack=8)"]


def with_kit(cdo, kit):
    """``cdo`` reducing on its devices with ``kit`` (None: the kit the adapter picks itself)."""
    if kit is not None:
        cdo._device_kit = kit
    return cdo


def parts(result) -> list:
    return list(result.values) if isinstance(result, values_lib.DistributedValues) else [result]


def op_types(function, *args) -> list[str]:
    return [op.type for op in function.get_concrete_function(*args).graph.get_operations()]


def graph_ops(kit, devices) -> None:
    """In a graph an all-reduce becomes 2k - 1 py_function ops (a deposit per device but the
    main one, the main op, a fetch per device but the main one) and a reduction to one device
    k ops; no numpy_function (the host path's op) appears."""
    k = len(devices)
    for make, want in ((ctf.HierarchicalCopyAllReduce, 2 * k - 1), (ctf.ReductionToOneDevice, k)):
        ops = with_kit(make(), kit)

        @tf.function
        def step(scale, ops=ops):
            x = per_replica([tf.fill([5], (d + 1.0) * scale) for d in range(k)], devices)
            return [p for r in ops.batch_reduce(SUM, [(x, x), (x, x)]) for p in parts(r)]

        types = op_types(step, tf.constant(1.0))
        assert types.count("EagerPyFunc") == want, (make.__name__, types.count("EagerPyFunc"))
        assert "PyFunc" not in types, "the host path's numpy_function was used"
        for scale in (1.0, 3.0):
            for p in step(tf.constant(scale)):
                np.testing.assert_array_equal(p.numpy(), np.full(5, scale * k * (k + 1) / 2))


def unknown_shapes(kit, devices) -> None:
    """Shapes unknown while tracing keep their known dimensions; a step with no rows works."""
    k = len(devices)
    ops = with_kit(ctf.CrossDeviceOps("ring", num_packs=1), kit)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def step(x):
        pr = per_replica([x * (d + 1.0) for d in range(k)], devices)
        out = ops.batch_reduce(MEAN, [(pr, pr), (pr, devices[-1])])
        shapes = [p.shape.as_list() for r in out for p in parts(r)]
        assert all(s == [None, 3] for s in shapes), shapes
        return [p for r in out for p in parts(r)]

    for rows in (4, 0, 2):
        x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
        for p in step(tf.constant(x)):
            np.testing.assert_allclose(p.numpy(), x * (k + 1) / 2, rtol=1e-6)
    assert step.experimental_get_tracing_count() == 1


def replica_context(kit, devices) -> None:
    """``replica_ctx.all_reduce`` inside ``strategy.run`` in ``tf.function`` (merge_call),
    against TensorFlow's ``ReductionToOneDevice``."""
    def results(cdo):
        strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=cdo)

        @tf.function
        def step():
            def fn():
                ctx = tf.distribute.get_replica_context()
                x = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32) * tf.range(7.0)
                return ctx.all_reduce(SUM, [x, 2.0 * x])
            return strategy.run(fn)

        return [p.numpy() for r in step() for p in parts(r)]

    got = results(with_kit(ctf.NcclAllReduce(), kit))
    want = results(tf.distribute.ReductionToOneDevice())
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def keras(kit, devices) -> None:
    """``model.fit`` ends within 1e-5 of TensorFlow's ``ReductionToOneDevice`` (keras_fit)."""
    keras_fit.use(devices)
    initial, reference = keras_fit.reference()  # the keras suite's, where it ran on these devices
    for make in (ctf.HierarchicalCopyAllReduce, ctf.NcclAllReduce):
        keras_fit.close(keras_fit.fit(with_kit(make(), kit), initial)[1], reference)


def workers(kit, devices) -> None:
    """Two workers (thread ranks), each with half the devices: MEAN and SUM across workers,
    eager and in ``tf.function``. Device d of worker w holds (h w + d + 1) * base. On GPUs the
    local step is the library's ring, not NCCL: thread workers would share one process's NCCL
    communicators, which are not thread-safe (gpu_workers_mpi.py runs NCCL, one per process)."""
    h = len(devices) // 2
    spec = "pscpu:64:nccl/xring" if kit is not None else "pscpu:64:ring/xring"
    total = 2 * h * (2 * h + 1) / 2  # 1 + ... + 2h
    base = np.arange(300, dtype=np.float32)

    def worker(comm):
        mine = devices[h * comm.rank:h * (comm.rank + 1)]
        ops = with_kit(ctf.MultiWorkerAllReduce(communicator=comm, num_packs=1,
                                                all_reduce_spec=spec), kit)

        def value(scale):
            return per_replica([tf.constant(base * (h * comm.rank + d + 1)) * scale
                                for d in range(h)], mine)

        x = value(1.0)
        eager = [ops.reduce(MEAN, x, x), ops.reduce(SUM, x, mine[-1])]
        step = tf.function(lambda s: [p for r in ops.batch_reduce(
            SUM, [(value(s), value(s)), (value(s), mine[0])]) for p in parts(r)])
        # a mean whose totals pass float16's range where it does not: divided before the
        # totals cross as float16 (it came back inf)
        narrow = with_kit(ctf.MultiWorkerAllReduce(communicator=comm, compression="fp16",
                                                   all_reduce_spec=spec), kit)
        # (40000 on each device: past float16's range summed over the workers for any count,
        # exact in it as a mean)
        big = per_replica([tf.fill([3], 40000.0) for _ in range(h)], mine)
        compressed = [p.numpy() for r in (narrow.reduce(MEAN, big, big),) for p in parts(r)]
        return ([p.numpy() for r in eager for p in parts(r)], [p.numpy() for p in step(2.0)],
                op_types(step, tf.constant(2.0)), compressed)

    for means_and_sums, graph, types, compressed in collectives.run(worker, 2, timeout=120):
        for p in compressed:
            np.testing.assert_array_equal(p, np.full(3, 40000.0, np.float32))
        for p in means_and_sums[:h]:
            np.testing.assert_allclose(p, base * total / (2 * h), rtol=1e-6)
        np.testing.assert_allclose(means_and_sums[h], base * total / 2, rtol=1e-6)  # mean over workers
        for p in graph:
            np.testing.assert_allclose(p, 2 * base * total / 2, rtol=1e-6)
        # Across workers each value is reduced onto one device: h ops (h - 1 deposits, main).
        assert types.count("EagerPyFunc") == h and "PyFunc" not in types, types


def capsules() -> None:
    """The DLPack capsule fields the GPU path rewrites, read and written on a CPU tensor."""
    from collectives.adapters.tensorflow import dlpack

    with tf.device("/cpu:0"):
        t = tf.identity(np.arange(6, dtype=np.float32).reshape(2, 3))
    capsule = tf.experimental.dlpack.to_dlpack(t)
    pointer, kind, device_id = dlpack.capsule_fields(capsule)
    assert (kind, device_id) == (1, 0) and pointer == np.asarray(t).ctypes.data
    dlpack.set_capsule_device(capsule, 3)
    assert dlpack.capsule_fields(capsule) == (pointer, 1, 3)
    dlpack.set_capsule_device(capsule, 0)
    back = tf.experimental.dlpack.from_dlpack(capsule)  # the same memory, no copy
    assert np.asarray(back).ctypes.data == pointer
    np.testing.assert_array_equal(back.numpy(), t.numpy())
    assert dlpack.logical_index("/job:localhost/replica:0/task:0/device:GPU:3") == 3


def run(report, devices: list[str], kit, label: str, counts=None) -> None:
    """Every check, on ``devices`` with ``kit`` (None: the adapter's own choice)."""
    fixtures.DEVICES[:] = devices
    fixtures.N = len(devices)
    classes = fixtures.classes()
    for name in CLASSES:
        def make(factory=classes[name]):
            return with_kit(factory(), kit)
        for k in counts or [len(devices)]:
            report.check(f"{label} {name} k={k} reduce/batch/broadcast",
                         fixtures.reduction_and_broadcast, make, k)
            report.check(f"{label} {name} k={k} mirrored values", fixtures.mirrored_values, make, k)
        report.check(f"{label} {name} tf.function", fixtures.reduction_in_function, make,
                     len(devices))
        report.check(f"{label} {name} mixed batch", fixtures.mixed_batch, make, len(devices))
    for check in (graph_ops, unknown_shapes, replica_context, keras):
        report.check(f"{label} {check.__name__}", check, kit, devices)
    report.check(f"{label} DLPack capsule fields", capsules)
    if len(devices) >= 2:
        report.check(f"{label} workers", workers, kit, devices)
