"""The device path: dense values on GPUs are reduced where they are, never through the host.

``base.LibraryCrossDeviceOps`` sends a dense value here when ``kit_for`` finds a kit for
it: every replica on a GPU, a floating dtype, and CuPy able to use a GPU in this process.
Everything else keeps the host path (``host``), exactly as without GPUs.

A value whose destinations are its own devices is all-reduced, each device's result left on
its device (for ``NcclAllReduce``, NCCL's all-reduce). Otherwise (``ReductionToOneDevice``,
other destinations, and across workers) it is reduced onto one of its devices, the reduce
device (``reduce_to_device`` or the first destination, where it holds a replica), and
TensorFlow copies the result to each destination, device to device. Across workers the local
totals go through the ``Communicator`` staged in pinned host memory (``device_reduce``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import tensorflow as tf

from collectives.ops import ReduceOp as CoreOp

from . import convert, device_reduce, kits, marks
from .agreement import BatchAgreement, agree
from .device_call import Output, device_call, same_device
from .routes import ONE_DEVICE
from .world import call_timeout

__all__ = ["kit_for", "nccl_unavailable", "reduce_dense", "with_nccl_fallback"]

logger = logging.getLogger("collectives.adapters.tensorflow")
_LOGGED: set[str] = set()


def _is_gpu(device: str) -> bool:
    return bool(device) and (tf.DeviceSpec.from_string(device).device_type or "").upper() == "GPU"


def kit_for(components: Sequence, override=None):
    """The kit that reduces these replicas on their devices, or None for the host path.

    ``override`` (a kit) takes any devices: the device path on logical CPUs (``kits.NUMPY``).
    """
    first = components[0]
    if first.dtype not in kits.DTYPES or first.shape.num_elements() == 0:
        return None
    if override is not None:
        return override
    if all(_is_gpu(c.device) for c in components) and kits.gpu_unavailable() is None:
        return kits.CUPY
    return None


def nccl_unavailable(devices: Sequence[str]) -> str | None:
    """Why NCCL cannot all-reduce over TensorFlow's GPUs ``devices``, or None when it can."""
    reason = kits.gpu_unavailable()
    if reason is not None:
        return f"CuPy cannot reduce on the GPUs ({reason})"
    from . import dlpack

    gpus = [dlpack.cuda_device_of(d) for d in devices]
    if len(set(gpus)) < len(gpus):
        return ("the GPUs are logical GPUs sharing CUDA devices "
                f"({', '.join(f'{d} on {g}' for d, g in zip(devices, gpus))}) and NCCL needs a "
                "GPU of its own for every device")
    return kits.CUPY.nccl_missing()


def with_nccl_fallback(spec, kit, arrays) -> list:
    """``spec`` with NCCL replaced by the core's ring (what the name means to the core) where
    the kit cannot run NCCL over ``arrays``; said once per reason."""
    spec = list(spec)
    if not any("nccl" in r.algorithm.split("/") for r in spec):
        return spec
    reason = kit.nccl_unavailable(arrays)
    if reason is None:
        return spec
    message = f"'nccl' runs the library's ring on these GPUs because {reason}."
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.warning(message)
    return [r._replace(algorithm="/".join("ring" if a == "nccl" else a
                                          for a in r.algorithm.split("/"))) for r in spec]


def _groups(groups, n: int):
    return groups(n) if callable(groups) else groups


def reduce_dense(cdo, op: CoreOp, jobs: list, options, packing_override, results: list,
                 agreement: BatchAgreement | None) -> None:
    """Reduce ``jobs`` (``base._Job`` with a kit, all of one kit) into ``results``."""
    kit = jobs[0].kit
    workers = cdo.num_workers
    inputs: list = []
    outputs: list[Output] = []
    plans = []  # per job: (input positions, output positions, spread, root)
    for job in jobs:
        devices = [c.device for c in job.components]
        target = cdo.reduce_to_device or job.destinations[0]
        root = next((p for p, d in enumerate(devices) if same_device(d, target)), 0)
        spread = workers == 1 and job.matches and job.route != ONE_DEVICE
        first = job.components[0]
        places = devices if spread else [devices[root]]
        plans.append((range(len(inputs), len(inputs) + len(devices)),
                      range(len(outputs), len(outputs) + len(places)), spread, root))
        inputs.extend(job.components)
        outputs.extend(Output(first.dtype, first.shape, d) for d in places)
    # Values with the same route, device count, kind and root are reduced as one batch.
    batches: dict[tuple, list[int]] = {}
    for k, (job, (ins, _, spread, root)) in enumerate(zip(jobs, plans)):
        batches.setdefault((job.route, len(ins), spread, root), []).append(k)
    timeout = call_timeout(options)

    def run(arrays: list) -> list:
        per_job = [[arrays[i] for i in ins] for ins, *_ in plans]
        out: list = [None] * len(outputs)
        with cdo.workers.lock:
            if agreement is not None:
                shapes = {job.index: tuple(a[0].shape) for job, a in zip(jobs, per_job)}
                agree(cdo.communicator, agreement.signature(shapes), timeout=timeout)
            for (route, count, spread, root), members in batches.items():
                values = [per_job[k] for k in members]
                spec = with_nccl_fallback(route.spec, kit, values[0])
                packing = packing_override or route.packing
                if workers > 1:
                    reduced = device_reduce.reduce_batch_across_workers(
                        kit, values, op, spec, cdo.communicator, root=root, packing=packing,
                        workers_sum=cdo.workers.sum, timeout=timeout,
                        buffer=cdo.workers.pinned, compression=cdo.workers.compression)
                elif spread:
                    reduced = device_reduce.all_reduce_batch(
                        kit, values, op, spec, packing=packing,
                        groups=_groups(route.groups, count))
                else:
                    reduced = device_reduce.reduce_batch(
                        kit, values, op, spec, root=root, packing=packing,
                        groups=_groups(route.groups, count))
                for k, r in zip(members, reduced):
                    for slot, array in zip(plans[k][1], r if plans[k][2] else [r]):
                        out[slot] = kit.aligned(array)
        return out

    first_job, first_plan = jobs[0], plans[0]
    main = first_job.components[first_plan[3]].device
    run = marks.batch(run, cdo, op, jobs, "device")
    tensors = device_call(kit, run, inputs, outputs, main=main, name="collectives_device_reduce")
    for job, (_, outs, _, _) in zip(jobs, plans):
        results[job.index] = convert.mirrored(_on_destinations(
            [tensors[s] for s in outs], [outputs[s].device for s in outs], job.destinations))


def _on_destinations(tensors: list, places: list[str], destinations: Sequence[str]) -> list:
    """One tensor per destination: a result already there (each used once), else a copy."""
    free = list(range(len(tensors)))
    per_destination = []
    for d in destinations:
        k = next((k for k in free if same_device(places[k], d) and
                  same_device(tensors[k].device, d)), None)
        if k is None:
            per_destination.append(convert.place(tensors[0], d))
        else:
            free.remove(k)
            per_destination.append(tensors[k])
    return per_destination
