"""The multi-worker path without MPI: two workers as threads of one process (suite ``threads``).

Four logical CPU devices; worker w (a thread rank of the embedded transport,
``collectives.run``) owns devices 2w and 2w + 1 and reduces across workers through its
``Communicator``, exactly as a process under ``mpiexec`` does through MPI. Checks: SUM under
both ``workers_sum`` modes, MEAN over the global device count, batches with other
destinations, the same batch in ``tf.function`` (traced once), IndexedSlices, ragged gather,
``broadcast_variables``, the device-count check, batches that differ between workers and
``timeout_seconds`` (0: none, as TensorFlow reads it).
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf
from collectives.adapters import tensorflow as ctf
from common import expect_error, per_replica

import collectives

DEVICES: list[str] = []  # set by run(): needs 4

SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN


def local(rank: int, count: int = 2) -> list[str]:
    return DEVICES[2 * rank:2 * rank + count]


def parts(result):
    return [t.numpy() for t in (result.values if hasattr(result, "values") else [result])]


def dense_checks(comm):
    devices = local(comm.rank)
    # Device d of worker w holds global replica g = 2w + d with value g + 1: the sum is 10.
    x = per_replica([tf.fill([3], 2.0 * comm.rank + d + 1) for d in range(2)], devices)
    big = per_replica([tf.fill([300], 2.0 * comm.rank + d + 1) for d in range(2)], devices)
    mean_ops = ctf.MultiWorkerAllReduce(communicator=comm, all_reduce_spec="pscpu:64:nccl/xring")
    sum_ops = ctf.MultiWorkerAllReduce(communicator=comm, workers_sum="sum",
                                       all_reduce_spec=("pscpu/pscpu", 2, -1), num_packs=1)
    assert mean_ops._num_between_graph_workers == 2
    out = {
        "sum/workers": parts(mean_ops.reduce(SUM, x, x)),
        "sum/plain": parts(sum_ops.reduce(SUM, x, x)),
        "mean": parts(mean_ops.reduce(MEAN, x, devices[1])),
        "batch": [parts(r) for r in sum_ops.batch_reduce(MEAN, [(x, x), (big, devices[0])])],
    }
    # One local device: the base class must not short-cut it (the workers still reduce).
    one = per_replica([tf.constant([comm.rank + 1.0])], devices[:1])
    out["one device"] = parts(sum_ops.reduce(SUM, one, one))

    @tf.function
    def step(scale):
        xs = per_replica([tf.fill([3], (2.0 * comm.rank + d + 1) * scale) for d in range(2)], devices)
        bs = per_replica([tf.fill([300], (2.0 * comm.rank + d + 1) * scale) for d in range(2)],
                         devices)
        r = mean_ops.batch_reduce(MEAN, [(xs, xs), (bs, bs)])
        return list(r[0].values) + list(r[1].values)

    out["graph"] = [[t.numpy() for t in step(tf.constant(s))] for s in (1.0, 3.0)]
    out["traces"] = step.experimental_get_tracing_count()
    return out


def check_dense(results) -> None:
    for out in results:
        for p in out["sum/workers"]:
            np.testing.assert_array_equal(p, np.full(3, 5.0))  # 10, averaged over 2 workers
        for p in out["sum/plain"]:
            np.testing.assert_array_equal(p, np.full(3, 10.0))
        for p in out["mean"]:
            np.testing.assert_array_equal(p, np.full(3, 2.5))
        for p in out["batch"][0]:
            np.testing.assert_array_equal(p, np.full(3, 2.5))
        np.testing.assert_array_equal(out["batch"][1][0], np.full(300, 2.5))
        np.testing.assert_array_equal(out["one device"][0], [3.0])
        for s, got in zip((1.0, 3.0), out["graph"]):
            for p in got:
                np.testing.assert_array_equal(p, np.full(p.shape, 2.5 * s))
        assert out["traces"] == 1, out["traces"]
    # Bitwise identical on both workers.
    for a, b in zip(results[0]["graph"][1], results[1]["graph"][1]):
        assert a.tobytes() == b.tobytes()


def sparse_and_gather(comm):
    devices = local(comm.rank)
    ops = ctf.MultiWorkerAllReduce(communicator=comm)
    # Replica g = 2w + d contributes row g % 3 with value g + 1 (worker 1: two rows each).
    slices = []
    for d in range(2):
        g = 2 * comm.rank + d
        rows = 1 + comm.rank
        slices.append(tf.IndexedSlices(tf.fill([rows, 2], g + 1.0),
                                       tf.constant([g % 3] * rows, tf.int64),
                                       tf.constant([3, 2], tf.int64)))
    sp = per_replica(slices, devices)
    out = {"sparse sum": tf.convert_to_tensor(ops.reduce(SUM, sp, devices[0])).numpy(),
           "sparse mean": tf.convert_to_tensor(ops.reduce(MEAN, sp, devices[0])).numpy()}
    # (complex slices were summed over the workers, where dense complex totals are averaged)
    complex_sp = per_replica([tf.IndexedSlices(tf.cast(s.values, tf.complex64), s.indices,
                                               s.dense_shape) for s in slices], devices)
    out["sparse complex sum"] = tf.convert_to_tensor(ops.reduce(SUM, complex_sp,
                                                                devices[0])).numpy()
    rows = per_replica([tf.fill([1 + comm.rank, 2], 2.0 * comm.rank + d) for d in range(2)], devices)
    out["gather0"] = parts(ops._gather(rows, rows, axis=0))
    out["gather1"] = parts(ops._gather(per_replica([tf.fill([2, 1], 2.0 * comm.rank + d)
                                                    for d in range(2)], devices), devices[1], axis=1))
    return out


def check_sparse(results) -> None:
    # Dense sum: row 0 gets replicas 0 (1 row, value 1) and 3 (2 rows, value 4): 1 + 8 = 9;
    # row 1: replica 1 (value 2); row 2: replica 2 (2 rows, value 3): 6.
    dense = np.array([[9.0, 9.0], [2.0, 2.0], [6.0, 6.0]])
    for out in results:
        np.testing.assert_array_equal(out["sparse sum"], dense / 2)  # averaged over workers
        np.testing.assert_array_equal(out["sparse complex sum"], (dense / 2).astype(np.complex64))
        np.testing.assert_array_equal(out["sparse mean"], dense / 4)
        want0 = np.concatenate([np.full((1, 2), 0.0), np.full((1, 2), 1.0),
                                np.full((2, 2), 2.0), np.full((2, 2), 3.0)])
        for p in out["gather0"]:
            np.testing.assert_array_equal(p, want0)
        np.testing.assert_array_equal(out["gather1"][0], np.tile([[0.0, 1.0, 2.0, 3.0]], (2, 1)))


def broadcast(comm):
    with tf.device(local(comm.rank)[0]):
        v = tf.Variable([comm.rank + 1.0, -1.0])
    ctf.broadcast_variables([v], comm, root=1)
    return v.numpy()


def device_count_mismatch(comm):
    devices = local(comm.rank, 2 - comm.rank)
    x = per_replica([tf.ones([2])] * len(devices), devices)
    ops = ctf.MultiWorkerAllReduce(communicator=comm)
    expect_error(ValueError, "different numbers of devices", ops.reduce, SUM, x, x)


def batch_mismatch(comm):
    """Worker 0 reduces a batch of one tensor, worker 1 of two: both raise
    CollectiveMismatchError before any data moves (eagerly, and inside tf.function, where
    TensorFlow reports it as InvalidArgumentError), and stay in step for the next batch.
    Likewise a gather against a batch, sparse batches of different lengths, and an empty
    batch beside one tensor (it returned [] at once, and the other worker's call paired with
    its next: silently wrong sums), eagerly and inside tf.function."""
    devices = local(comm.rank)
    ops = ctf.MultiWorkerAllReduce(communicator=comm, all_reduce_spec="ring", workers_sum="sum")

    def value(scale=1.0):
        return per_replica([tf.fill([3], (100.0 * comm.rank + d + 1) * scale) for d in range(2)],
                           devices)

    x = value()
    expect_error(collectives.CollectiveMismatchError,
                 "batches of different lengths (rank 0: 1 tensor(s), rank 1: 2 tensor(s))",
                 ops.batch_reduce, SUM, [(x, x)] * (1 + comm.rank))
    out = {"eager": parts(ops.reduce(SUM, x, x))}

    @tf.function
    def step(scale):
        xs = value(scale)
        return ops.batch_reduce(SUM, [(xs, xs)] * (1 + comm.rank))[0].values

    expect_error(tf.errors.InvalidArgumentError, "batches of different lengths", step,
                 tf.constant(1.0))
    out["graph"] = parts(ops.reduce(SUM, value(2.0), x))

    @tf.function(input_signature=[tf.TensorSpec([None])])
    def unknown_length(v):  # the length is known only when it runs: agreed then
        vs = per_replica([v * (d + 1) for d in range(2)], devices)
        return ops.batch_reduce(SUM, [(vs, vs)])[0].values

    expect_error(tf.errors.InvalidArgumentError, "different tensors at position 0 (rank 0: "
                 "dense float32 [3], rank 1: dense float32 [4])", unknown_length,
                 tf.ones([3 + comm.rank]))
    out["unknown length"] = [t.numpy() for t in unknown_length(tf.ones([3]))]

    if comm.rank == 0:
        expect_error(collectives.CollectiveMismatchError, "different operations",
                     ops._gather, x, x, axis=0)
    else:
        expect_error(collectives.CollectiveMismatchError, "different operations",
                     ops.batch_reduce, SUM, [(x, x)])
    slices = per_replica([tf.IndexedSlices(tf.ones([1, 2]), tf.constant([d]),
                                           tf.constant([3, 2])) for d in range(2)], devices)
    expect_error(collectives.CollectiveMismatchError, "batches of different lengths",
                 ops.batch_reduce, SUM, [(slices, devices[0])] * (1 + comm.rank))
    expect_error(collectives.CollectiveMismatchError,
                 "batches of different lengths (rank 0: 0 tensor(s), rank 1: 1 tensor(s))",
                 ops.batch_reduce, SUM, [(x, x)] * comm.rank)

    @tf.function
    def empty_on_one(scale):
        xs = value(scale)
        return [r.values for r in ops.batch_reduce(SUM, [(xs, xs)] * comm.rank)]

    expect_error(tf.errors.InvalidArgumentError, "rank 0: 0 tensor(s), rank 1: 1 tensor(s)",
                 empty_on_one, tf.constant(1.0))

    def slices_reduced(with_table: bool):
        @tf.function(input_signature=[tf.TensorSpec([2], tf.int64)])
        def step(table):  # (a table known only as it runs: each worker's result took its own)
            rows = per_replica([tf.IndexedSlices(tf.ones([1, 2]), tf.constant([d], tf.int64),
                                                 table if with_table else None)
                                for d in range(2)], devices)
            result = ops.reduce(SUM, rows, devices[0])
            return result.indices, result.dense_shape if with_table else result.indices
        return step

    table_known_late = slices_reduced(True)
    expect_error(tf.errors.InvalidArgumentError, "(rank 0: sparse float32/int64 [3, 2], rank 1: "
                 "sparse float32/int64 [5, 2])", table_known_late,
                 tf.constant([3 + 2 * comm.rank, 2], tf.int64))
    # (one worker without a table: only the other agreed on its table, and the calls fell
    # out of step, breaking the communicator)
    expect_error(tf.errors.InvalidArgumentError, "(rank 0: sparse float32/int64 [?, 2], rank 1: "
                 "sparse (table at run time) float32/int64 [?, 2])",
                 slices_reduced(comm.rank == 1), tf.constant([3, 2], tf.int64))
    out["table known late"] = [t.numpy() for t in table_known_late(tf.constant([3, 2],
                                                                               tf.int64))]
    out["after"] = parts(ops.reduce(SUM, x, x))
    return out


def check_batch_mismatch(results) -> None:
    want = np.full(3, 1 + 2 + 101 + 102.0)  # every device of both workers, summed
    for out in results:
        for p in out["eager"] + out["after"]:
            np.testing.assert_array_equal(p, want)
        for p in out["graph"]:
            np.testing.assert_array_equal(p, 2 * want)
        for p in out["unknown length"]:
            np.testing.assert_array_equal(p, np.full(3, 6.0))  # (1 + 2) on each of 2 workers
        indices, table = out["table known late"]  # rows 0 and 1 of each worker, in order
        assert indices.tolist() == [0, 1, 0, 1] and table.tolist() == [3, 2]


def timeout(comm):
    devices = local(comm.rank)
    x = per_replica([tf.ones([2])] * 2, devices)
    if comm.rank == 0:
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=0.5)
        ops = ctf.MultiWorkerAllReduce(communicator=comm, all_reduce_spec="ring")
        expect_error(collectives.CollectiveTimeoutError, "rank(s) 1", ops.reduce, SUM, x, x,
                     options=options)
    else:  # alive, elsewhere, past rank 0's timeout (a worker that returns has left)
        time.sleep(1.5)


def no_timeout(comm):
    """``timeout_seconds=0``, which TensorFlow reads as no timeout, waits for a worker 0.3 s
    late (it was refused as the library's timeout=0 on every worker), in a reduce and in an
    empty batch."""
    devices = local(comm.rank)
    x = per_replica([tf.ones([2])] * 2, devices)
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=0)
    ops = ctf.MultiWorkerAllReduce(communicator=comm, all_reduce_spec="ring")
    if comm.rank == 1:
        time.sleep(0.3)
    got = parts(ops.reduce(SUM, x, x, options=options))
    assert ops.batch_reduce(SUM, [], options=options) == []
    return got


def compressed(comm):
    """compression="fp16": the totals cross between workers as float16 (1 + 2**-12 per
    device sums to 2 + 2**-11 on each worker, which float16 rounds to 2), eagerly and in
    tf.function; a worker that does not compress disagrees before any data moves."""
    devices = local(comm.rank)
    ops = ctf.MultiWorkerAllReduce(communicator=comm, workers_sum="sum", compression="fp16")
    x = per_replica([tf.fill([5], 1.0 + 2.0 ** -12) for _ in range(2)], devices)
    out = {"eager": parts(ops.reduce(SUM, x, x))}

    @tf.function
    def step(v):
        return ops.batch_reduce(SUM, [(v, v)])[0].values

    out["graph"] = [t.numpy() for t in step(x)]
    # A mean whose totals pass float16's range (65504) where it does not: 2 x 2 devices of
    # 20000 (a sum of 80000 over the workers came back inf: it was divided after crossing)
    means = ctf.MultiWorkerAllReduce(communicator=comm, compression="fp16")
    big = per_replica([tf.fill([3], 20000.0) for _ in range(2)], devices)
    out["mean"] = parts(means.reduce(MEAN, big, big))
    out["workers mean"] = parts(means.reduce(SUM, big, big))  # (workers_sum="mean": 40000)
    expect_error(ValueError, "'fp16', 'bf16' or None", ctf.CrossDeviceOps, compression="fp8")
    plain = ctf.MultiWorkerAllReduce(communicator=comm, workers_sum="sum")
    expect_error(collectives.CollectiveMismatchError, "compression",
                 (ops if comm.rank == 0 else plain).reduce, SUM, x, x)
    return out


def check_compressed(results) -> None:
    for out in results:
        for p in out["eager"] + out["graph"]:
            np.testing.assert_array_equal(p, np.full(5, 4.0, np.float32))
            assert p.dtype == np.float32
        for p in out["mean"]:
            np.testing.assert_array_equal(p, np.full(3, 20000.0, np.float32))
        for p in out["workers mean"]:
            np.testing.assert_array_equal(p, np.full(3, 40000.0, np.float32))


def run(report, devices: list[str]) -> None:
    assert len(devices) == 4, "the threads suite needs 4 logical devices"
    DEVICES[:] = devices
    spmd = collectives.run
    report.check("threads: dense", lambda: check_dense(spmd(dense_checks, 2)))
    report.check("threads: sparse and gather", lambda: check_sparse(spmd(sparse_and_gather, 2)))

    def check_broadcast():
        for value in spmd(broadcast, 2):
            np.testing.assert_array_equal(value, [2.0, -1.0])

    report.check("threads: broadcast_variables", check_broadcast)
    report.check("threads: device count mismatch", lambda: spmd(device_count_mismatch, 2))
    report.check("threads: batch mismatch", lambda: check_batch_mismatch(spmd(batch_mismatch, 2)))
    report.check("threads: timeout_seconds", lambda: spmd(timeout, 2, timeout=10))

    def check_no_timeout():
        for got in spmd(no_timeout, 2, timeout=10):
            for p in got:
                np.testing.assert_array_equal(p, np.full(2, 2.0, np.float32))  # (workers_sum="mean")

    report.check("threads: timeout_seconds=0 is none", check_no_timeout)
    report.check("threads: compression", lambda: check_compressed(spmd(compressed, 2)))
