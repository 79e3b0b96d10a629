"""TensorFlow adapter: the library's algorithms as ``tf.distribute`` cross-device ops.

    import tensorflow as tf
    from collectives.adapters import tensorflow as ctf

    strategy = tf.distribute.MirroredStrategy(cross_device_ops=ctf.NcclAllReduce())
    strategy = tf.distribute.MirroredStrategy(cross_device_ops=ctf.CrossDeviceOps("ring"))

Classes: ``ReductionToOneDevice``, ``NcclAllReduce``, ``HierarchicalCopyAllReduce``,
``AllReduceCrossDeviceOps``, ``MultiWorkerAllReduce`` (one process per worker under
``mpiexec``) and the general ``CrossDeviceOps(algorithm=...)``. See ``docs/tensorflow.md``.
Needs TensorFlow: ``pip install 'collective-schedules[tensorflow]'`` (the CPU build), or
``[tensorflow-full]`` for TensorFlow's full build (GPUs); see ``docs/tensorflow.md``. TensorFlow
is imported on first use of a class (without it, that use raises one line naming the ``pip
install``), so ``collectives.adapters.tensorflow.host`` (the NumPy side) works without it.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "AllReduceCrossDeviceOps": "cross_device_ops",
    "CrossDeviceOps": "cross_device_ops",
    "HierarchicalCopyAllReduce": "cross_device_ops",
    "NcclAllReduce": "cross_device_ops",
    "ReductionToOneDevice": "cross_device_ops",
    "MultiWorkerAllReduce": "multi_worker",
    "broadcast_variables": "multi_worker",
    "launched_world_size": "world",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from collectives.extras import require

    if module != "world":  # (the launch's world size needs no TensorFlow)
        require("tensorflow", "tensorflow", f"collectives.adapters.tensorflow.{name}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
