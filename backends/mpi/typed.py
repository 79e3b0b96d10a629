"""What a point-to-point message says about itself: its header.

MPI matches a receive by source and tag and checks only that the message fits: a float32[4]
received into an int32[4] would land as reinterpreted bits. So each message of the
communicator's own ``send``/``recv`` starts with a small header (element count, a hash of the
dtype, the item size, the dtype's name), and the receiver compares it with its own array
before taking the data, as thread ranks compare the arrays themselves (``messages.py``).
"""

from __future__ import annotations

import zlib

import numpy as np

HEADER = 64  # bytes: count, dtype hash, itemsize (int64 each), then the dtype's name
SMALL = 64 << 10  # messages up to this many bytes travel with their header, in one piece
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


def first_piece(data: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """The first MPI message of ``data`` (``raw``: its bytes): the header, and the data too
    when it is small."""
    size = len(raw) if len(raw) <= SMALL else 0
    buf = np.empty(HEADER + size, np.uint8)
    buf[:HEADER] = header(data)[0]
    buf[HEADER:] = raw[:size]
    return buf


def announced(got: np.ndarray) -> int | None:
    """The number of data bytes the header ``got`` announces, or None when ``got`` is no
    header."""
    if len(got) < HEADER:
        return None
    words = got[:24].view(np.int64)
    count, itemsize = int(words[0]), int(words[2])
    return count * itemsize if count >= 0 and itemsize > 0 else None


def follows(nbytes: int) -> bool:
    """Whether a message of ``nbytes`` sends its data after its header, as MPI messages of
    their own (else the data rode with the header)."""
    return nbytes > SMALL


def difference(got: np.ndarray, data: np.ndarray) -> str | None:
    """Why the header ``got`` does not describe a message for ``data``, or None."""
    want, key = header(data)
    if len(got) >= HEADER and got[:KEY].tobytes() == key:
        return None
    if announced(got) is None:
        return f"it sent {len(got)} bytes that are not a message of this library"
    theirs, mine = got[:24].view(np.int64), want[:24].view(np.int64)
    return (f"it sent {int(theirs[0])} elements of {_name(got)} where {int(mine[0])} of "
            f"{_name(want)} were expected (ranks passed different shapes or dtypes)")


def _hash(dtype: np.dtype) -> int:
    return zlib.crc32(repr(dtype).encode())


def _name(head: np.ndarray) -> str:
    return bytes(head[_NAME]).rstrip(b"\0").decode("utf-8", "replace") or "?"
