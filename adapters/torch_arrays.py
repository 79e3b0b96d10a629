"""PyTorch tensors as an array kind: a batch of them is packed and unpacked by PyTorch itself.

A batched call on tensors (``Communicator.batch_all_reduce``) packs them in their own library,
one call per bucket (``flatten_dense_tensors``, as DDP packs; ``split_with_sizes`` unpacks),
so that only the fused buckets cross into the library (one DLPack exchange each, not one per
tensor) and the results come back as views of the reduced buckets. On a GPU the tensors'
current stream orders the packing, and DLPack's handshake orders the buckets with the
transport's stream.

A CUDA tensor's all-reduce on the NCCL transport also takes the hot path without crossing
through DLPack: the kind gives the transport each tensor's device, pointer and the caller's
current stream (``device_index``, ``pointer``, ``stream_handle``; see
``collectives.backends.nccl.hot_path``), read once per call from the tensor itself. A CPU
tensor's repeated small all-reduce on MPI does the same by address (``host_address``;
``collectives.backends.mpi.kind_path``).

A tensor crosses into the library as a NumPy view of its memory (``as_numpy``; DLPack), and
results come back as tensors on the same memory (``back``). NumPy has no bfloat16, so a
bfloat16 tensor crosses as its bits (an int16 view, viewed as ``ml_dtypes.bfloat16``, which
the library reduces) and comes back the same way: zero-copy both ways.

Found through the ``collectives.array_kinds`` entry points (the module of that name); it
imports PyTorch only from the tensors it is given.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np

from collectives.algorithms.fusion import DEFAULT_BUCKET_BYTES
from collectives.arrays import HOST_ALONE_BYTES
from collectives.extras import require
from collectives.ops import BFLOAT16
from collectives.result_pool import held_by_one


def _form(view: Any) -> tuple:
    """What a kept result must still be to be handed out again (its holder may change it in
    place): shape, strides, dtype, and not requiring grad."""
    return view.shape, view.stride(), view.dtype, view.requires_grad


def _torch() -> Any:
    return sys.modules["torch"]  # (a tensor exists: PyTorch is imported)


class TorchArrays:
    """The array operations packing needs (``collectives.arrays.ArrayBackend``'s ``owns``,
    ``dtype_of``, ``alone_bytes``, ``flat``, ``concatenate``, ``empty`` and ``copy``) on
    ``torch.Tensor``."""

    name = "torch"

    def __init__(self) -> None:
        self._dtypes: dict[Any, np.dtype] = {}

    @staticmethod
    def detect(x: object) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(x, torch.Tensor)

    def owns(self, x: object) -> bool:
        return self.detect(x)

    # --- crossing into the library and back (``collectives.foreign``) ----------------------

    @staticmethod
    def on_gpu(x: Any) -> bool:
        """Whether ``x``'s memory is a GPU's (CUDA or ROCm): what its DLPack device says,
        without ``__dlpack_device__``'s microseconds."""
        return x.is_cuda

    @staticmethod
    def as_numpy(x: Any) -> np.ndarray:
        """A NumPy view of the CPU tensor ``x``, sharing its memory (``Tensor.numpy``: what
        DLPack gives, in a fifth of the time); a bfloat16 tensor, which NumPy cannot hold, as
        its bits: an int16 view, viewed as ``ml_dtypes.bfloat16``. Raises as DLPack would
        where ``x`` requires grad (the edge names the fix)."""
        torch = _torch()
        if x.dtype is not torch.bfloat16:
            return x.numpy()
        if x.requires_grad:  # (its int16 view would not)
            raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
        # (without ml_dtypes: MissingDependencyError, naming the install)
        bfloat16 = BFLOAT16 or np.dtype(require("ml_dtypes", "bfloat16", "a bfloat16 tensor").bfloat16)
        return x.view(torch.int16).numpy().view(bfloat16)

    @staticmethod
    def back(result: Any, like: Any = None) -> Any:
        """``result`` (a NumPy or CuPy array) as a tensor on the same memory: a writable NumPy
        array through ``torch.from_numpy`` (half DLPack's time), a NumPy bfloat16 array as its
        bits, anything else through DLPack."""
        torch = _torch()
        if isinstance(result, np.ndarray) and result.flags.writeable:
            if BFLOAT16 is not None and result.dtype == BFLOAT16:
                return torch.from_numpy(result.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(result)
        return torch.from_dlpack(result)

    def dtype_of(self, x: Any) -> np.dtype:
        dtype = self._dtypes.get(x.dtype)
        if dtype is None:
            name = str(x.dtype).removeprefix("torch.")
            dtype = BFLOAT16 if name == "bfloat16" and BFLOAT16 is not None else np.dtype(
                {"bool": "bool", "complex64": "complex64"}.get(name, name))
            self._dtypes[x.dtype] = dtype
        return dtype

    def _torch_dtype(self, dtype: Any) -> Any:
        if not isinstance(dtype, np.dtype) and not isinstance(dtype, type):
            return dtype  # already PyTorch's
        wanted = np.dtype(dtype)
        for theirs, ours in self._dtypes.items():
            if ours == wanted:
                return theirs
        return getattr(_torch(), str(wanted))

    def alone_bytes(self, x: Any) -> int:
        """A CUDA tensor fuses up to the bucket size (a copy is cheap beside a call); a CPU
        tensor of ``HOST_ALONE_BYTES`` travels alone, as a NumPy array does."""
        return HOST_ALONE_BYTES if x.device.type == "cpu" else DEFAULT_BUCKET_BYTES

    def flat(self, x: Any) -> Any:
        return x.reshape(-1) if x.is_contiguous() else x.contiguous().reshape(-1)

    def concatenate(self, arrays: Sequence[Any], axis: int) -> Any:
        return _torch().cat(list(arrays), dim=axis)

    def fuse(self, arrays: Sequence[Any], out: Any = None, views: Any = None) -> Any:
        """A bucket in one call: PyTorch's own flattening (as DDP's), where it has one;
        ``out``: a kept bucket to fill, through its ``views`` where they are given (one
        ``_foreach_copy_``, as DDP copies gradients into its buckets), else with one ``cat``
        into it. (A ``cat`` needs each tensor flattened first: one PyTorch call per tensor,
        each of which lets go of the interpreter lock; on the CPU, 161 small tensors packed
        in 0.1 ms by ``_foreach_copy_`` against 0.36 ms by ``cat``.)"""
        torch = _torch()
        if out is not None:
            if views is not None and hasattr(torch, "_foreach_copy_"):
                torch._foreach_copy_(list(views), list(arrays))
                return out
            return torch.cat([self.flat(a) for a in arrays], out=out)
        flatten = getattr(torch._C._nn, "flatten_dense_tensors", None)
        if flatten is not None:
            return flatten(list(arrays))
        return torch.cat([self.flat(a) for a in arrays])

    # --- buckets kept from call to call (collectives.algorithms.reuse) ----------------------

    @staticmethod
    def address(x: Any) -> int:
        return x.data_ptr()

    def keep(self, bucket: Any, views: tuple) -> Any:
        """The stream the bucket is packed on and how many tensors share the bucket's memory
        and the views' (a bucket that came back through DLPack has views on memory of its
        own) now; None where PyTorch does not count them."""
        count = getattr(_torch()._C, "_storage_Use_Count", None)
        if count is None:
            return None
        return self._stream(bucket), self._users(bucket, views), tuple(map(_form, views))

    def unshared(self, bucket: Any, views: tuple, record: Any) -> bool:
        """Whether only the keeper refers to ``bucket`` and ``views``: no tensor made from
        them since (a view of a result shares its memory), no reference to a view (a kept
        result), packing goes on the same stream, and each view has the form it was handed
        out in (a caller may have resized one, or made it require grad, then dropped it)."""
        stream, users, forms = record
        return (self._stream(bucket) == stream and self._users(bucket, views) == users
                and held_by_one(views) and list(map(_form, views)) == list(forms))

    @staticmethod
    def _users(bucket: Any, views: tuple) -> tuple[int, ...]:
        """The tensors on the bucket's memory and the views' (PyTorch's use counts), and the
        holders of each one's Python storage object: there is one such object per storage,
        and it counts once among the uses however many hold it (``t.untyped_storage()``
        kept by a user would otherwise go unseen)."""
        count = _torch()._C._storage_Use_Count
        storage = bucket.untyped_storage()
        shared = (views[0] if views else bucket).untyped_storage()
        return (count(storage._cdata), count(shared._cdata), sys.getrefcount(storage),
                sys.getrefcount(shared))

    @staticmethod
    def _stream(x: Any) -> Any:
        """Which stream of ``x``'s GPU is current (None on the CPU): PyTorch's own record of
        it, where it has one (``torch.cuda.current_stream`` costs microseconds)."""
        if not x.is_cuda:
            return None
        torch = _torch()
        current = getattr(torch._C, "_cuda_getCurrentStream", None)
        if current is None:
            return torch.cuda.current_stream(x.device).cuda_stream
        return current(x.get_device())

    def split(self, buffer: Any, shapes: Sequence[tuple[int, ...]]) -> list:
        """A bucket's views in one call (``split_with_sizes``), each reshaped beyond 1-D."""
        sizes = [prod(shape) for shape in shapes]
        pieces = buffer.split(sizes)
        return [p if len(s) == 1 else p.view(s) for p, s in zip(pieces, shapes)]

    def empty(self, shape: tuple[int, ...], dtype: Any, like: Any = None) -> Any:
        device = like.device if like is not None else None
        return _torch().empty(shape, dtype=self._torch_dtype(dtype), device=device)

    def copy(self, dst: Any, src: Any) -> None:
        dst.copy_(src)

    # --- device pointers (the NCCL transport's hot path) -----------------------------------

    @staticmethod
    def device_index(x: Any) -> int:
        """The CUDA device of ``x``'s memory (-1: the CPU)."""
        return x.get_device()

    @staticmethod
    def pointer(x: Any) -> int:
        return x.data_ptr()

    @staticmethod
    def by_pointer(x: Any) -> bool:
        """Contiguous, untracked by autograd, no lazy conjugate or negation (as
        ``host_address``: the edge refuses a tensor that requires grad, naming the fix)."""
        return (x.is_contiguous() and not x.requires_grad and not x.is_conj()
                and not x.is_neg())

    @staticmethod
    def host_address(x: Any) -> int | None:
        """The address of CPU tensor ``x``'s first element where it may be read and written
        by address: memory of its own (not a meta, zero, empty, mkldnn or sparse tensor),
        contiguous, untracked by autograd, no lazy conjugate or negation (the edge refuses
        those, naming the fix); else None. (A meta or zero tensor's address is 0, which the
        compiled path read: the process crashed; an mkldnn tensor's raised inside the call,
        which broke the communicator.)"""
        if (not x.is_cpu or x.requires_grad or not x.is_contiguous() or x.is_conj()
                or x.is_neg()):  # (attributes, not x.device or x.layout: twice a call)
            return None
        try:
            address = x.data_ptr()
        except RuntimeError:  # (no storage: an mkldnn or sparse tensor)
            return None
        return address or None  # (0: a meta, zero or empty tensor)

    @staticmethod
    def empty_like(x: Any) -> Any:
        torch = _torch()
        if x.is_contiguous():  # (the layout empty_like preserves: about 0.5 µs cheaper to ask)
            return torch.empty_like(x)
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @staticmethod
    def stream_handle(device: int) -> int:
        """PyTorch's current CUDA stream on ``device``, as a raw ``cudaStream_t``: what the
        caller's work on its tensors is ordered by."""
        torch = _torch()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # (no Stream object)
        if raw is not None:
            return raw(device)
        return torch.cuda.current_stream(device).cuda_stream


ARRAYS = TorchArrays()
