"""The adapter on GPU tensors, against TensorFlow's own results (run by tests/gpu/test_tensorflow_gpu.py).

    python gpu.py logical    # GPU 0 split into two logical GPUs (any machine with one GPU)
    python gpu.py physical   # every physical GPU (needs two): NCCL's all-reduce for real

Prints one JSON line last: ``{"passed": [...], "failed": [...]}``, or ``{"skipped": reason}``
where TensorFlow or CuPy sees no GPU (a CPU-only TensorFlow, no driver). Needs a TensorFlow
with GPU support (``pip install 'tensorflow[and-cuda]'``) and CuPy with NCCL.

The checks: DLPack both ways without copies and with TensorFlow's logical GPU numbers, what
``NcclAllReduce`` runs (NCCL, or why not), the device path's checks (``device_checks``:
TensorFlow's fixtures for a dozen classes eager and in ``tf.function``, graph ops, unknown
shapes, replica context, Keras fit, two workers staging through pinned memory) with the kit
the adapter picks by itself, and that results stay in GPU memory.
"""

from __future__ import annotations

import json
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from common import Report  # noqa: E402

MEMORY_MB = 3072  # per logical GPU: TensorFlow takes only this, CuPy's pool the rest


def setup(mode: str) -> tuple[list[str] | None, str | None]:
    """The GPU devices to use, or (None, why not)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None, (f"TensorFlow {tf.__version__} sees no GPU (a CPU-only build, or no "
                      "driver): pip install 'tensorflow[and-cuda]'")
    if mode == "physical" and len(gpus) < 2:
        return None, f"needs two GPUs; TensorFlow sees {len(gpus)}"
    if mode == "logical":
        tf.config.set_visible_devices(gpus[0], "GPU")
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=MEMORY_MB)] * 2)
    else:
        for gpu in gpus:  # TensorFlow would otherwise take every GPU's memory up front
            tf.config.experimental.set_memory_growth(gpu, True)
    from collectives.adapters.tensorflow import kits

    reason = kits.gpu_unavailable()
    if reason is not None:
        return None, f"CuPy cannot use the GPU: {reason}"
    from tensorflow.python.distribute import device_util

    return [device_util.resolve(d.name) for d in tf.config.list_logical_devices("GPU")], None


def dlpack_round_trip(devices: list[str]) -> None:
    """A tensor on the last GPU becomes a CuPy array on the same memory (on the CUDA device
    behind it) and comes back as a tensor on that GPU, without a copy."""
    import cupy
    import tensorflow as tf
    from collectives.adapters.tensorflow import dlpack

    device = devices[-1]
    with tf.device(device):
        t = tf.range(1000, dtype=tf.float32)
    pointer, kind, tf_index = dlpack.capsule_fields(tf.experimental.dlpack.to_dlpack(t))
    assert kind == 2 and tf_index == dlpack.logical_index(device), (kind, tf_index)
    dlpack.sync_tensorflow([device])
    a = dlpack.tensor_to_cupy(t)
    assert a.data.ptr == pointer, "the CuPy array is a copy"
    assert a.device.id == cupy.cuda.runtime.pointerGetAttributes(pointer).device
    with a.device:
        doubled = a * 2
    doubled.device.synchronize()
    back = dlpack.cupy_to_tensor(doubled, device)
    assert back.device == device, (back.device, device)
    assert dlpack.capsule_fields(tf.experimental.dlpack.to_dlpack(back))[0] == doubled.data.ptr
    np.testing.assert_array_equal(back.numpy(), np.arange(1000, dtype=np.float32) * 2)


def results_on_gpus(devices: list[str]) -> None:
    """Results of a batch live in GPU memory on their destinations."""
    import tensorflow as tf
    from collectives.adapters import tensorflow as ctf
    from collectives.adapters.tensorflow import dlpack
    from common import per_replica
    from device_checks import parts

    x = per_replica([tf.fill([4096], float(d + 1)) for d in range(len(devices))], devices)
    for ops in (ctf.NcclAllReduce(), ctf.ReductionToOneDevice(), ctf.CrossDeviceOps("ring")):
        for result in ops.batch_reduce(tf.distribute.ReduceOp.SUM, [(x, x), (x, devices[-1])]):
            for p in parts(result):
                assert dlpack.capsule_fields(tf.experimental.dlpack.to_dlpack(p))[1] == 2
                assert "GPU" in p.device, p.device


def nccl_choice(devices: list[str], mode: str) -> None:
    """``NcclAllReduce`` runs NCCL over GPUs of their own; over logical GPUs sharing a card it
    says once why it reduces to one device instead. Its results equal TensorFlow's
    ``NcclAllReduce`` over GPUs of their own, else TensorFlow's ``ReductionToOneDevice``."""
    import tensorflow as tf
    from collectives.adapters import tensorflow as ctf
    from collectives.adapters.tensorflow import cross_device_ops
    from common import assert_mirrored_equal, per_replica

    reason = cross_device_ops.nccl_unavailable(devices)
    if mode == "physical":
        assert reason is None, reason
    else:
        assert reason is not None and "sharing" in reason, reason
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("collectives.adapters.tensorflow").addHandler(handler)
    x = per_replica([tf.range(1 << 16, dtype=tf.float32) * (d + 1) for d in range(len(devices))],
                    devices)
    got = ctf.NcclAllReduce().reduce(tf.distribute.ReduceOp.SUM, x, x)
    assert any("falls back" in r for r in records) == (mode != "physical"), records
    # TensorFlow's NCCL is not tried on a shared card: NCCL refuses two ranks on one GPU.
    reference = (tf.distribute.NcclAllReduce() if mode == "physical"
                 else tf.distribute.ReductionToOneDevice())
    assert_mirrored_equal(got, reference.reduce(tf.distribute.ReduceOp.SUM, x, x))


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "logical"
    devices, reason = setup(mode)
    if devices is None:
        print(json.dumps({"skipped": reason}))
        return
    import device_checks

    report = Report()
    report.check(f"{mode}: DLPack round trip", dlpack_round_trip, devices)
    report.check(f"{mode}: NcclAllReduce's choice", nccl_choice, devices, mode)
    report.check(f"{mode}: results in GPU memory", results_on_gpus, devices)
    device_checks.run(report, devices, None, f"{mode}:", counts=[1, len(devices)])
    report.finish()


if __name__ == "__main__":
    main()
