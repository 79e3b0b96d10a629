"""The SPMD API: one process (or thread) per rank, each calling the same collectives.

A ``Communicator`` wraps a transport (thread ranks, MPI, ...). Each call:

1. validates its arguments into a ``Call`` (cached: a training loop
   repeats its calls, so this is paid once per distinct call);
2. agrees with every other rank on the call the first time its signature is seen (a mismatch,
   or a rank that could not validate its arguments, raises on every rank before any data
   moves); afterwards the signature's check value rides with the data instead;
3. runs this rank's plan of the chosen algorithm (or the transport's native collective) as an
   operation that a blocking call waits for, and ``async_op=True`` returns as a handle.

Extending it: a transport implements ``collectives.runtime.transport.Transport``; the public
hooks a subclass may override are ``Communicator.choose_algorithm`` (what ``auto`` runs)
and ``Communicator.adapt`` (which arrays a call accepts).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from ..algorithms.schedule import Collective
from ..arrays import plain_ndarray
from ..log import configure, debug_setting
from ..runtime.call_runner import CallRunner
from ..runtime.calls import Call
from ..runtime.results import Ready
from ..runtime.validate import check_default_timeout, check_flag
from ..timeline import recorder
from . import auto, runners
from .spmd_batch import BatchOps
from .spmd_copies import CopyOps
from .spmd_objects import ObjectOps
from .spmd_p2p import PointToPointOps
from .spmd_prepared import PreparedOps
from .spmd_reductions import ReductionOps
from .spmd_spread import SpreadOps
from .spmd_subcomms import SubcommOps


class Communicator(ReductionOps, BatchOps, SpreadOps, CopyOps, ObjectOps, PreparedOps,
                   PointToPointOps, SubcommOps, auto.ChoiceOps):
    """Collectives among ``size`` ranks; this one is ``rank``.

    Made by `collectives.init`, `collectives.run` or a backend's ``init``, rarely by hand.

    Parameters
    ----------
    transport
        What carries the bytes (``collectives.runtime.transport.Transport``).
    timeout
        Every call's default deadline, in seconds.
    check
        Agree on each call's arguments across ranks the first time a call signature is
        seen (``False`` skips it, and a mismatch then shows as a wrong length or a timeout
        instead of a clear error).
    name
        The communicator's name in messages (default: the transport's).

    Attributes
    ----------
    rank : int
        This rank, from 0.
    size : int
        How many ranks.
    local_rank, local_size : int
        This rank's place among the ranks of its node.
    last_algorithm : str or None
        What the last call ran: a canonical algorithm name, or ``"native"``.
    """

    def __init__(self, transport: Any, *, timeout: float = 300.0, check: bool = True,
                 name: str | None = None):
        check_default_timeout(timeout)
        check_flag(check, "check")
        self.transport = transport
        self.rank = transport.rank
        self.size = transport.size
        self.local_rank = transport.local_rank
        self.local_size = transport.local_size
        self.name = name or transport.name
        self.timeout, self.check = float(timeout), bool(check)
        self.arrays = transport.arrays
        self.debug = debug_setting()  # read once, here: it must be the same on every rank
        configure()
        self.calls = CallRunner(self)  # the call machinery: runtime/call_runner.py
        self.last_algorithm = None
        # where this communicator's calls go on the timeline: (participant, index)
        self.trace_place = (recorder.participant(self.rank), recorder.next_index())
        self.fabric = auto.transport_fabric(transport)
        self.placement = auto.transport_placement(transport)

    def __repr__(self) -> str:
        return f"<Communicator {self.name} rank {self.rank} of {self.size}>"

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, kind: Any, error: BaseException | None, trace: Any) -> None:
        if error is None:
            self.free()
            return
        # (freeing is collective: it would wait for peers that may be waiting for this rank
        # in a call it will not make; they hear that it left instead, and the transport,
        # told of a failure, keeps what it holds)
        engine = self.calls.engine
        engine.abandon(error)
        engine.close()
        self.transport.free()

    def free(self) -> None:
        """Release what the transport holds for this communicator (collective on MPI).

        Calls still in flight end first: collectives run to their end, each within its own
        deadline (their handles' ``wait()`` gives the result), and messages are withdrawn
        (their ``wait()`` raises `CommunicatorBrokenError`). Every later call raises
        `CommunicatorBrokenError` saying it was freed. The end of a ``with`` block frees it,
        but where an exception leaves the block: the communicator's peers hear that this
        rank left (their calls raise `PeerFailedError` naming it), and nothing waits for them.
        Like any call, it raises `ConcurrentCallError` while another thread is inside one.
        """
        engine = self.calls.engine
        engine.claim("free()")  # (another thread inside a call: refused, as any call is)
        try:
            engine.drain()
            engine.close()
        finally:
            engine.leave()  # (closed: later calls are refused; the transport's free may wait
            # for its peers' frees as long as they take, which is no call the hang guard ends)
        self.transport.free()

    # --- hooks --------------------------------------------------------------------------

    def adapt(self, x: Any, argument: str) -> Any:
        """The array a call works on (a hook a subclass may override).

        Parameters
        ----------
        x
            What the caller passed.
        argument
            Its name, for error messages.

        Returns
        -------
        Any
            Arrays of the transport's array backend as they are; scalars and array-likes as
            NumPy arrays.

        Raises
        ------
        TypeError
            ``x`` is None, a list of arrays (one array per call), or not readable as an array.
        """
        if self.arrays.owns(x):
            if x.__class__ is not np.ndarray and isinstance(x, np.ndarray):
                return plain_ndarray(x, argument)  # (np.matrix, memmap; masked: raises)
            return x
        if x is None:
            raise TypeError(f"{argument} is None; pass an array")
        if isinstance(x, (list, tuple)) and any(hasattr(v, "shape") or hasattr(v, "__array__")
                                                 for v in x):
            raise TypeError(f"{argument} is a {type(x).__name__} of arrays; a collective takes "
                            "one array (stack them yourself with numpy.stack, or use "
                            "batch_all_reduce for several tensors)")
        try:
            return np.asarray(x)
        except Exception as exc:  # noqa: BLE001 - NumPy's message is the useful part
            raise TypeError(f"{argument} cannot be read as an array: {exc}") from exc

    def adapt_batch(self, xs: Any, argument: str) -> list:
        """The arrays a batched call works on: ``adapt`` of each (a hook a subclass may
        override, to do once per batch what ``adapt`` does per call).

        Parameters
        ----------
        xs
            The caller's list of arrays.
        argument
            Its name, for error messages (``xs[3]``).

        Returns
        -------
        list
            One array of the transport's array backend per item.
        """
        kind = xs[0].__class__ if xs else None
        if (kind is not None and (kind is np.ndarray or not issubclass(kind, np.ndarray))
                and self.arrays.owns(xs[0]) and all(x.__class__ is kind for x in xs)):
            return list(xs)  # (arrays of one type the backend takes as they are: adapt's answer)
        return [self.adapt(x, f"{argument}[{k}]") for k, x in enumerate(xs)]

    def choose_algorithm(self, call: Call) -> str:
        """What runs ``call`` (a hook a subclass may extend): the first of the runners
        (``collectives.api.runners``) that takes it; the choice stays with the call
        (``call.choice``, which ``explain`` shows).

        Parameters
        ----------
        call
            The validated call; ``call.algorithm`` is what the caller asked for (``"auto"``
            lets the cost model choose).

        Returns
        -------
        str
            ``"native"`` (the transport's own collective) or a schedule's canonical name.
        """
        call.choice = runners.choose(self, call)
        return call.choice.run_as

    def barrier(self, timeout: float | None = None) -> None:
        """Return once every rank has arrived.

        Parameters
        ----------
        timeout
            Seconds to wait for the others (None: the communicator's timeout).

        Raises
        ------
        CollectiveTimeoutError
            Ranks did not arrive in time; the message names them.
        CollectiveMismatchError
            Another rank called another collective.
        """
        def build(seq):
            call = self._barrier_call()
            token = np.zeros(1, np.int64)
            return call, [self.calls.data_stage(call, seq, None, token)], Ready()

        self.calls.start("barrier", build, False, timeout, subject="barrier")

    def _barrier_call(self) -> Call:
        """A barrier is a one-element all-reduce with a signature of its own (so that a rank in
        a barrier and one in an all-reduce are told they disagree)."""
        call = self.calls.cache.get("barrier")
        if call is None:
            call = self.calls.validated(Collective.ALL_REDUCE, _TOKEN, "max", "rechd")
            barrier = Call(Collective.ALL_REDUCE, call.shape, call.dtype, call.op, 0, "rechd", 0,
                           None, shown_as="barrier")
            barrier.signature = ("barrier",) + (None,) * 8
            barrier.check = zlib.crc32(b"barrier") & ((1 << 30) - 1)
            barrier.run_as = "rechd"
            call = self.calls.cache["barrier"] = barrier
        return call


_TOKEN = np.zeros(1, np.int64)

