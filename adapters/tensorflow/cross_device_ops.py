"""The library as ``tf.distribute`` cross-device ops: drop-in classes for ``MirroredStrategy``.

Every class here subclasses ``tf.distribute.CrossDeviceOps`` (through
``base.LibraryCrossDeviceOps``, which does the work) and differs only in the route each value
takes: which algorithm or spec, packing and groups reduce it.

TensorFlow's semantics are kept (MEAN divisors and dtypes, IndexedSlices as the concatenation
of the replicas' slices, the errors for bad arguments), except where TensorFlow has a known
bug; see ``docs/tensorflow.md`` for the list of differences.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from collectives.algorithms.spec import SpecRange, parse_spec, with_shards
from collectives.hints import Compression
from collectives.runtime.validate import check_function, check_shards, resolve_groups

from . import device_path, host
from .base import LibraryCrossDeviceOps
from .host import Packing
from .routes import ONE_DEVICE, Route

__all__ = [
    "AllReduceCrossDeviceOps",
    "CrossDeviceOps",
    "HierarchicalCopyAllReduce",
    "NcclAllReduce",
    "ReductionToOneDevice",
]

logger = logging.getLogger("collectives.adapters.tensorflow")
_LOGGED: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.warning(message)


def _halves(n: int):
    """Hierarchical copy's two groups, the second one taking the odd device."""
    if n < 2:
        return None
    h = n // 2
    return (tuple(range(h)), tuple(range(h, n)))


class ReductionToOneDevice(LibraryCrossDeviceOps):
    """TensorFlow's ``ReductionToOneDevice``: reduce on one device, then copy to each destination.

    The reduction runs on ``reduce_to_device`` (default: the first destination device).
    ``accumulation_fn`` (e.g. ``tf.math.add_n``) is called with the list of per-device tensors
    and must return their sum, in TensorFlow ops; without it the library's ``one_device``
    algorithm sums them (the same left-to-right n-ary sum as ``tf.math.add_n``). MEAN divides by
    the number of values.
    """

    def __init__(self, reduce_to_device: str | None = None,
                 accumulation_fn: Callable | None = None):
        if accumulation_fn is not None:  # (now: else the first reduce raised "not callable")
            check_function(accumulation_fn, "accumulation_fn", "a function of the list of "
                           "per-device tensors, such as tf.math.add_n, or None")
        super().__init__(route=ONE_DEVICE, reduce_to_device=reduce_to_device,
                         accumulation_fn=accumulation_fn)


def nccl_unavailable(devices: Sequence[str]) -> str | None:
    """Why NCCL cannot run over ``devices`` here, or None when it can: every device a GPU
    of its own (not logical GPUs sharing one), CuPy able to use them, NCCL loadable."""
    if not devices or any("gpu" not in d.lower() for d in devices):
        return f"the devices are not all GPUs ({', '.join(d or '<unplaced>' for d in devices)})"
    return device_path.nccl_unavailable(devices)


class AllReduceCrossDeviceOps(LibraryCrossDeviceOps):
    """TensorFlow's ``AllReduceCrossDeviceOps``: NCCL (``"nccl"``) or hierarchical copy (any other).

    Like TensorFlow it does not validate its arguments: any ``all_reduce_alg`` other than
    ``"nccl"`` means hierarchical copy, and a negative ``num_packs`` means no packing. A value
    whose destinations are not its own devices is reduced as by ``ReductionToOneDevice``.
    """

    def __init__(self, all_reduce_alg: str = "nccl", num_packs: int = 1):
        self._all_reduce_alg = all_reduce_alg
        self._num_packs = num_packs = _whole_packs(num_packs)
        packing = Packing(num_packs=max(num_packs, 0))
        if all_reduce_alg == "nccl":
            route = Route((SpecRange("nccl", 1, -1),), packing)
        else:
            # TF's hierarchical copy: sum each half of the devices on one of its devices, add
            # the two totals, copy back. Here an odd device joins the second half instead of
            # being dropped.
            route = Route((SpecRange("one_device/one_device", 1, -1),), packing, groups=_halves)
        super().__init__(route=route)

    def route_for(self, value_devices, destinations, matches):
        if not matches:
            return ONE_DEVICE  # not an all-reduce: TensorFlow reduces to one device
        if self._all_reduce_alg == "nccl":
            reason = nccl_unavailable(value_devices)
            if reason is not None:
                _log_once(f"NcclAllReduce falls back to ReductionToOneDevice because {reason}.")
                return ONE_DEVICE
        return self.route


def _whole_packs(num_packs: Any) -> int:
    """``num_packs`` as an int, where it is a whole number (TensorFlow's raised Python's own
    TypeError for "2", truncated 1.5 to 1, and so did this)."""
    if isinstance(num_packs, bool) or not isinstance(num_packs, (int, np.integer)):
        raise TypeError(f"num_packs={num_packs!r} must be a whole number (0 or more packs; "
                        "0: no packing)")
    return int(num_packs)


class NcclAllReduce(AllReduceCrossDeviceOps):
    """TensorFlow's ``NcclAllReduce``: NCCL's all-reduce through CuPy where every device is a
    GPU of its own; otherwise ``ReductionToOneDevice`` (on the GPU where the values are on
    GPUs), and it logs once why."""

    def __init__(self, num_packs: int = 1):
        if _whole_packs(num_packs) < 0:
            raise ValueError(f"NCCL all-reduce requires num_packs >= 0, but {num_packs} is specified")
        super().__init__(all_reduce_alg="nccl", num_packs=num_packs)


class HierarchicalCopyAllReduce(AllReduceCrossDeviceOps):
    """TensorFlow's ``HierarchicalCopyAllReduce``, correct for odd device counts too."""

    def __init__(self, num_packs: int = 1):
        if _whole_packs(num_packs) < 0:
            raise ValueError(f"HierarchicalCopy requires num_packs >= 0, but {num_packs} is specified")
        super().__init__(all_reduce_alg="hierarchical_copy", num_packs=num_packs)


class CrossDeviceOps(LibraryCrossDeviceOps):
    """Every algorithm and spec of the core as cross-device ops.

    ``algorithm``: a name (``"auto"``, ``"ring"``, ``"rechd"``, ``"tree"``, ``"shuffle"``,
    ``"one_device"``, TensorFlow's ``"xring"``, ``"pscpu"``, ``"nccl"``, ...), a two-level
    ``"A/B"`` (with ``groups``), or a spec: ``(alg, shards, limit)`` tuples or a string like
    ``"pscpu:2k:pscpu#2:64k:xring"`` (limits in elements). ``num_packs``,
    ``agg_small_grads_max_bytes``/``agg_small_grads_max_group`` and ``bytes_per_pack`` pack a
    batch's tensors into few buffers (``CommunicationOptions.bytes_per_pack`` overrides them).
    ``communicator``: reduce across worker processes as well (see ``MultiWorkerAllReduce``): a
    ``collectives.Communicator``, or ``"mpi"`` for ``collectives.backends.mpi.init()`` (every
    process constructs it); None (the default) for one process. Anything else raises here.
    ``compression`` ("fp16", "bf16"; Horovod's ``Compression.fp16``): the float32 and float64
    totals travel between workers in that narrower float (``collectives.compression``);
    the reduction over a worker's own devices, in shared memory, stays exact.
    """

    def __init__(self, algorithm="auto", *, num_packs: int = 0, agg_small_grads_max_bytes: int = 0,
                 agg_small_grads_max_group: int = 10, bytes_per_pack: int | None = None,
                 shards: int = 0, groups=None, communicator=None, workers_sum: str = "mean",
                 compression: Compression = None):
        packing = Packing(num_packs, agg_small_grads_max_bytes, agg_small_grads_max_group,
                          bytes_per_pack)
        host.check_packing(packing)  # errors now, not at the first step
        self.algorithm = algorithm
        super().__init__(route=Route(spec_ranges(algorithm, shards), packing,
                                     groups=_hashable_groups(groups)),
                         communicator=communicator, workers_sum=workers_sum,
                         compression=compression)


def spec_ranges(spec, shards: int = 0) -> tuple[SpecRange, ...]:
    """A checked, hashable spec; ``shards`` replaces the shards of a plain algorithm name."""
    ranges = parse_spec(spec)
    check_shards(shards)
    if shards:  # (none given, a plain name keeps TensorFlow's one shard)
        ranges = with_shards(spec, ranges, int(shards))
    return tuple(ranges)


def _hashable_groups(groups):
    """``groups`` checked as far as it can be before the device count is known (a positive
    group size, or a partition of 0..n-1: ``groups=0``, ``"x"`` and ``2.5`` raised only at the
    first step, inside TensorFlow's error), as a tuple of tuples."""
    if groups is None or callable(groups):
        return groups
    if isinstance(groups, (int, np.integer)) and not isinstance(groups, bool):
        resolve_groups(groups, 1)  # (a positive size)
        return int(groups)
    if isinstance(groups, (str, bytes)) or not isinstance(groups, (list, tuple)):
        raise TypeError(f"groups={groups!r} must be a group size or a list of lists of "
                        "device indices")
    resolve_groups(groups, sum(len(g) if isinstance(g, (list, tuple)) else 1 for g in groups))
    return tuple(tuple(g) for g in groups)
