"""Helpers shared by the TensorFlow scenario scripts (each runs in its own process).

A scenario splits the CPU into logical devices (possible once per process, before TensorFlow
initialises its devices), runs its checks, and prints one JSON line ``{"passed": [...],
"failed": [...]}`` as the last line of stdout; ``tests/test_tensorflow.py`` reads it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's import pulls in JAX (tf.lite looks for jax.jit) and matplotlib (Keras's image
# gallery) where they are installed, both optional there (ImportError is caught) and unused by
# every scenario: hidden, a scenario process starts with less CPU (TensorFlow's import: 11 s ->
# 8 s of CPU on a 2-core machine). tests/tf_lean does the same for other processes.
for _unused in ("jax", "matplotlib"):
    sys.modules.setdefault(_unused, None)  # type: ignore[assignment]

import numpy as np  # noqa: E402


def setup(n: int) -> list[str]:
    """Split the CPU into ``n`` logical devices; their canonical names."""
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * n)
    from tensorflow.python.distribute import device_util

    return [device_util.resolve(d.name) for d in tf.config.list_logical_devices("CPU")]


def resident_bytes() -> int:
    """This process's resident memory now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def per_replica(values, devices):
    """A PerReplica with ``values[i]`` (tensor or array) placed on ``devices[i]``."""
    import tensorflow as tf
    from tensorflow.python.distribute.values import PerReplica

    out = []
    for v, d in zip(values, devices):
        with tf.device(d):
            out.append(tf.identity(v) if not isinstance(v, tf.IndexedSlices) else
                       tf.IndexedSlices(tf.identity(v.values), tf.identity(v.indices),
                                        v.dense_shape))
    return PerReplica(tuple(out))


def mirrored_copies(values, devices):
    """A Mirrored whose copy on ``devices[i]`` is ``values[i]`` (copies that may have diverged,
    as after an unsynchronised update); a Mirrored even for one device."""
    from tensorflow.python.distribute import values as values_lib

    return values_lib.Mirrored(per_replica(values, devices).values)


def fake_mirrored(value, devices):
    """TF's test helper: ``value`` on every device, regrouped (unwrapped for one device)."""
    import tensorflow as tf
    from tensorflow.python.distribute import distribute_utils
    from tensorflow.python.distribute import values as values_lib

    out = []
    for d in devices:
        with tf.device(d):
            out.append(tf.identity(tf.constant(value)))
    return distribute_utils.regroup(tuple(out), wrap_class=values_lib.Mirrored)


def assert_mirrored_equal(left, right, rtol: float = 0.0) -> None:
    """TF's ``_assert_mirrored_equal``: same type, same devices in order, equal (dense) values
    of the same dtype."""
    import tensorflow as tf
    from tensorflow.python.distribute import device_util
    from tensorflow.python.distribute import values as values_lib

    if isinstance(left, list):
        assert isinstance(right, list) and len(left) == len(right), (left, right)
        for a, b in zip(left, right):
            assert_mirrored_equal(a, b, rtol)
        return
    assert type(left) is type(right), (type(left), type(right))
    if isinstance(left, values_lib.Mirrored):
        left, right = list(left.values), list(right.values)
    else:
        left, right = [left], [right]
    assert len(left) == len(right), (len(left), len(right))
    for a, b in zip(left, right):
        da, db = device_util.resolve(a.device), device_util.resolve(b.device)
        assert da == db, f"result on {da}, expected on {db}"
        a, b = tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy()
        assert a.dtype == b.dtype, f"result is {a.dtype}, expected {b.dtype}"
        if rtol:
            np.testing.assert_allclose(a, b, rtol=rtol)
        else:
            np.testing.assert_array_equal(a, b)


class Report:
    """Collects named checks; ``check(name, fn)`` runs ``fn`` and records pass or failure."""

    def __init__(self):
        self.passed: list[str] = []
        self.failed: list[dict] = []
        self.seconds: dict[str, float] = {}  # each check's time: what makes a suite slow
        self.cpu: dict[str, float] = {}  # and its CPU time (all threads), which a busy machine
        # does not inflate as it does the seconds

    def check(self, name: str, fn, *args, **kwargs):
        start, cpu = time.perf_counter(), time.process_time()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # a scenario reports every failure, then exits non-zero
            self.failed.append({"name": name, "error": f"{type(exc).__name__}: {exc}",
                                "traceback": traceback.format_exc(limit=6)})
            return None
        finally:
            self.seconds[name] = round(time.perf_counter() - start, 3)
            self.cpu[name] = round(time.process_time() - cpu, 3)
        self.passed.append(name)
        return result

    def finish(self) -> None:
        for f in self.failed:
            print(f"FAILED {f['name']}: {f['error']}\n{f['traceback']}", file=sys.stderr)
        sys.stdout.flush()
        print(json.dumps({"passed": self.passed, "failed": self.failed, "seconds": self.seconds,
                          "cpu": self.cpu}))
        sys.stdout.flush()
        sys.exit(1 if self.failed else 0)


def expect_error(exc_type, fragment: str, fn, *args, **kwargs) -> None:
    """``fn(*args)`` raises ``exc_type`` with ``fragment`` in its message."""
    try:
        fn(*args, **kwargs)
    except exc_type as exc:
        assert fragment in str(exc), f"message {str(exc)!r} lacks {fragment!r}"
        return
    raise AssertionError(f"no {exc_type.__name__} raised")
