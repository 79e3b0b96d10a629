"""A toy array library for the tests: arrays of a class of their own (not ``np.ndarray``),
shared with the library through DLPack, with an array kind that packs batches of them.

``ToyArray`` holds a NumPy array and offers what another library's arrays offer: ``shape``,
``dtype``, ``__dlpack__`` and ``__dlpack_device__``; this module's ``from_dlpack`` makes one
back (the library finds it by the arrays' module, as ``torch.from_dlpack``). ``KIND`` counts
the packing work it is asked for, so a test can see that a batch was packed on the toy side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from collectives.arrays import split_by_slicing


class ToyArray:
    def __init__(self, data: Any):
        self.data = np.asarray(data)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self.data.__dlpack_device__()

    def reshape(self, *shape: Any) -> ToyArray:
        return ToyArray(self.data.reshape(*shape))

    def __getitem__(self, key: Any) -> ToyArray:
        return ToyArray(self.data[key])


def from_dlpack(x: Any) -> ToyArray:
    return ToyArray(np.from_dlpack(x))


class ToyKind:
    """Packing on the toy side (``collectives.foreign.register_array_kind``)."""

    name = "toy"

    def __init__(self) -> None:
        self.concatenated = 0

    @staticmethod
    def detect(x: object) -> bool:
        return isinstance(x, ToyArray)

    def owns(self, x: object) -> bool:
        return isinstance(x, ToyArray)

    def dtype_of(self, x: ToyArray) -> np.dtype:
        return x.dtype

    def alone_bytes(self, x: ToyArray) -> int:
        return 1 << 20

    def flat(self, x: ToyArray) -> ToyArray:
        return ToyArray(np.ascontiguousarray(x.data).reshape(-1))

    def concatenate(self, arrays: Sequence[ToyArray], axis: int) -> ToyArray:
        self.concatenated += 1
        return ToyArray(np.concatenate([a.data for a in arrays], axis=axis))

    def fuse(self, arrays: Sequence[ToyArray]) -> ToyArray:
        return self.concatenate([self.flat(a) for a in arrays], 0)

    def split(self, buffer: ToyArray, shapes: Sequence[tuple[int, ...]]) -> list[ToyArray]:
        return split_by_slicing(buffer, shapes)

    def empty(self, shape: tuple[int, ...], dtype: Any, like: Any = None) -> ToyArray:
        return ToyArray(np.empty(shape, dtype))

    def copy(self, dst: ToyArray, src: ToyArray) -> None:
        dst.data[...] = src.data


KIND = ToyKind()
