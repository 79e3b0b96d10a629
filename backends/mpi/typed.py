"""What a point-to-point message says about itself: the header its first piece carries.

MPI matches a receive by source and tag and checks only that the message fits: a float32[4]
received into an int32[4] would land as reinterpreted bits. So each message of the ``p2p``
channel starts with a small header (element count, a hash of the dtype, the dtype's name),
and the receiver compares it with its own before the data counts as received, as thread
ranks compare the arrays themselves.

A message of up to ``SMALL`` bytes travels as one MPI message, header and data together
(copied on both sides: a microsecond or two), so the two are matched, or withdrawn, together.
A larger one sends its header alone, then its data as it is, without copies; once the header
has arrived, the receiver lets the data land whatever happens (see ``channel.py``).
"""

from __future__ import annotations

import zlib

import numpy as np

HEADER = 64  # bytes: count, dtype hash, itemsize (int64 each), then the dtype's name
SMALL = 16 << 10  # messages up to this many bytes travel with their header, in one piece
KEY = 16  # the header's bytes that must match: count and dtype hash
_NAME = slice(24, HEADER)
_HEADERS: dict[tuple[np.dtype, int], tuple[np.ndarray, bytes]] = {}  # built once per kind


def header(data: np.ndarray) -> tuple[np.ndarray, bytes]:
    """The header of a message of ``data`` (a flat array), and its key bytes."""
    kind = (data.dtype, data.size)
    made = _HEADERS.get(kind)
    if made is None:
        head = np.zeros(HEADER, np.uint8)
        words = head[:24].view(np.int64)
        words[0], words[1], words[2] = data.size, _hash(data.dtype), data.dtype.itemsize
        name = str(data.dtype).encode("utf-8", "replace")[:HEADER - 24]
        head[24:24 + len(name)] = np.frombuffer(name, np.uint8)
        if len(_HEADERS) >= 4096:  # a program sending ever new lengths: start afresh
            _HEADERS.clear()
        made = _HEADERS[kind] = (head, head[:KEY].tobytes())
    return made


def first_piece(data: np.ndarray, raw: np.ndarray, head: int) -> np.ndarray:
    """The header and the first ``head`` bytes of ``raw`` (``data``'s bytes), in one buffer."""
    buf = np.empty(HEADER + head, np.uint8)
    buf[:HEADER] = header(data)[0]
    buf[HEADER:] = raw[:head]
    return buf


def difference(got: np.ndarray, data: np.ndarray) -> str | None:
    """Why the header ``got`` (what arrived, possibly cut short) does not describe a message
    for ``data``, or None."""
    want, key = header(data)
    if len(got) < HEADER or got[:KEY].tobytes() == key:
        return None  # (too short to tell: the sizes differ, and the caller says so)
    theirs, mine = got[:24].view(np.int64), want[:24].view(np.int64)
    return (f"it sent {int(theirs[0])} elements of {_name(got)} where {int(mine[0])} of "
            f"{_name(want)} were expected (ranks passed different shapes or dtypes)")


def split(nbytes: int, max_count: int) -> tuple[int, list[tuple[int, int]]]:
    """How a message of ``nbytes`` travels: the bytes riding with the header (all or none),
    and the byte ranges of the pieces after it (at most ``max_count`` bytes each)."""
    if nbytes <= SMALL:
        return nbytes, []
    return 0, [(a, min(a + max_count, nbytes)) for a in range(0, nbytes, max_count)]


def _hash(dtype: np.dtype) -> int:
    return zlib.crc32(repr(dtype).encode())


def _name(head: np.ndarray) -> str:
    return bytes(head[_NAME]).rstrip(b"\0").decode("utf-8", "replace") or "?"
