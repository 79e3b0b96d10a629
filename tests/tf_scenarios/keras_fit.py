"""Keras ``model.fit`` and a custom training loop under MirroredStrategy (suite ``keras``).

A small Dense model trained for 2 passes over its data from the same initial weights ends
within 1e-5 (relative, per weight tensor: max |difference| / max |weight|) of what TensorFlow's
own ``ReductionToOneDevice`` gives. ``quick`` trains a few configurations only (for 3
devices); ``save_reference`` writes the initial and final weights of TensorFlow's run to an
``.npz`` for the multi-worker scenario, which must reproduce them over two processes.

The 2 passes run as one epoch over the data repeated twice (``passes``): with shuffle=False
that is the same 16 steps on the same batches in the same order as ``epochs=2``, so the very
same weights, bit for bit, but without a second epoch's distributed iterator (TensorFlow
traces prefetch functions for every device each time one is made: about 1.2 s of CPU a fit).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from collectives.adapters import tensorflow as ctf

# 16 rows per replica and 8 steps an epoch: every replica gets an equal share of every batch.
FEATURES, EPOCHS = 20, 2
DEVICES: list[str] = []  # set by run()
BATCH = SAMPLES = 0


def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    y = (x @ rng.standard_normal((FEATURES, 1)) + 0.1).astype(np.float32)
    return x, y


def passes(x, y):
    """``EPOCHS`` passes over the data as one epoch (the batches of ``epochs=EPOCHS``)."""
    return np.concatenate([x] * EPOCHS), np.concatenate([y] * EPOCHS)


def build_model(initial=None):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    if initial is not None:
        model.set_weights(initial)
    return model


def fit(cdo, initial=None):
    strategy = tf.distribute.MirroredStrategy(DEVICES, cross_device_ops=cdo)
    with strategy.scope():
        model = build_model(initial)
    start = [w.copy() for w in model.get_weights()]
    x, y = passes(*data())
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return start, [w.copy() for w in model.get_weights()]


_references: dict = {}


def reference():
    """TensorFlow's own fit (``ReductionToOneDevice``) on these devices: its initial and final
    weights, trained once per process and device list (the keras suite and the device path's
    check both compare against it)."""
    key = (tuple(DEVICES), BATCH, SAMPLES)
    if key not in _references:
        _references[key] = fit(tf.distribute.ReductionToOneDevice())
    return _references[key]


def custom_loop(cdo, initial):
    """A hand-written training step in tf.function: strategy.run + apply_gradients."""
    strategy = tf.distribute.MirroredStrategy(DEVICES, cross_device_ops=cdo)
    with strategy.scope():
        model = build_model(initial)
        optimizer = keras.optimizers.SGD(0.05)
    x, y = passes(*data())  # one iterator over both passes, as in fit()
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))

    @tf.function
    def step(batch):
        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(model(xb) - yb)) / BATCH
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        losses = strategy.run(replica_step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    for batch in dataset:
        step(batch)
    assert step.experimental_get_tracing_count() <= 2, step.experimental_get_tracing_count()
    return [w.copy() for w in model.get_weights()]


def close(got, want, rtol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        err = float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30))
        assert err <= rtol, f"relative difference {err:.2e} > {rtol:g}"


def configurations(quick: bool) -> dict:
    """Every class, and several of the core's algorithms through the general class."""
    full = {
        "ReductionToOneDevice": ctf.ReductionToOneDevice,
        "NcclAllReduce": ctf.NcclAllReduce,
        "HierarchicalCopyAllReduce": ctf.HierarchicalCopyAllReduce,
        "AllReduceCrossDeviceOps('ring', 2)": lambda: ctf.AllReduceCrossDeviceOps("ring", 2),
        "MultiWorkerAllReduce": ctf.MultiWorkerAllReduce,
        "CrossDeviceOps('ring')": lambda: ctf.CrossDeviceOps("ring"),
        "CrossDeviceOps('tree')": lambda: ctf.CrossDeviceOps("tree"),
        "CrossDeviceOps('pscpu:256:nccl/xring#2', groups=2, num_packs=1)":
            lambda: ctf.CrossDeviceOps("pscpu:256:nccl/xring#2", groups=2, num_packs=1),
    }
    if quick:
        return {k: full[k] for k in ("HierarchicalCopyAllReduce", "CrossDeviceOps('ring')")}
    return full


def use(devices: list[str]) -> None:
    """Train on ``devices``: 16 rows per replica, 8 steps a pass."""
    global BATCH, SAMPLES
    DEVICES[:] = devices
    BATCH = 16 * len(devices)
    SAMPLES = 8 * BATCH


def run(report, devices: list[str], quick: bool = False, save_reference: str | None = None,
        label: str = "") -> None:
    """The checks, named ``label`` + "fit ..." / "custom loop ..." (a prefix tells device
    counts apart where one process trains on several)."""
    use(devices)
    initial, reference_weights = reference()
    if save_reference:
        np.savez(save_reference, *initial, *reference_weights, count=len(initial))
    configs = configurations(quick)
    for name, make in configs.items():
        report.check(f"{label}fit {name}",
                     lambda make=make: close(fit(make(), initial)[1], reference_weights))
    loop_reference = custom_loop(tf.distribute.ReductionToOneDevice(), initial)

    def trained() -> None:
        assert any(np.max(np.abs(a - b)) > 1e-3 for a, b in zip(loop_reference, initial))

    report.check(f"{label}custom loop trains", trained)
    name = "HierarchicalCopyAllReduce" if quick else "CrossDeviceOps('ring')"
    report.check(f"{label}custom loop {name}",
                 lambda: close(custom_loop(configs[name](), initial), loop_reference))
