"""``Buckets`` (``Communicator.buckets``): a gradient list all-reduced bucket by bucket as its
tensors become ready, as DDP's reducer and Horovod's fusion buffer do.

Each bucket is an asynchronous ``all_reduce`` made inside ``CallRunner.part_of`` with the
list's tag, so a bucket keeps every promise of a plain call: ranks whose lists differ fail
with ``CollectiveMismatchError`` on every step, a bad ``ready(k, x)`` or an early ``wait()``
on one rank reaches its peers through the pipeline (``CallRunner.refuse``, once for each
bucket not yet started: they raise ``PeerFailedError`` naming it at once), and every wait is
bounded by the ``timeout`` the buckets were made with. A step that raised (in ``ready`` or
``wait``) is over on every rank: the buckets then take the next step's tensors, as after a
``wait()`` that returned. An empty list makes its call at ``wait()`` (``agree_on_empty``), so
that a peer whose list is not empty is told.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Generic, NoReturn

from ..algorithms.reuse import BucketKeeper
from ..hints import ArrayT
from ..ops import ReduceOp, result_dtype
from ..runtime.in_flight import MAX_IN_FLIGHT
from ..runtime.refusals import BAD_INPUT, refuse_rest
from ..runtime.validate import check_timeout
from ..runtime.work import BatchWork
from .batch_checks import (
    agree_on_empty,
    batch_tag,
    bucket_plan,
    shape_and_dtype,
    unreadable,
)


def bucket_order(comm: Any, layout: tuple, algorithm: Any, bucket_bytes: int,
                 alone_bytes: int | None) -> tuple[list, list]:
    """The batch plan's parts for a list of ``layout`` (runs of consecutive tensors: a small
    first one, shrinking last ones), and its buckets as ``(part, pack index)`` in the order
    they start, that of their first tensor (a bucket never waits behind a later tensor)."""
    from ..algorithms.batch import plan_batch

    parts = plan_batch([s for s, _ in layout], [d for _, d in layout], algorithm,
                       bucket_bytes=bucket_bytes, extra_names=comm.calls.native_names,
                       alone_bytes=alone_bytes, in_order=True)
    by_parts = [(part, j) for part in parts for j in range(len(part.plan.packs))]
    return parts, sorted(by_parts, key=lambda pj: pj[0].indices[pj[0].plan.packs[pj[1]].indices[0]])


class Buckets(Generic[ArrayT]):
    """A gradient list all-reduced bucket by bucket as its tensors become ready (DDP's
    reducer, Horovod's fusion buffer): see `Communicator.buckets`.

    Buckets start in one fixed order on every rank (a bucket waits for those before it), so
    ranks whose tensors become ready in different orders still pair the same buckets.
    """

    def __init__(self, comm: Any, layout: tuple, op: Any, algorithm: Any, bucket_bytes: int,
                 timeout: float | None, alone_bytes: int | None = None, edge: Any = None,
                 groups: Any = None):
        self.comm, self.layout, self.op, self.timeout = comm, layout, op, timeout
        self.groups = groups  # (a two-level name's, for every bucket)
        self.calls = comm.calls
        self.size = comm.size
        # tensors of another library (PyTorch) are packed there; only buckets cross over
        self.edge = edge
        self.arrays = comm.arrays if edge is None else edge.arrays
        self.parts, self.order = bucket_order(comm, layout, algorithm, bucket_bytes, alone_bytes)
        if len(self.order) > MAX_IN_FLIGHT:  # (each bucket a handle until wait(), which cannot
            # come before the last bucket: the step would stop at the limit, data moved)
            raise ValueError(f"the list makes {len(self.order)} buckets, and a communicator "
                             f"holds at most {MAX_IN_FLIGHT} handles unwaited; fuse it into "
                             f"fewer (bucket_bytes={bucket_bytes}: pass a larger one)")
        self.tag = batch_tag(layout, bucket_plan(self.order), True)
        # where each bucket's result goes among the parts' (what StartedBatch.finish reads)
        self.place = [self.order.index((part, j)) for part in self.parts
                      for j in range(len(part.plan.packs))]
        self.bucket_of = {i: b for b, (part, j) in enumerate(self.order)
                          for i in (part.indices[m] for m in part.plan.packs[j].indices)}
        # a fused bucket is the buckets' own copy: reduced in place, it needs no result buffer
        # (a tensor alone travels as itself, and its input is never written; integer MEAN
        # gives float64, which its bucket cannot hold)
        reduce_op = ReduceOp.parse(op)  # (checked by the caller)
        self.in_place = [len(pack.indices) > 1 and result_dtype(reduce_op, pack.dtype) == pack.dtype
                         for pack in (part.plan.packs[j] for part, j in self.order)]
        # each step's fused buckets and views, kept for the next step (algorithms/reuse.py)
        self.keeper = BucketKeeper(self.arrays, plans=len(self.parts))  # (every bucket's)
        self._reset()

    def _reset(self) -> None:
        self.ended_by: str | None = None  # the error that ended the last step, if one did
        self.tensors: list = [None] * len(self.layout)
        self.missing = [len(part.plan.packs[j].indices) for part, j in self.order]
        self.pending: list = []  # the started buckets' handles, in order
        self.took: set = set()  # the kept buckets this step packs into

    def _abandon_step(self, error: BaseException) -> None:
        """End a step that raised ``error``: the buckets already out are claimed by it (theirs
        must not surface again at a later call), and the next step starts afresh."""
        for handle in self.pending:
            handle.reported_elsewhere()
        self._reset()
        self.ended_by = f"{type(error).__name__}: {error}"

    @property
    def started(self) -> int:
        """How many buckets are in flight (or done) this step."""
        return len(self.pending)

    def ready(self, k: int, x: ArrayT) -> None:
        """Tensor ``k`` (of the list's order) is ``x``; start every bucket now complete.

        ``x`` must not change until ``wait()`` returns: a fused bucket holds a copy of it, but
        a tensor alone in its bucket travels as it is (no copy), so changing it before then
        changes the result, as with MPI's non-blocking calls. A bad ``k`` or ``x`` ends the
        step on every rank (``_refuse_rest``); so does an error of a bucket it starts."""
        try:
            x = self._checked(k, x)
        except BAD_INPUT as exc:
            self._refuse_rest(exc)
        self.tensors[k] = x
        self.missing[self.bucket_of[k]] -= 1
        self.ended_by = None  # (a step under way)
        try:
            self._start_complete()
        except BaseException as exc:
            self._abandon_step(exc)
            raise

    def _checked(self, k: int, x: ArrayT) -> Any:
        """``x`` as tensor ``k`` travels, or raise naming what is wrong and the fix."""
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"k={k!r} must be the tensor's index in the list (an int from 0 to "
                            f"{len(self.layout) - 1})")
        if not 0 <= k < len(self.layout):
            raise IndexError(f"k={k} is out of range for a list of {len(self.layout)} tensors")
        if getattr(x, "requires_grad", False):
            raise TypeError(f"tensor {k} requires grad; pass it as x.detach()")
        if self.edge is None:
            x = self.comm.adapt(x, f"tensor {k}")
        elif not self.arrays.owns(x):
            raise TypeError(f"tensor {k} is a {type(x).__module__}.{type(x).__name__}; the "
                            "buckets were made for another library's tensors")
        shape, dtype = self.layout[k]
        if shape_and_dtype(self.arrays, x, f"tensor {k}") != (tuple(shape), dtype):
            raise ValueError(f"tensor {k} is {x.dtype}{tuple(x.shape)}; the buckets were made "
                             f"for {dtype}{tuple(shape)}")
        if self.tensors[k] is not None:
            ready = sum(t is not None for t in self.tensors)
            raise ValueError(
                f"tensor {k} was already marked ready this step ({ready} of "
                f"{len(self.layout)} tensors ready): a step ends at its wait(). This ends the "
                "step here (this rank's results are lost; its peers raise PeerFailedError "
                "where buckets had yet to start), and the next ready(k, x) "
                "starts the next one; where the program leaves a step midway (its own "
                "exception, Ctrl-C in wait()), call wait() before the next step's ready(): it "
                "takes the rest of the step")
        return x

    def _start_complete(self) -> None:
        """Start every complete bucket whose predecessors have all started."""
        while self.started < len(self.order) and self.missing[self.started] == 0:
            crowded = self.calls.engine.crowded()
            if crowded is not None:  # (refused for this bucket and the rest, as a batch is:
                self._refuse_rest(crowded)  # its peers, with room, issue every one)
            part, j = self.order[self.started]
            into = None
            if self.keeper.enabled and part.plan.whole and len(part.plan.packs[j].indices) > 1:
                into = self.keeper.bucket(part.plan, j, 0)
            if into is not None:
                self.took.add((id(part.plan), j, 0))
            # (ready checked each tensor's library, shape and dtype: validated for a kept one)
            tensors = [self.tensors[i] for i in part.indices]
            try:
                buf = part.plan.pack_one(j, tensors, arrays=self.arrays,
                                         validated=into is not None, into=into)
                if self.edge is not None:
                    buf = self.comm.adapt(self.edge.adopt(buf, "a bucket"), "a bucket")
            except Exception as exc:  # (a tensor PyTorch cannot hand over, or no memory for
                # the bucket: refused, so that the peers' buckets fail at once; a tensor named
                # with its index in the list)
                names = [f"tensor {i}" for i in part.indices]
                self._refuse_rest(exc if self.edge is None else
                                  unreadable(self.edge, tensors, names, exc))
            in_place = self.in_place[self.started]
            # (the arguments left at their defaults are not passed: a transport whose
            # asynchronous calls take its hot path, NCCL's, takes it for those alone)
            given: dict[str, Any] = {}
            if part.spec.shards:
                given["shards"] = part.spec.shards
            if self.groups is not None:  # (an array of groups: ``!=`` compared it elementwise)
                given["groups"] = self.groups
            if self.timeout is not None:
                given["timeout"] = self.timeout
            with self.calls.part_of(self.tag):
                self.pending.append(self.comm.all_reduce(
                    buf, self.op, part.spec.algorithm, out=buf if in_place else None,
                    async_op=True, **given))

    def wait(self, timeout: float | None = None) -> list[ArrayT]:
        """The reduced tensors in the list's order, once every bucket has finished; the
        buckets then take the next step's tensors (also where it raises). ``timeout``:
        seconds for all of them together (None: each bucket's own, the ``timeout`` the
        buckets were made with). The buckets' own errors (a peer's different list, a timeout)
        are raised as their calls raised them; only an early ``wait()`` is this rank's
        refusal, which its peers hear of at once."""
        from ..algorithms.batch import StartedBatch

        timeout = check_timeout(timeout)  # (first: a bad one must not end the step)
        if self.started < len(self.order):
            missing = [k for k, t in enumerate(self.tensors) if t is None]
            again = (" (a step ends at its wait(): this one had none of its tensors yet; wait() "
                     "once per step)" if len(missing) == len(self.layout) else "")
            if self.ended_by is not None and len(missing) == len(self.layout):
                again = (f" (the last step ended here when it raised {self.ended_by};"
                         " its results are lost: start the next with ready(k, x))")
            self._refuse_rest(ValueError(
                f"wait() before every tensor was ready: tensors {missing[:10]} were never "
                f"passed to ready(k, x); their buckets (and the later ones) have not "
                f"started{again}"))
        if not self.layout:
            return agree_on_empty(self.comm, self.op,
                                  self.timeout if timeout is None else timeout, False)
        took = frozenset(self.took)
        try:
            reduced = BatchWork(self.pending, list, "buckets").wait(timeout)
        except Exception as exc:  # (a later wait() says what ended the step; an interruption,
            self._abandon_step(exc)  # KeyboardInterrupt, ends nothing: its buckets are still
            raise                    # in flight, and a wait() again takes them)
        self._reset()
        if self.edge is not None:  # the buckets go back, then unpack on the tensors' side
            reduced = [self.edge.back(buf) for buf in reduced]
        reduced = [reduced[b] for b in self.place]
        batch = StartedBatch(self.parts, reduced, len(self.layout), self.arrays,
                             lambda _: nullcontext(), self.keeper, took)
        return [r[0] for r in batch.finish([[buf] for buf in reduced])]

    def _refuse_rest(self, error: Exception) -> NoReturn:
        """Raise ``error``, this rank's refusal of the rest of the step: refused once for each
        bucket not yet started (``CallRunner.refuse``). Its peers issue every bucket, so each
        of theirs meets a refusal (they raise ``PeerFailedError`` naming it at once) and the
        ranks' calls still pair; the buckets then take the next step's tensors. Where every
        bucket has started, the error is this rank's alone (its peers' buckets pair with the
        ones in flight), and the step is over all the same: the next ``ready`` is the next
        step's, as the docstring of the module says."""
        if self.started == len(self.order):
            self._abandon_step(error)
            raise error
        try:
            refuse_rest(self.comm.calls, "buckets", error, self.started, len(self.order), True)
        finally:
            self._abandon_step(error)
