"""Two workers on GPUs under ``mpiexec``: NCCL inside each worker, MPI between them.

    mpiexec -n 2 python tests/tf_scenarios/gpu_workers_mpi.py

Worker w takes GPU w where there are two GPUs, else both take GPU 0 (TensorFlow limited to a
share of its memory, one logical GPU each: separate processes may share a card, NCCL's
one-rank communicators included). Each runs ``MultiWorkerAllReduce("pscpu:64:nccl/xring")``:
values above 64 elements are summed on the worker's GPU with NCCL, staged through pinned host
memory to MPI, and come back to the GPU. Checked: MEAN, SUM averaged over workers, other
destinations, the same batch in ``tf.function`` (which holds no numpy_function), against the
sums every worker can work out. Prints ``{"skipped": why}`` where TensorFlow or CuPy sees no
GPU, else the report of ``common.Report`` (one per rank).
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from common import Report, per_replica  # noqa: E402

MEMORY_MB = 3072


def setup(rank: int) -> tuple[list[str] | None, str | None]:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None, f"TensorFlow {tf.__version__} sees no GPU: pip install 'tensorflow[and-cuda]'"
    gpu = gpus[rank % len(gpus)]
    tf.config.set_visible_devices(gpu, "GPU")
    tf.config.set_logical_device_configuration(
        gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=MEMORY_MB)])
    from collectives.adapters.tensorflow import kits

    reason = kits.gpu_unavailable()
    if reason is not None:
        return None, f"CuPy cannot use the GPU: {reason}"
    return [d.name for d in tf.config.list_logical_devices("GPU")], None


def reductions(devices: list[str]) -> None:
    import tensorflow as tf
    from collectives.adapters import tensorflow as ctf
    from device_checks import op_types, parts

    ops = ctf.MultiWorkerAllReduce(all_reduce_spec="pscpu:64:nccl/xring", num_packs=1,
                                   timeout=120)
    rank, size = ops.worker_rank, ops.num_workers
    assert size == 2, size
    total = size * (size + 1) / 2  # worker w holds (w + 1) * base
    SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
    for n in (5, 100_000):  # pscpu over MPI; NCCL on the GPU, then MPI
        base = np.arange(n, dtype=np.float32)

        def value(scale, base=base):
            return per_replica([tf.constant(base * (rank + 1)) * scale], devices)

        x = value(1.0)
        np.testing.assert_allclose(ops.reduce(MEAN, x, x).numpy(), base * total / size, rtol=1e-6)
        np.testing.assert_allclose(ops.reduce(SUM, x, "/cpu:0").numpy(), base * total / size,
                                   rtol=1e-6)

        @tf.function
        def step(scale, value=value):
            return [p for r in ops.batch_reduce(SUM, [(value(scale), value(scale))] * 2)
                    for p in parts(r)]

        for p in step(tf.constant(2.0)):
            assert "GPU" in p.device, p.device
            np.testing.assert_allclose(p.numpy(), 2 * base * total / size, rtol=1e-6)
        assert "PyFunc" not in op_types(step, tf.constant(2.0))


def main() -> None:
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    devices, reason = setup(rank)
    if devices is None:
        print(json.dumps({"skipped": reason}))
        return
    report = Report()
    report.check("gpu workers: reductions", reductions, devices)
    report.finish()


if __name__ == "__main__":
    main()
