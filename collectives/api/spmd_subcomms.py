"""What a communicator makes collectively: new communicators (``dup``, ``split``) and arrays
its ranks share (``shared_empty``), mixed into ``Communicator``.

All are collective, and agreed like any call before the transport makes anything: every rank
takes part in one small agreement (with the communicator's timeout, hearing failure notices)
that carries whether its arguments were good. So a bad ``color`` on one rank raises there and
a ``PeerFailedError`` naming it everywhere else, ranks calling ``split`` against ``dup`` or
another collective raise ``CollectiveMismatchError``, and a rank that calls alone times out,
instead of leaving its peers inside ``MPI_Comm_split`` forever. The agreement runs whatever
``check=`` says: a transport's own split, dup or shared window cannot be left half-done.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..runtime.agreement import Agreement
from ..runtime.calls import check_of
from ..runtime.validate import check_communicable
from .comm_parts import CommParts

C = TypeVar("C", bound="SubcommOps")  # the communicator's own class
T = TypeVar("T")

INT_LIMIT = 2 ** 31  # colors and keys are C ints in MPI


class _Making:
    """What a dup or split is, for its agreement and for messages."""

    agrees_itself = True  # its only stage is its agreement

    def __init__(self, what: str):
        self.what = what
        self.signature = (what, None, None, None, None, None, 0, None, None)
        self.check = check_of(self.signature)
        self.run_as = what

    def describe(self) -> str:
        return self.what


class SubcommOps(CommParts):
    """dup and split."""

    def dup(self: C) -> C:
        """A new communicator over the same ranks, with this one's options. Collective.

        Its calls never mix with this one's: give each thread, or each library, its own.

        Returns
        -------
        Communicator
            The new communicator (of this one's class).

        Raises
        ------
        CollectiveTimeoutError
            A rank did not call it in time.
        """
        transport = self._agree_then("dup", None, self.transport.dup)
        return self._child(transport)

    def split(self: C, color: int | None, key: int = 0) -> C | None:
        """MPI_Comm_split: the ranks passing the same ``color`` form a new communicator.
        Collective over this communicator; the child has this one's options, and its
        failures never break this one.

        Parameters
        ----------
        color
            The group to join (a non-negative int); None: not a member.
        key
            Orders the ranks of the new communicator (then by rank here).

        Returns
        -------
        Communicator or None
            The new communicator; None where ``color`` is None.

        Raises
        ------
        TypeError
            ``color`` or ``key`` is not an int; ValueError where it is out of range (every
            other rank raises `PeerFailedError`).
        CollectiveTimeoutError
            A rank did not call it in time.
        """
        checked, error = _attempt(lambda: (_check_color(color), _check_key(key)))
        if checked is not None:
            color, key = checked
        child = self._agree_then("split", error, lambda: self.transport.split(color, key))
        if child is None:
            return None
        return self._child(child)

    def shared_empty(self, shape: Any, dtype: Any = np.float32) -> np.ndarray:
        """A zeroed NumPy array in memory every rank of this host maps (MPI: a shared window),
        so that an all-reduce of it reads the peers' parts where they lie. Collective.

        An all-reduce through shared memory (``algorithm="shm"``; ``auto`` from 256 KiB)
        whose input and ``out=`` are such arrays (of this communicator) on every rank, in
        place or one into another, copies nothing in or out of the library's buffers: each
        rank reduces its slice from every rank's array and writes it into every rank's result
        (S bytes read and S written per rank, the least a rank's share of an all-reduce
        moves). Every rank passes shared arrays, or none does (else
        `CollectiveMismatchError`). The memory
        stays until the process ends (a shared window is freed collectively, an array by its
        last reference): allocate once, as a training loop allocates its buckets. Where the
        transport has no shared memory of its own (thread ranks, which share one process's
        memory; NCCL), it is an ordinary array.

        Parameters
        ----------
        shape
            An int or a tuple of non-negative ints; ranks may pass different shapes.
        dtype
            Any fixed-size NumPy dtype.

        Returns
        -------
        numpy.ndarray
            C-contiguous, zeroed, writable.

        Raises
        ------
        TypeError, ValueError
            ``shape`` or ``dtype`` is not one (every other rank raises `PeerFailedError`).
        CollectiveTimeoutError
            A rank did not call it in time.
        """
        checked, error = _attempt(lambda: _check_size(_check_shape(shape), _check_dtype(dtype)))
        if checked is not None:
            shape, dtype = checked
        shared = self.transport.shared_memory
        if shared is None:  # (made before the agreement: memory that cannot be had is refused
            made, error = (None, error) if error is not None else _attempt(  # on every rank)
                lambda: np.zeros(shape, dtype))
            self._agree_then("shared_empty", error, lambda: None)
            assert made is not None  # (an error raised in the agreement)
            return made
        # (a bad shape or dtype raises in the agreement, on every rank: sized here, it raised
        # on this rank alone, and its peers waited in the agreement)
        nbytes = math.prod(shape) * dtype.itemsize if error is None else 0
        memory = self._agree_then("shared_empty", error, lambda: shared.allocate(nbytes))
        return memory.view(dtype).reshape(shape)

    def _child(self, transport: Any) -> Any:
        """A communicator over ``transport`` with this one's options and cost model's
        constants (the same links; measured natives are kept per size)."""
        child = type(self)(transport, timeout=self.timeout, check=self.check, name=self.name)
        child.fabric = self.fabric
        return child

    def _agree_then(self, what: str, error: BaseException | None, make) -> Any:
        """Agree (raising ``error`` on this rank, PeerFailedError on the others), then
        ``make()`` the transport's new communicator."""
        making = _Making(what)

        def build(seq):
            agreement = Agreement(self.calls.engine, seq, making.signature, making.check, error)
            return making, [agreement], make

        return self.calls.start(what, build, False, None)


def _attempt(check: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    """What ``check()`` returns, or the TypeError, ValueError or MemoryError it raised (which
    the agreement raises on this rank, and as ``PeerFailedError`` on the others)."""
    try:
        return check(), None
    except (TypeError, ValueError, MemoryError) as exc:
        return None, exc


def _check_size(shape: tuple[int, ...], dtype: np.dtype) -> tuple[tuple[int, ...], np.dtype]:
    """``(shape, dtype)``, where an array of them could exist: its bytes within an index."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > sys.maxsize:
        raise ValueError(f"shape={shape!r} of {dtype} makes {nbytes} bytes, more than an array "
                         f"can hold ({sys.maxsize}); pass a smaller shape")
    return shape, dtype


def _check_shape(shape: Any) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        raise TypeError(f"shape={shape!r} is not a shape; pass an int or a tuple of ints") from None
    if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in dims):
        raise TypeError(f"shape={shape!r} holds a non-integer; pass an int or a tuple of ints")
    if any(d < 0 for d in dims):
        raise ValueError(f"shape={shape!r} has a negative dimension; dimensions are 0 or more")
    return tuple(int(d) for d in dims)


def _check_dtype(dtype: Any) -> np.dtype:
    try:
        parsed = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype={dtype!r} is not a NumPy dtype ({exc}); pass one such as "
                        "numpy.float32") from None
    check_communicable(parsed, "dtype")
    return parsed


def _check_color(color: Any) -> int | None:
    if color is None:
        return None
    if isinstance(color, bool) or not isinstance(color, (int, np.integer)):
        raise TypeError(f"color={color!r} must be a non-negative integer, or None")
    if color < 0:
        raise ValueError(f"color={color!r} must be a non-negative integer, or None")
    if color >= INT_LIMIT:
        raise ValueError(f"color={color} is too large: colors must be below 2**31 (MPI "
                         "keeps them in a C int)")
    return int(color)


def _check_key(key: Any) -> int:
    if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
        raise TypeError(f"key={key!r} must be an integer")
    if not -INT_LIMIT <= key < INT_LIMIT:
        raise ValueError(f"key={key} is out of range: keys must fit a C int (-2**31 to "
                         "2**31 - 1, as MPI keeps them)")
    return int(key)
