"""TensorFlow's batches on the timeline: each ``batch_reduce`` as a span listing the tensors
it packed (shape, dtype, bytes, how many replicas), around the collectives it made."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collectives.timeline.record_devices import marked


def batch(run: Callable, cdo: Any, op: Any, jobs: list, path: str) -> Callable:
    """``run`` (the host call or device call of a batch, whose arguments are every job's
    components, job after job) marked as ``batch_reduce`` while the timeline records."""

    def describe(*args: Any) -> dict:
        arrays = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        tensors, at, total = [], 0, 0
        for job in jobs:
            first = arrays[at] if at < len(arrays) else None
            at += len(job.components)
            nbytes = int(getattr(first, "nbytes", 0))
            total += nbytes
            tensors.append({"shape": list(getattr(first, "shape", ())),
                            "dtype": str(getattr(first, "dtype", "")), "bytes": nbytes,
                            "replicas": len(job.components)})
        return {"collective": "batch_reduce", "op": op.name.lower(), "path": path,
                "tensors": tensors, "bytes": total, "workers": cdo.num_workers}

    return marked(run, "batch_reduce", cdo.communicator, describe)
