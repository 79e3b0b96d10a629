"""Several workers, one process each: ``MultiWorkerAllReduce`` and initial-weight broadcast.

TensorFlow's historic ``MultiWorkerAllReduce`` drove every worker's devices from one client.
Here each worker is a process launched by ``mpiexec`` with its own ``MirroredStrategy`` over its
local devices; a batch is reduced over the local devices (in shared memory) and then across
the workers through a ``collectives.Communicator`` (the MPI transport by default).

    mpiexec -n 2 python train.py      # each: MirroredStrategy(local devices, MultiWorkerAllReduce())
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from collectives.hints import Compression

from .cross_device_ops import CrossDeviceOps
from .world import launched_world_size, open_communicator

__all__ = ["MultiWorkerAllReduce", "broadcast_variables", "launched_world_size"]

class MultiWorkerAllReduce(CrossDeviceOps):
    """TensorFlow's ``MultiWorkerAllReduce``, one process per worker under ``mpiexec``.

    ``all_reduce_spec`` takes every form TensorFlow took: ``"pscpu/pscpu"``, a tuple
    ``(alg, shards, limit)``, a list of them, or the grammar ``"pscpu:2k:pscpu#2:64k:xring"``
    (limits in elements). For an ``"A/B"`` range, A reduces over a worker's own devices and B
    (with the range's shards) across workers; a one-level name does both steps.

    * ``worker_devices``/``num_gpus_per_worker`` may be left None: the workers are the
      processes. Given, ``worker_devices`` must name as many workers as there are processes.
    * ``communicator``: ``"auto"`` (MPI when launched by ``mpiexec`` with more than one
      process, else a single worker), ``"mpi"``, None, or any ``collectives.Communicator``.
    * ``timeout``: seconds the MPI communicator it opens waits for a worker (300 by
      default); a ``Communicator`` passed keeps its own, and a ``timeout`` beside it raises.
    * MEAN divides by the global device count. SUM: Keras (and most loops) scale each
      replica's loss by ``strategy.num_replicas_in_sync``, which counts only a worker's own
      devices, so by default (``workers_sum="mean"``) floating SUMs are averaged over workers
      - the gradient of the global mean loss, as one process over all devices would compute.
      ``workers_sum="sum"`` gives the plain total over every device of every worker.
    * Every worker must run the same steps with the same number of devices and tensors of the
      same shapes. Each batch is agreed first (an 8-byte digest of the whole batch): workers
      that differ all raise ``collectives.CollectiveMismatchError``, before any data moves.
      The initial weights should come from one worker (``broadcast_variables``).
    * ``compression`` ("fp16", "bf16"): the float32 and float64 totals cross between workers
      in that narrower float, as with Horovod's ``Compression.fp16``.
    """

    def __init__(self, worker_devices: Sequence[str] | None = None,
                 num_gpus_per_worker: int | None = None,
                 all_reduce_spec=("pscpu/pscpu", 2, -1), num_packs: int = 0,
                 agg_small_grads_max_bytes: int = 0, agg_small_grads_max_group: int = 10, *,
                 communicator="auto", workers_sum: str = "mean", timeout: float | None = None,
                 compression: Compression = None):
        if num_gpus_per_worker is not None and (isinstance(num_gpus_per_worker, bool) or
                                                not isinstance(num_gpus_per_worker, int) or
                                                num_gpus_per_worker < 0):
            raise ValueError(f"num_gpus_per_worker={num_gpus_per_worker!r} must be a "
                             "non-negative integer or None")
        comm = open_communicator(communicator, timeout=timeout, auto=True)
        workers = comm.size if comm is not None else 1
        if worker_devices is not None:
            if isinstance(worker_devices, str):
                raise ValueError("worker_devices must be a list of worker device prefixes such "
                                 "as ['/job:worker/task:0', '/job:worker/task:1'], not a string")
            if len(worker_devices) != workers:
                raise ValueError(
                    f"worker_devices names {len(worker_devices)} workers but {workers} "
                    f"process(es) take part; run one process per worker, e.g. "
                    f"'mpiexec -n {len(worker_devices)} python train.py', or leave "
                    "worker_devices=None")
        self.worker_devices = None if worker_devices is None else list(worker_devices)
        self.num_gpus_per_worker = num_gpus_per_worker
        self.all_reduce_spec = all_reduce_spec
        super().__init__(all_reduce_spec, num_packs=num_packs,
                         agg_small_grads_max_bytes=agg_small_grads_max_bytes,
                         agg_small_grads_max_group=agg_small_grads_max_group,
                         communicator=comm, workers_sum=workers_sum, compression=compression)

    def broadcast_variables(self, variables: Iterable, root: int = 0) -> None:
        """Give every worker ``root``'s values of ``variables`` (eager; call on every worker)."""
        broadcast_variables(variables, self.communicator, root=root)


def broadcast_variables(variables: Iterable, communicator, root: int = 0) -> None:
    """Assign worker ``root``'s value to each variable on every worker, in order.

    Call it on every worker, in eager mode, after the model is built and before training
    (Keras variables, ``tf.Variable`` and ``MirroredVariable`` all work). A None communicator
    (one worker) does nothing.
    """
    if communicator is None or communicator.size == 1:
        return
    for var in variables:
        value = np.asarray(var.numpy() if hasattr(var, "numpy") else var.value)
        var.assign(communicator.broadcast(value, root=root))
