"""What the parts of ``Communicator`` rely on from one another, declared once for type checkers.

``Communicator`` is made of mixins (``ReductionOps``, ``BatchOps``, ``SpreadOps``,
``CopyOps``, ``PreparedOps``, ``PointToPointOps``, ``SubcommOps``, ``ChoiceOps``), each
of which uses the state ``Communicator.__init__`` sets and methods that ``communicator.py`` or
another mixin defines. ``CommParts``, which every mixin inherits, declares them: at run time
it holds annotations only (no attribute, no method, no behaviour); the shared methods'
signatures exist under ``TYPE_CHECKING`` alone, and the class that defines each is checked
against them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

if TYPE_CHECKING:

    from ..algorithms.cost import Fabric, Placement
    from ..arrays import ArrayBackend
    from ..hints import ArrayT, Compression, Op, SpmdAlgorithm
    from ..runtime.call_runner import CallRunner
    from ..runtime.validate import Groups
    from ..runtime.work import Work


class CommParts:
    """The attributes and methods the mixins of ``Communicator`` share (see the module)."""

    # set by Communicator.__init__
    transport: Any  # a runtime.transport.Transport, with whatever a backend's adds to it
    arrays: ArrayBackend  # the transport's array backend
    rank: int
    size: int
    local_rank: int
    local_size: int
    name: str
    timeout: float
    check: bool
    debug: str  # COLLECTIVES_DEBUG: "", "info" or "detail"
    last_algorithm: str | None
    placement: Placement
    calls: CallRunner  # the call machinery (runtime/call_runner.py): validate, start, stages
    trace_place: tuple[int, int]  # this communicator's place on the timeline
    fabric: Fabric  # the cost model's constants (auto.ChoiceOps: a property)


    if TYPE_CHECKING:
        def __init__(self, transport: Any, *, timeout: float = 300.0, check: bool = True,
                     name: str | None = None) -> None: ...

        # communicator.py
        def adapt(self, x: Any, argument: str) -> Any: ...

        def adapt_batch(self, xs: Any, argument: str) -> list: ...

        # spmd_reductions.py
        @overload
        def all_reduce(self, x: ArrayT, op: Op = ..., algorithm: SpmdAlgorithm = ..., *,
                       out: ArrayT | None = ..., shards: int = ..., groups: Groups = ...,
                       timeout: float | None = ..., compression: Compression = ...,
                       async_op: Literal[False] = ...) -> ArrayT: ...
        @overload
        def all_reduce(self, x: ArrayT, op: Op = ..., algorithm: SpmdAlgorithm = ..., *,
                       out: ArrayT | None = ..., shards: int = ..., groups: Groups = ...,
                       timeout: float | None = ..., compression: Compression = ...,
                       async_op: Literal[True]) -> Work[ArrayT]: ...
        def all_reduce(self, x: ArrayT, op: Op = "sum", algorithm: SpmdAlgorithm = "auto", *,
                       out: ArrayT | None = None, shards: int = 0, groups: Groups = None,
                       timeout: float | None = None, compression: Compression = None,
                       async_op: bool = False) -> Any: ...

        # spmd_spread.py
        @overload
        def all_gather(self, x: ArrayT, axis: int = ..., algorithm: SpmdAlgorithm = ..., *,
                       out: ArrayT | None = ..., timeout: float | None = ...,
                       async_op: Literal[False] = ...) -> ArrayT: ...
        @overload
        def all_gather(self, x: ArrayT, axis: int = ..., algorithm: SpmdAlgorithm = ..., *,
                       out: ArrayT | None = ..., timeout: float | None = ...,
                       async_op: Literal[True]) -> Work[ArrayT]: ...
        def all_gather(self, x: ArrayT, axis: int = 0, algorithm: SpmdAlgorithm = "auto", *,
                       out: ArrayT | None = None, timeout: float | None = None,
                       async_op: bool = False) -> Any: ...

        # spmd_copies.py
        def all_gather_object(self, obj: Any, *, timeout: float | None = None) -> list[Any]: ...
