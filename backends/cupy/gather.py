"""A batch's bucket in one kernel launch: many arrays of one GPU gathered through a table of
their addresses.

``cupy.concatenate`` of a gradient list's arrays costs the host about 4 µs per array (its
checks and bookkeeping run per array in Python and Cython), which is most of a fused
all-reduce's time for 161 small tensors. Here the host only reads each array's address and
size; one table (the ``n`` source addresses, then the ``n + 1`` offsets where each starts in
the bucket, in words) goes to the GPU with the launch, and each thread finds its element's
source by a binary search over the offsets (empty arrays never match: their offset equals
the next one's).

Elements are moved as words of 1, 2, 4 or 8 bytes (16-byte complex values as two 8-byte
words), so one kernel per word size serves every dtype. The sources must be C-contiguous
(``CupyArrays.fuse`` flattens the others first) and on the bucket's GPU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np

SOURCE = r"""
extern "C" __global__ void collectives_gather_{bits}(
    const unsigned long long* table, const int n, {word}* dst, const long long total) {{
  const unsigned long long* starts = table + n;  // n + 1 offsets, in words
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += stride) {{
    int lo = 0, hi = n;  // starts[lo] <= i < starts[hi]
    while (hi - lo > 1) {{
      const int mid = (lo + hi) >> 1;
      if ((long long)starts[mid] <= i) lo = mid; else hi = mid;
    }}
    dst[i] = ((const {word}*)table[lo])[i - (long long)starts[lo]];
  }}
}}
"""
WORDS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
THREADS = 256
MAX_BLOCKS = 4096  # (a grid-stride loop covers the rest)


def available() -> bool:
    """Whether the array module compiles kernels of its own (CuPy does; a stand-in may not)."""
    import cupy

    return hasattr(cupy, "RawKernel")


@cache
def _kernel(word_bytes: int) -> Any:
    import cupy

    bits = 8 * word_bytes
    return cupy.RawKernel(SOURCE.format(bits=bits, word=WORDS[word_bytes]),
                          f"collectives_gather_{bits}")


def gather(flats: Sequence[Any], out: Any) -> Any:
    """``out`` (1-D, C-contiguous, of the arrays' dtype, on their GPU, the current device)
    filled with ``flats`` (C-contiguous, of any shape, one after another), on the current
    stream."""

    itemsize = out.dtype.itemsize
    word = min(itemsize, 8)
    per_item = itemsize // word
    n = len(flats)
    table = np.empty(2 * n + 1, np.uint64)
    table[:n] = [a.data.ptr for a in flats]
    sizes = np.fromiter((a.size for a in flats), np.int64, n)
    table[n] = 0
    np.cumsum(sizes * per_item, out=table[n + 1:].view(np.int64))
    total = int(table[2 * n])
    if total:
        blocks = min((total + THREADS - 1) // THREADS, MAX_BLOCKS)
        _kernel(word)((blocks,), (THREADS,),
                      (_on_device(table, out.device.id), np.int32(n), out, np.int64(total)))
    return out


_TABLES: OrderedDict[tuple[int, bytes], Any] = OrderedDict()
KEPT_TABLES = 16  # (a training loop gathers the same few lists, from the same addresses)


def _on_device(table: np.ndarray, device: int) -> Any:
    """The table on the GPU: the copy made for the same table last time, if it is among the
    last ``KEPT_TABLES`` (a copy to the device costs the host tens of µs; the kernel only
    reads it), else a new one."""
    import cupy

    key = (device, table.tobytes())
    copy = _TABLES.get(key)
    if copy is None:
        copy = _TABLES[key] = cupy.asarray(table)
        if len(_TABLES) > KEPT_TABLES:
            _TABLES.popitem(last=False)
    else:
        _TABLES.move_to_end(key)
    return copy
