"""What runs a multi-device reduction over CuPy arrays: one ordered list of runners per
collective; the first that takes the call runs it.

A call is checked once (``call_parts.prepare``) and described once (``DeviceCall``); then
each runner's ``skip(call)`` says why it does not run it (None: it does), and ``run(call)``
runs it, over this backend's primitives (NCCL's group calls, the fused kernels, copies) or
the library's schedules (``collectives.runtime.execute.device_calls``), never checking the
arrays again.

``all_reduce``:

1. ``one_gpu``: ``auto`` over logical devices that all share one GPU: one kernel reads every
   input (``one_gpu.py``);
2. ``nccl``: NCCL's all-reduce, one GPU per array (``"nccl"``, an ``"nccl/X"`` without
   groups, or ``auto`` where every array has a GPU of its own and NCCL reduces the dtype
   exactly);
3. ``nccl/X``: NCCL inside each group, the library's ``X`` across the groups' first devices,
   NCCL's broadcast back (TensorFlow's ``"nccl/xring"``);
4. ``library``: the library's algorithms (``auto``: the cost model's).

``reduce``: ``nccl``, then ``library``. ``choose`` gives the runner and why each before it
was skipped; ``explain(values, op, algorithm)`` says it without running anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from collectives.ops import ReduceOp, result_dtype
from collectives.overlap import overlaps, unsafe_outputs
from collectives.runtime.calls import first_taker
from collectives.runtime.execute.device_calls import root_output, run_all_reduce, run_reduce
from collectives.runtime.validate import check_root, resolve_groups

from . import group, one_gpu
from .call_parts import (
    deliver,
    gpu_arrays,
    library_devices,
    nccl_request,
    outputs,
    prepare,
    use_nccl,
)


@dataclass
class DeviceCall:
    """A checked multi-device reduction: its arrays (``values``, of ``shape`` and ``dtype``),
    ``op``, the ``algorithm`` asked for (and what it says of NCCL: ``request``) and its
    options."""

    collective: str  # "all_reduce" or "reduce"
    values: Sequence
    shape: tuple[int, ...]
    dtype: np.dtype
    op: ReduceOp
    algorithm: Any
    out: Any = None
    root: int = 0
    shards: int = 0
    groups: Any = None
    accumulation_fn: Any = None
    request: str | None = field(init=False)
    # the results ``out`` gives, checked by a runner's ``skip`` (``OneGpu``), for its ``run``
    checked_results: list | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.request = nccl_request(self.algorithm, math.prod(self.shape))


class Runner(Protocol):
    name: str

    def skip(self, call: DeviceCall) -> str | None:
        """Why this runner does not run ``call`` (None: it runs it); raises where the call
        asks for it by name and it cannot run it (NCCL with two arrays on one GPU)."""
        ...

    def run(self, call: DeviceCall) -> Any:
        """The results (a list, one per device) or the result (on the root)."""
        ...


class OneGpu:
    """Logical devices sharing one GPU, for ``auto``: one kernel reads every input."""

    name = "one_gpu"

    def skip(self, call: DeviceCall) -> str | None:
        if call.request != "auto":
            return f"not auto ({call.algorithm!r})"
        if call.accumulation_fn is not None:
            return "an accumulation_fn runs the library's algorithms"
        if not one_gpu.on_one_gpu(call.values):
            return "the arrays are not all on one GPU"
        out = call.out
        if out is not None:
            results = outputs(gpu_arrays(), out, call.values, call.shape,
                              result_dtype(call.op, call.dtype))
            if not all(r is v for r, v in zip(results, call.values)) and unsafe_outputs(
                    gpu_arrays(), call.values, results):
                return "an out that aliases the inputs (not in place): the library buffers it"
            call.checked_results = results  # (checked once: run takes them)
        return None

    def run(self, call: DeviceCall) -> list:
        arrays = gpu_arrays()
        results = call.checked_results
        if results is None:
            results = outputs(arrays, call.out, call.values, call.shape,
                              result_dtype(call.op, call.dtype))
        one_gpu.all_reduce(arrays, call.values, results, call.op)
        return results


class Nccl:
    """NCCL's own collective, one GPU per array."""

    name = "nccl"

    def skip(self, call: DeviceCall) -> str | None:
        two_level = (call.request or "").startswith("nccl/")
        if two_level and (call.collective == "reduce" or call.groups is not None):
            return f"{call.request} asks for NCCL within groups only"
        return _why_not_nccl(call, call.groups if call.collective == "all_reduce" else None)

    def run(self, call: DeviceCall) -> Any:
        arrays = gpu_arrays()
        final = result_dtype(call.op, call.dtype)
        values, n = call.values, len(call.values)
        if call.collective == "reduce":
            root = call.root
            result = (arrays.result(call.shape, final, like=values[root]) if call.out is None
                      else root_output(arrays, call.out, values, root, call.shape, final))
            flats = [arrays.flat(v) for v in values]
            in_place = result is values[root] or not overlaps(arrays, result, values[root])
            total = (result.reshape(-1) if final == call.dtype and in_place
                     else arrays.result((flats[root].size,), call.dtype, like=flats[root]))
            group.reduce(arrays, flats, total, root, call.op.wire_op)
            deliver(arrays, call.op, [total], [result], n)
            return result
        results = outputs(arrays, call.out, values, call.shape, final)
        # NCCL reads and writes through pointers: C-contiguous arrays go as they are (results
        # are C-contiguous: new, or an ``out`` that outputs() checked)
        flats = [v if v.flags.c_contiguous else arrays.flat(v) for v in values]
        work = _work(arrays, call, flats, results, final, hybrid=False)
        group.all_reduce(arrays, flats, work, call.op.wire_op)
        deliver(arrays, call.op, work, results, n)
        return results


class NcclTwoLevel:
    """NCCL inside each group, the library's algorithm across the groups' first devices."""

    name = "nccl/X"

    def skip(self, call: DeviceCall) -> str | None:
        if not (call.request or "").startswith("nccl/") or call.groups is None:
            return "no 'nccl/X' with groups asked for"
        return _why_not_nccl(call, call.groups)

    def run(self, call: DeviceCall) -> list:
        arrays = gpu_arrays()
        final = result_dtype(call.op, call.dtype)
        results = outputs(arrays, call.out, call.values, call.shape, final)
        flats = [arrays.flat(v) for v in call.values]
        work = _work(arrays, call, flats, results, final, hybrid=True)
        assert call.request is not None  # (skip: an "nccl/X" request)
        outer = call.request.split("/", 1)[1]
        layout = resolve_groups(call.groups, len(flats))
        assert layout is not None  # a two-level call has groups
        for members in layout:
            if len(members) == 1:
                arrays.copy(work[members[0]], flats[members[0]])
            else:
                group.reduce(arrays, [flats[p] for p in members], work[members[0]], 0,
                             call.op.wire_op)
        leaders = [work[members[0]] for members in layout]
        if len(leaders) > 1:
            run_all_reduce(library_devices(), leaders, leaders[0].shape, leaders[0].dtype,
                           call.op.wire_op, outer, out=leaders, shards=call.shards)
        for members in layout:
            if len(members) > 1:
                group.broadcast([work[p] for p in members], 0)
        deliver(arrays, call.op, work, results, len(call.values))
        return results


class Library:
    """The library's algorithms over the devices (the cost model's choice for ``auto``)."""

    name = "library"

    def skip(self, call: DeviceCall) -> str | None:
        return None

    def run(self, call: DeviceCall) -> Any:
        if call.collective == "reduce":
            return run_reduce(library_devices(), call.values, call.shape, call.dtype, call.op,
                              call.root, call.algorithm, out=call.out, shards=call.shards,
                              groups=call.groups, accumulation_fn=call.accumulation_fn)
        return run_all_reduce(library_devices(), call.values, call.shape, call.dtype, call.op,
                              call.algorithm, out=call.out, shards=call.shards,
                              groups=call.groups, accumulation_fn=call.accumulation_fn)


def _why_not_nccl(call: DeviceCall, groups: Any) -> str | None:
    """Why NCCL does not run ``call`` (None: it does); raises where it was asked for by name
    and cannot run it (``use_nccl``)."""
    if call.accumulation_fn is not None:
        return "an accumulation_fn runs the library's algorithms"
    if not use_nccl(call.request, call.values, call.dtype, call.op, groups):
        return ("not asked for, or NCCL cannot reduce this dtype and op exactly, or the "
                "arrays share a GPU")
    return None


def _work(arrays: Any, call: DeviceCall, flats: list, results: list, final: np.dtype,
          hybrid: bool) -> list:
    """Where NCCL writes: the results themselves where that is safe (new ones overlap
    nothing), else buffers of the call's own."""
    same = final == call.dtype and (call.out is None or
                                    not unsafe_outputs(arrays, call.values, results))
    if same:
        return [r.reshape(-1) for r in results] if hybrid else results
    return [arrays.result((f.size,), call.dtype, like=f) for f in flats]


RUNNERS: dict[str, tuple[Runner, ...]] = {
    "all_reduce": (OneGpu(), Nccl(), NcclTwoLevel(), Library()),
    "reduce": (Nccl(), Library()),
}


def choose(call: DeviceCall) -> tuple[Runner, tuple[tuple[str, str], ...]]:
    """The first runner of the call's collective that takes it, and why each before it did
    not (``(runner, reason)``, in order)."""
    return first_taker(RUNNERS[call.collective], lambda r: r.skip(call))  # (library: all)


def explain(values: Sequence, op: ReduceOp | str = "sum", algorithm: Any = "auto", *,
            collective: str = "all_reduce", root: int = 0, groups: Any = None) -> str:
    """Which runner would run this call over CuPy arrays, and why those before it would not;
    nothing runs."""
    values, shape, dtype, parsed = prepare(values, op)
    call = DeviceCall(collective, values, shape, dtype, parsed, algorithm,
                      root=check_root(root, len(values)), groups=groups)
    runner, skipped = choose(call)
    lines = [f"{collective} over {len(values)} CuPy arrays runs on the {runner.name} runner"]
    lines += [f"  {name} skipped: {why}" for name, why in skipped]
    return "\n".join(lines)
