"""Collectives of small Python objects (mixed into `Communicator`): ``all_gather_object``
and ``broadcast_object``, as torch.distributed's of the same names.

An object travels pickled, as a byte array through the array collectives: the all-gather
first gathers every rank's length (-1 where a rank could not pickle its object, so every
rank raises), then the bytes padded to the longest; the broadcast's root says in the
broadcast's opening when it cannot pickle its object, so every rank raises there too.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from ..algorithms.schedule import Collective
from ..runtime.validate import check_root
from .comm_parts import CommParts


class ObjectOps(CommParts):
    """all_gather_object, broadcast_object."""

    def all_gather_object(self, obj: Any, *, timeout: float | None = None) -> list[Any]:
        """Every rank's ``obj``, in rank order.

        Parameters
        ----------
        obj
            Anything picklable.
        timeout
            Seconds this call may wait for its peers (None: the communicator's timeout).

        Returns
        -------
        list
            Every rank's object, unpickled, in rank order.

        Raises
        ------
        TypeError
            ``obj`` cannot be pickled (its peers raise `PeerFailedError` naming this rank).
        CollectiveTimeoutError
            A peer did not arrive within ``timeout``.
        """
        blob, problem = _pickled(obj)
        # every rank learns every length, -1 where a rank could not pickle its object
        lengths = self.all_gather(np.array([-1 if blob is None else len(blob)], np.int64),
                                  timeout=timeout)
        if problem is not None:
            raise problem
        assert blob is not None  # (_pickled gives an array or a problem)
        failed = [str(r) for r in range(self.size) if lengths[r] < 0]
        if failed:
            from ..errors import PeerFailedError

            raise PeerFailedError(f"rank {self.rank}: all_gather_object cannot run because "
                                  f"rank {', '.join(failed)} could not pickle obj")
        width = int(lengths.max()) if len(lengths) else 0
        padded = np.zeros(width, np.uint8)
        padded[:len(blob)] = blob
        gathered = self.all_gather(padded, timeout=timeout).reshape(self.size, width)
        return [pickle.loads(gathered[r, :int(lengths[r])].tobytes()) for r in range(self.size)]

    def broadcast_object(self, obj: Any = None, root: int = 0, *,
                         timeout: float | None = None) -> Any:
        """The root's ``obj`` on every rank.

        Parameters
        ----------
        obj
            On the root, anything picklable; ignored elsewhere.
        root
            The rank whose object everyone gets.
        timeout
            Seconds this call may wait for its peers (None: the communicator's timeout).

        Returns
        -------
        Any
            The root's object (on the root, ``obj`` itself).

        Raises
        ------
        TypeError
            The root's ``obj`` cannot be pickled (every rank raises).
        CollectiveTimeoutError
            A peer did not arrive within ``timeout``.
        """
        from .spmd_from_root import build_rooted

        mine = _is_root(root, self.rank, self.size)  # (a bad root: refused in the opening)
        blob, problem = _pickled(obj) if mine else (None, None)
        # a root that cannot pickle says so in the broadcast's opening: every rank raises
        got = self.calls.start("broadcast", build_rooted(self, Collective.BROADCAST, blob, root, "auto",
                                                    None, problem=problem), False, timeout)
        return obj if mine else pickle.loads(got.tobytes())


def _is_root(root: Any, rank: int, size: int) -> bool:
    """Whether this rank is ``root``; False for a root that is no rank (an array's ``==``
    raised here, on its rank alone, before the call could tell its peers)."""
    try:
        return check_root(root, size) == rank
    except (TypeError, ValueError):
        return False


def _pickled(obj: Any) -> tuple[np.ndarray | None, TypeError | None]:
    """``obj`` pickled as bytes, or the TypeError naming it that says why it cannot be."""
    try:
        return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8), None
    except Exception as exc:  # noqa: BLE001 - pickling raises many kinds; each is the cause
        error = TypeError(f"obj cannot be pickled: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return None, error
