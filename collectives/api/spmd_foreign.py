"""All-reduce of other libraries' arrays: how a `Communicator` call whose ``x`` or ``out`` is
not the transport's own kind of array crosses.

``ReductionOps.all_reduce`` sends such a call here, with ``own``: its all-reduce of the
transport's own arrays, inside the call's one refusal of bad arguments. A host array whose
kind has its own way across (``host_view``: PyTorch CPU tensors) runs on a NumPy view of its
memory, its result handed back; anything else is adopted at the edge (``call_foreign``:
DLPack), unless the transport's hot path reads it as it is (``for_kind``: PyTorch CUDA
tensors over NCCL, CPU tensors over MPI by address), which it learns at the first agreed call
of a signature.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..compression import requested
from ..foreign import array_kind, host_view
from ..foreign_calls import call_foreign
from ..runtime.hot_path import FastAllReduce
from ..runtime.validate import hot_key, no_shards, valid_timeout

# ReductionOps' all-reduce of the transport's own arrays: (x, op, algorithm, out, shards,
# groups, timeout, async_op, compression) -> result
Own = Callable[..., Any]


def foreign_all_reduce(comm: Any, own: Own, x: Any, op: Any, algorithm: Any, out: Any,
                       shards: int, groups: Any, timeout: float | None, async_op: bool,
                       compression: str | None) -> Any:
    """``all_reduce`` of another library's arrays: adopted at the edge (DLPack), unless the
    transport's hot path reads them as they are (``for_kind``: PyTorch CUDA tensors over
    NCCL), which it learns at the first agreed call of a signature."""
    key = None
    if (comm.transport.native is not None  # (a hot path is a native one: none without)
            and no_shards(shards) and groups is None and valid_timeout(timeout)
            and not requested(compression)):
        try:
            key = hot_key(x, op, algorithm)
            fast = comm.calls.hot_paths.get(key)
        except Exception:  # noqa: BLE001 - no hot path: an unhashable spec, or an array
            key = fast = None  # without a shape or dtype (a nested tensor's raises): the
            # edge below says why
        if (fast is not None and async_op is False and x.__class__ is fast.cls
                and (out is None or (out.__class__ is fast.cls and out.shape == fast.shape
                                     and out.dtype == fast.dtype))):
            comm.calls.last_hot = fast
            result = fast(x, out, timeout)
            if result is not None:
                return result
    result = None  # (without a native transport, all_reduce has tried the host view)
    if async_op is False and comm.transport.native is not None:
        result = viewed_all_reduce(comm, own, x, op, algorithm, out, shards, groups, timeout,
                                   compression)
    if result is None:
        result = call_foreign(type(comm).all_reduce, comm, x, (op, algorithm),
                              dict(out=out, shards=shards, groups=groups, timeout=timeout,
                                   async_op=async_op, compression=compression))
    if key is not None and key not in comm.calls.hot_paths:
        learn_kind(comm, x, key)
    return result

def viewed_all_reduce(comm: Any, own: Own, x: Any, op: Any, algorithm: Any, out: Any,
                      shards: int, groups: Any, timeout: float | None,
                      compression: str | None) -> Any:
    """A blocking ``all_reduce`` of a host array whose kind has its own way across
    (``host_view``: PyTorch CPU tensors): run on a NumPy view of it, the result handed
    back (or ``out=`` of the same kind filled). None where that way does not apply (a GPU
    tensor, another kind of ``out=``, a view the kind refuses): the edge's way then runs
    and names the fix."""
    way = host_view(x)
    if way is None or way.on_gpu(x) or not (out is None or (
            way.takes_out and out.__class__ is x.__class__ and not way.on_gpu(out))):
        return None
    try:
        view = way.as_numpy(x)
        out_view = None if out is None else view if out is x else way.as_numpy(out)
    except Exception:  # noqa: BLE001 - the edge's way raises, naming the fix
        return None
    result = own(view, op, algorithm, out_view, shards, groups, timeout, False, compression)
    return way.back(result, x) if out is None else out

def learn_kind(comm: Any, x: Any, key: tuple) -> None:
    """Bind the hot path of ``x``'s signature (``key``) to its array kind, where the
    adopted call has a hot path and the transport binds it to that kind."""
    kind = array_kind(x)
    if kind is None:
        comm.calls.hot_paths[key] = None
        return
    _, _, op, algorithm = key  # (as hot_key made them)
    adopted = (tuple(x.shape), kind.dtype_of(x), op, algorithm)
    if adopted == key or adopted not in comm.calls.hot_paths:
        return  # (a kind whose dtypes are NumPy's shares NumPy's signatures; or no agreed
        # call of that signature yet: the next one tries again)
    native = comm.calls.hot_paths[adopted]
    bound = native.bound.for_kind(kind) if native is not None else None
    if native is None or bound is None:
        comm.calls.hot_paths[key] = None
        return
    fast = FastAllReduce(comm, native.call, bound, x, op, algorithm)
    comm.calls.hot_paths[key] = comm.calls.last_hot = fast
