"""Run a reduction on the tensors' own devices, in eager mode and inside ``tf.function``.

``device_call`` hands ``fn`` the arrays of a kit (``kits``: CuPy arrays for GPU tensors)
on the tensors' memory, and turns the arrays ``fn`` returns into tensors on the devices asked
for, without copies through the host.

Eager mode: the kit waits for TensorFlow's work on the devices, adopts the tensors, runs
``fn``, waits for its own work, and hands the results to TensorFlow.

Inside ``tf.function`` the same happens at every step through ``tf.py_function`` ops, which
hand their Python function eager tensors *on the op's device*. TensorFlow copies every input
of an op to the op's device, and every output back to it, so one op cannot see several GPUs'
tensors where they are. So a call becomes one op per device:

* a *deposit* op on each input device but the main one adopts that device's tensors and
  leaves the arrays for the main op (it outputs its first input unchanged, as a token);
* the *main* op, on the main device, after every deposit, adopts its own tensors, runs ``fn``,
  returns the results that belong on the main device and leaves the others;
* a *fetch* op on each other device where results belong, after the main op, returns them.

The ops are chained after the previous library call of the graph (``convert``), so every
process issues its collectives in the same order. A call site keeps one step's arrays between
its ops: run one step of a graph at a time (as Keras does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import device_util

from . import convert

__all__ = ["Output", "device_call", "same_device"]


@dataclass(frozen=True)
class Output:
    """One result of a call: its dtype, its (possibly partial) static shape, its device."""

    dtype: tf.DType
    shape: tf.TensorShape
    device: str


def same_device(a: str, b: str) -> bool:
    return bool(a) and bool(b) and device_util.canonicalize(a) == device_util.canonicalize(b)


def _by_device(devices: Sequence[str]) -> dict[str, list[int]]:
    """Positions per canonical device, in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(devices):
        groups.setdefault(device_util.canonicalize(d), []).append(i)
    return groups


def device_call(kit, fn: Callable[[list], list], inputs: Sequence, outputs: Sequence[Output], *,
                main: str, name: str = "collectives_device") -> list:
    """``fn(arrays) -> arrays`` over ``inputs`` on their devices; ``outputs[k]``'s tensor on
    ``outputs[k].device`` (which must be the device of the memory ``fn`` returns for it).
    ``main`` (one of the inputs' devices) runs ``fn`` inside ``tf.function``."""
    inputs = list(inputs)
    if tf.executing_eagerly():
        kit.wait_for_tensorflow([t.device for t in inputs])
        results = fn([kit.from_tensor(t) for t in inputs])
        kit.finish(results)
        return [kit.to_tensor(r, o.device) for r, o in zip(results, outputs)]
    return _graph_call(kit, fn, inputs, list(outputs), device_util.canonicalize(main), name)


class _Stash:
    """What one step leaves between the ops of a call site (the last writer wins, so a failed
    step leaves nothing that a later step would read)."""

    def __init__(self) -> None:
        self.inputs: dict[str, list] = {}
        self.outputs: dict[str, list] = {}


def _graph_call(kit, fn, inputs: list, outputs: list[Output], main: str, name: str) -> list:
    feeds = _by_device([t.device for t in inputs])
    if main not in feeds:
        raise ValueError(f"the main device {main} holds none of the inputs")
    places = _by_device([o.device for o in outputs])
    stash = _Stash()
    previous = convert.previous_calls()
    tokens: list[Any] = []  # TensorFlow tensors
    for device, positions in feeds.items():
        if device == main:
            continue

        def deposit(*tensors, device=device):
            kit.wait_for_tensorflow([device])
            stash.inputs[device] = [kit.from_tensor(t) for t in tensors]
            return [tensors[0]]

        with tf.device(device), tf.control_dependencies(previous):
            token = tf.py_function(deposit, [inputs[i] for i in positions],
                                   Tout=[inputs[positions[0]].dtype], name=f"{name}_deposit")
        tokens.extend(token if isinstance(token, (list, tuple)) else [token])

    mine, here = feeds[main], places.get(main, [])

    def run(*tensors):
        kit.wait_for_tensorflow([main])
        arrays: list = [None] * len(inputs)
        for i, t in zip(mine, tensors):
            arrays[i] = kit.from_tensor(t)
        for device, positions in feeds.items():
            if device != main:
                for i, a in zip(positions, stash.inputs.pop(device)):
                    arrays[i] = a
        results = fn(arrays)
        kit.finish(results)
        for device, ks in places.items():
            if device != main:
                stash.outputs[device] = [results[k] for k in ks]
        if not here:
            return [tensors[0]]
        return [kit.to_tensor(results[k], main) for k in here]

    dtypes = [outputs[k].dtype for k in here] or [inputs[mine[0]].dtype]
    with tf.device(main), tf.control_dependencies(previous + [t.op for t in tokens]):
        ran = _as_list(tf.py_function(run, [inputs[i] for i in mine], Tout=dtypes, name=name))
    results: list = [None] * len(outputs)
    for k, tensor in zip(here, ran):
        tensor.set_shape(outputs[k].shape)
        results[k] = tensor
    after = [ran[0].op]
    for device, ks in places.items():
        if device == main:
            continue

        def fetch(device=device):
            return [kit.to_tensor(a, device) for a in stash.outputs.pop(device)]

        with tf.device(device), tf.control_dependencies([ran[0].op]):
            got = _as_list(tf.py_function(fetch, [], Tout=[outputs[k].dtype for k in ks],
                                          name=f"{name}_fetch"))
        for k, tensor in zip(ks, got):
            tensor.set_shape(outputs[k].shape)
            results[k] = tensor
        after.append(got[0].op)
    convert.record_call(after)
    return results


def _as_list(result) -> list:
    return list(result) if isinstance(result, (list, tuple)) else [result]
