"""Multi-worker training under ``mpiexec``: one process per worker, 2 logical CPUs each.

    mpiexec -n 2 python tests/tf_scenarios/multi_worker_mpi.py REFERENCE.npz OUT_PREFIX

``REFERENCE.npz`` holds the initial and final weights of a single-process ``model.fit`` over
4 devices with TensorFlow's ``ReductionToOneDevice`` (``keras_fit.py 4 --save-reference``).
Each worker builds the same model under ``MirroredStrategy`` over its own two devices with
``MultiWorkerAllReduce()`` (MPI found from the launcher's environment), takes worker 0's
initial weights through ``broadcast_variables`` (worker 1 starts from perturbed ones), and fits
its shard of every global batch of 64 rows (rows 32w..32w+31), 2 passes over the data as one
epoch (as keras_fit.py: the batches of epochs=2, one distributed iterator). Every worker writes its final
weights to ``OUT_PREFIX.<rank>.npz``; the test checks they are bitwise identical and within
float32 rounding of the reference. Eager and tf.function batch reductions are checked first,
then batches that differ between the workers, a bad argument on one worker, and
``CrossDeviceOps(communicator="mpi")``.
"""

from __future__ import annotations

import sys

from common import Report, expect_error, per_replica, setup

DEVICES = setup(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from collectives.adapters import tensorflow as ctf  # noqa: E402

import collectives  # noqa: E402

SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
FEATURES, GLOBAL_BATCH, SAMPLES, EPOCHS = 20, 64, 512, 2  # as keras_fit.py with 4 devices


def reductions(ops) -> None:
    rank, size = ops.communicator.rank, ops.communicator.size
    x = per_replica([tf.fill([5], 2.0 * rank + d + 1) for d in range(2)], DEVICES)
    total = sum(range(1, 2 * size + 1))
    for p in ops.reduce(MEAN, x, x).values:
        np.testing.assert_array_equal(p.numpy(), np.full(5, total / (2 * size)))

    @tf.function
    def step(scale):
        xs = per_replica([tf.fill([5], (2.0 * rank + d + 1) * scale) for d in range(2)], DEVICES)
        ys = per_replica([tf.fill([4000], (2.0 * rank + d + 1) * scale) for d in range(2)], DEVICES)
        r = ops.batch_reduce(SUM, [(xs, xs), (ys, DEVICES[0])])
        return list(r[0].values) + [r[1]]

    for scale in (1.0, 2.0, 3.0):
        for p in step(tf.constant(scale)):
            np.testing.assert_array_equal(p.numpy(), np.full(p.shape, total / size * scale))
    assert step.experimental_get_tracing_count() == 1


def batch_mismatch(ops) -> None:
    """A batch of one tensor on worker 0 and of two on worker 1: both raise
    CollectiveMismatchError before any data moves (worker 0 used to return a sum, and its next
    reduce paired with worker 1's second tensor); the next reduce is right on both."""
    rank = ops.worker_rank
    x = per_replica([tf.fill([2], 100.0 * rank + d + 1) for d in range(2)], DEVICES)
    expect_error(collectives.CollectiveMismatchError,
                 "batches of different lengths (rank 0: 1 tensor(s), rank 1: 2 tensor(s))",
                 ops.batch_reduce, SUM, [(x, x)] * (1 + rank))
    for p in ops.reduce(MEAN, x, x).values:
        np.testing.assert_array_equal(p.numpy(), np.full(2, (1 + 2 + 101 + 102) / 4))
    # sparse values of tables of other shapes (each worker's result took its own table:
    # results that differ between the workers, silently)
    rows = per_replica([tf.IndexedSlices(tf.ones([1, 4]), tf.constant([0]),
                                         tf.constant([3 + 2 * rank, 4])) for _ in range(2)], DEVICES)
    expect_error(collectives.CollectiveMismatchError,
                 "(rank 0: sparse float32/int32 [3, 4], rank 1: sparse float32/int32 [5, 4])",
                 ops.reduce, SUM, rows, rows)
    for p in ops.reduce(MEAN, x, x).values:
        np.testing.assert_array_equal(p.numpy(), np.full(2, (1 + 2 + 101 + 102) / 4))


def one_bad_worker(ops) -> None:
    """Worker 1 passes a bad argument its own checks find (before any call across workers):
    it raises it, worker 0 a PeerFailedError naming it at once (worker 0's call used to pair
    with worker 1's next one and return its sums, silently wrong, every call after paired
    one off; or, worker 1 idle, it waited out its timeout). On a communicator's first call
    nothing moved, and the next reduce is right on both; in the steady state worker 0 has
    moved its agreement's digest, unless it heard of the refusal first: the next call says
    the communicator is broken (as for any call agreed before), or is right."""
    rank = ops.worker_rank
    x = per_replica([tf.fill([3], 10.0 * rank + d + 1) for d in range(2)], DEVICES)
    mixed = per_replica([tf.fill([3], 1.0), tf.fill([3], tf.constant(1.0, tf.float64))], DEVICES)
    tall = per_replica([tf.ones([3]), tf.ones([4])], DEVICES)

    def traced(o):  # (worker 1's replicas differ in shape: found while tracing)
        return tf.function(lambda value: o.batch_reduce(SUM, [(value, value)])[0].values)(tall)

    bad = {"a bad reduce_op": (lambda o: o.reduce("sum", x, x), ValueError, "reduce_op"),
           "empty destinations": (lambda o: o.reduce(SUM, x, ""), ValueError, "destinations"),
           "replicas of two dtypes": (lambda o: o.reduce(SUM, mixed, mixed), TypeError, "dtype"),
           "a shape error while tracing": (traced, ValueError, "shape"),
           # (read before the refusal's context: worker 0's call paired with its next one)
           "a batch that is no list": (lambda o: o.batch_reduce(SUM, None), TypeError,
                                       "not iterable")}
    for what, (call, error, fragment) in bad.items():
        fresh, warm = (ctf.MultiWorkerAllReduce(communicator=ops.communicator.dup())
                       for _ in range(2))
        warm.reduce(SUM, x, x)  # (its agreement's digest exchange agreed: the steady state)
        for each in (fresh, warm):
            if rank == 1:
                expect_error(error, fragment, call, each)
            else:
                expect_error(collectives.PeerFailedError, "rank 1", each.reduce, SUM, x, x)
            if each is fresh:  # right on both: (1 + 2 + 11 + 12) / 2
                for p in each.reduce(SUM, x, x).values:
                    np.testing.assert_array_equal(p.numpy(), np.full(3, 13.0), err_msg=what)
                continue
            try:  # (worker 0 had moved its digest: broken; or it heard the refusal first)
                values = each.reduce(SUM, x, x).values
            except collectives.CommunicatorBrokenError as exc:
                assert "broken" in str(exc), exc
                continue
            for p in values:
                np.testing.assert_array_equal(p.numpy(), np.full(3, 13.0), err_msg=what)


def communicator_mpi() -> None:
    """``CrossDeviceOps(communicator="mpi")`` opens the MPI communicator itself."""
    ops = ctf.CrossDeviceOps("ring", communicator="mpi", workers_sum="sum")
    assert (ops.num_workers, ops.worker_rank) == (2, ops.communicator.rank)
    x = per_replica([tf.fill([3], 2.0 * ops.worker_rank + d + 1) for d in range(2)], DEVICES)
    for p in ops.reduce(SUM, x, x).values:
        np.testing.assert_array_equal(p.numpy(), np.full(3, 1 + 2 + 3 + 4.0))


def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    y = (x @ rng.standard_normal((FEATURES, 1)) + 0.1).astype(np.float32)
    return x, y


def train(ops, reference, out_prefix) -> None:
    rank, size = ops.communicator.rank, ops.communicator.size
    count = int(reference["count"])
    initial = [reference[f"arr_{i}"] for i in range(count)]
    strategy = tf.distribute.MirroredStrategy(DEVICES, cross_device_ops=ops)
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    model.set_weights([w if rank == 0 else w + 0.5 for w in initial])
    ops.broadcast_variables(model.weights)
    for got, want in zip(model.get_weights(), initial):
        np.testing.assert_array_equal(got, want)
    x, y = data()
    share = GLOBAL_BATCH // size
    rows = np.arange(SAMPLES).reshape(-1, GLOBAL_BATCH)[:, rank * share:(rank + 1) * share].ravel()
    x, y = np.concatenate([x[rows]] * EPOCHS), np.concatenate([y[rows]] * EPOCHS)
    model.fit(x, y, batch_size=share, epochs=1, shuffle=False, verbose=0)
    np.savez(f"{out_prefix}.{rank}.npz", *model.get_weights())


def main() -> None:
    reference_path, out_prefix = sys.argv[1], sys.argv[2]
    report = Report()
    ops = ctf.MultiWorkerAllReduce(timeout=120)
    assert ops.communicator is not None and ops.communicator.size == ctf.launched_world_size()
    report.check("reductions", reductions, ops)
    report.check("batch mismatch", batch_mismatch, ops)
    report.check("one bad worker", one_bad_worker, ops)
    report.check("communicator='mpi'", communicator_mpi)
    report.check("fit", train, ops, np.load(reference_path), out_prefix)
    report.finish()


if __name__ == "__main__":
    main()
