"""All-reduce with wire compression (``compression="fp16"|"bf16"``), both ways of calling.

What compression means is ``collectives.compression``'s business; here each way of calling
compresses the contributions, runs the ordinary all-reduce on them as a SUM, and casts the
result back. SPMD: the call is described, agreed and run on the compressed buffer, so ranks
that disagree about compressing disagree about the dtype and are told so before data moves,
and an asynchronous call casts back when it finishes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from ..algorithms.schedule import Collective
from ..compression import compress, decompress, wire_dtype
from ..ops import ReduceOp
from ..registry import backend_for_arrays
from ..runtime.calls import compression_text
from ..runtime.execute import DeviceBackend
from ..runtime.execute.device_calls import outputs
from ..runtime.results import Decompressed
from ..runtime.validate import as_array, check_op, same_layout


def spmd_all_reduce(comm: Any, x: Any, op: Any, algorithm: Any, compression: Any, *,
                    out: Any, shards: int, groups: Any, timeout: float | None,
                    async_op: bool) -> Any:
    """``comm.all_reduce(x, op, algorithm, compression=...)``: see ``Communicator.all_reduce``."""
    def build(seq):
        arrays = comm.arrays
        xa = comm.adapt(x, "x")
        parsed = ReduceOp.parse(op)
        wire = wire_dtype(compression, parsed, xa.dtype, "x")
        divisor = comm.size if parsed is ReduceOp.MEAN else 1
        small = compress(arrays, xa, wire, divisor, parts=comm.size)
        call = comm.calls.validated(Collective.ALL_REDUCE, small, ReduceOp.SUM, algorithm, shards=shards,
                                    groups=groups,  # (any spelling of one wire agrees)
                                    compression=compression_text(wire, xa.dtype, parsed))
        target, late = comm.calls.target(out, call.shape, xa.dtype)
        data = comm.calls.data_stage(call, seq, None, small.reshape(-1))
        return call, [data], Decompressed(arrays, small, call.shape, xa.dtype, xa, target, late)

    return comm.calls.start("all_reduce", build, async_op, timeout)


def multi_device_all_reduce(all_reduce: Callable, values: Sequence, op: Any, algorithm: Any,
                            compression: Any, *, out: Sequence | None, shared_result: bool,
                            **kwargs: Any) -> list:
    """``collectives.all_reduce(values, op, algorithm, compression=...)``: ``all_reduce`` (the
    public one) runs on the compressed values as a SUM; everything is checked first."""
    if kwargs.get("accumulation_fn") is not None:
        raise ValueError("compression= and accumulation_fn= do not combine: the wire's "
                         "additions are the library's; pass one of them")
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise TypeError("values must be a non-empty list with one array per device")
    values = [as_array(v, f"values[{i}]") for i, v in enumerate(values)]
    shape, dtype = same_layout(values, "values", op)
    parsed = check_op(op, dtype, "values")
    wire = wire_dtype(compression, parsed, dtype, "values")
    if wire is None:
        return all_reduce(values, parsed, algorithm, out=out, shared_result=shared_result,
                          **kwargs)
    arrays = cast(DeviceBackend, backend_for_arrays(values)).arrays
    if out is not None and shared_result:
        raise ValueError("shared_result=True returns views of one new buffer; it takes no out=")
    # out= checked (or the results made) before any data moves
    results = None if shared_result else outputs(arrays, out, values, shape, dtype)
    divisor = len(values) if parsed is ReduceOp.MEAN else 1
    small = [compress(arrays, v, wire, divisor, parts=len(values)) for v in values]
    reduced = all_reduce(small, ReduceOp.SUM, algorithm, shared_result=shared_result, **kwargs)
    if shared_result:
        result = decompress(arrays, reduced[0], arrays.result(shape, dtype, like=values[0]))
        view = result.view()
        view.flags.writeable = False
        return [view] * len(values)
    assert results is not None  # (made above where the result is not shared)
    return [decompress(arrays, r, o) for r, o in zip(reduced, results)]
