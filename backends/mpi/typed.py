"""What a point-to-point message says about itself: the header its first piece carries.

MPI matches a receive by source and tag and checks only that the message fits: a float32[4]
received into an int32[4] would land as reinterpreted bits. So each message of the ``p2p``
channel starts with a small header (element count, a hash of the dtype, the dtype's name),
and the receiver compares it with its own before the data counts as received, as thread
ranks compare the arrays themselves.

The header travels in one message with the first ``FIRST`` bytes of data (copied, on both
sides: a few microseconds at most), so the header and its data are matched, or withdrawn,
together; the rest of a larger message follows as it is, without copies.
"""

from __future__ import annotations

import zlib

import numpy as np

HEADER = 64  # bytes: count, dtype hash, itemsize (int64 each), then the dtype's name
FIRST = 64 << 10  # bytes of data that ride with the header
_NAME = slice(24, HEADER)


def header(data: np.ndarray) -> np.ndarray:
    """The header of a message of ``data`` (a flat array)."""
    head = np.zeros(HEADER, np.uint8)
    words = head[:24].view(np.int64)
    words[0], words[1], words[2] = data.size, _hash(data.dtype), data.dtype.itemsize
    name = str(data.dtype).encode("utf-8", "replace")[:HEADER - 24]
    head[24:24 + len(name)] = np.frombuffer(name, np.uint8)
    return head


def first_piece(data: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """The header and the first bytes of ``raw`` (``data``'s bytes), in one buffer."""
    size = min(len(raw), FIRST)
    buf = np.empty(HEADER + size, np.uint8)
    buf[:HEADER] = header(data)
    buf[HEADER:] = raw[:size]
    return buf


def difference(got: np.ndarray, want: np.ndarray) -> str | None:
    """Why the header ``got`` (what arrived, possibly cut short) is not ``want``, or None."""
    if len(got) < HEADER:
        return None  # too short to tell: the sizes differ, and the caller says so
    theirs, mine = got[:24].view(np.int64), want[:24].view(np.int64)
    if theirs[0] == mine[0] and theirs[1] == mine[1]:
        return None
    return (f"it sent {int(theirs[0])} elements of {_name(got)} where {int(mine[0])} of "
            f"{_name(want)} were expected (ranks passed different shapes or dtypes)")


def pieces(nbytes: int, max_count: int) -> list[tuple[int, int]]:
    """The byte ranges after the first piece, each at most ``max_count`` bytes."""
    start = min(nbytes, FIRST)
    return [(a, min(a + max_count, nbytes)) for a in range(start, nbytes, max_count)]


def _hash(dtype: np.dtype) -> int:
    return zlib.crc32(repr(dtype).encode())


def _name(head: np.ndarray) -> str:
    return bytes(head[_NAME]).rstrip(b"\0").decode("utf-8", "replace") or "?"
