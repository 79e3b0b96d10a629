"""``Communicator.batch_all_reduce`` and ``Communicator.buckets``: a rank's tensor list as
few fused buckets.

The batch loop itself is the core's (``collectives.algorithms.batch.start_batch``); here a
rank checks and plans its list (TensorFlow's packing knobs where given, else fusion buckets)
and reduces each bucket with ``all_reduce`` (blocking, or in flight under one handle). Every
bucket's call carries the list's tag (``batch_checks.batch_tag``) in its signature, so the
guarantees of a plain call hold for every bucket of every step: a bad argument on one rank
reaches its peers through the pipeline (``refusing``), and ranks whose lists differ fail with
``CollectiveMismatchError`` (an empty list too: ``agree_on_empty``). Tensors of a library
with an array kind of its own (PyTorch) are packed in that library, so that only the buckets
cross over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, overload

from ..algorithms.fusion import DEFAULT_BUCKET_BYTES, OVERLAP_BUCKET_BYTES, check_bucket_bytes
from ..algorithms.reuse import BucketKeeper, keeper_in
from ..compression import for_batch
from ..foreign import Edge, is_foreign
from ..hints import ArrayT, BatchSpec, Compression, Op, SpmdAlgorithm
from ..runtime.calls import check_op_for
from ..runtime.in_flight import MAX_IN_FLIGHT
from ..runtime.refusals import refuse, refuse_rest, refusing, setting_up
from ..runtime.validate import check_flag, check_shards, check_timeout, resolve_groups
from ..runtime.work import BatchWork, Work
from .batch_checks import (
    agree_on_empty,
    batch_tag,
    bucket_plan,
    checked_list,
    layout_of,
    own_copy,
    unreadable,
)
from .comm_parts import CommParts
from .spmd_buckets import Buckets


class BatchOps(CommParts):
    """Batched all-reduce (mixed into Communicator)."""

    @overload
    def batch_all_reduce(self, xs: Sequence[ArrayT], op: Op = ...,
                         algorithm: BatchSpec | SpmdAlgorithm = ..., *, num_packs: int = ...,
                         agg_small_grads_max_bytes: int = ..., agg_small_grads_max_group: int = ...,
                         bytes_per_pack: int | None = ..., shards: int = ..., groups: Any = ...,
                         timeout: float | None = ..., compression: Compression = ...,
                         bucket_bytes: int = ..., views: bool = ...,
                         async_op: Literal[False] = ...) -> list[ArrayT]: ...
    @overload
    def batch_all_reduce(self, xs: Sequence[ArrayT], op: Op = ...,
                         algorithm: BatchSpec | SpmdAlgorithm = ..., *, num_packs: int = ...,
                         agg_small_grads_max_bytes: int = ..., agg_small_grads_max_group: int = ...,
                         bytes_per_pack: int | None = ..., shards: int = ..., groups: Any = ...,
                         timeout: float | None = ..., compression: Compression = ...,
                         bucket_bytes: int = ..., views: bool = ...,
                         async_op: Literal[True]) -> Work[list[ArrayT]]: ...
    @refusing("batch_all_reduce")
    def batch_all_reduce(self, xs: Sequence[ArrayT], op: Op = "sum",
                         algorithm: BatchSpec | SpmdAlgorithm = "auto", *, num_packs: int = 0,
                         agg_small_grads_max_bytes: int = 0, agg_small_grads_max_group: int = 10,
                         bytes_per_pack: int | None = None, shards: int = 0, groups: Any = None,
                         timeout: float | None = None, compression: Compression = None,
                         bucket_bytes: int = DEFAULT_BUCKET_BYTES, views: bool = True,
                         async_op: bool = False) -> Any:
        """All-reduce a list of tensors as few packed buffers.

        Parameters
        ----------
        xs
            This rank's tensors (every rank: the same shapes and dtypes, in the same order).
        op
            ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"prod"`` or a `ReduceOp`.
        algorithm
            Any all-reduce spec (see ``collectives.algorithms.spec``).
        num_packs, agg_small_grads_max_bytes, agg_small_grads_max_group, bytes_per_pack
            TensorFlow's packing knobs, as in `collectives.batch_all_reduce`.
        shards
            Ring sub-chunks or shuffle gather ranks (0: the spec's).
        groups
            The groups of a two-level ``"A/B"``.
        timeout
            Seconds each packed call may wait for its peers (None: the communicator's).
        compression
            ``"fp16"`` or ``"bf16"`` compresses the float32 and float64 packs (see
            `all_reduce`); packs of other dtypes travel as they are.
        bucket_bytes
            With none of TensorFlow's knobs: fuse each dtype's tensors into buckets of at most
            this many bytes (64 MiB by default; 0: every tensor alone); see `Buckets` to start
            buckets as their tensors become ready.
        views
            True (the default): each result of a fused bucket is a view of it (no copy; a
            result kept holds its whole bucket alive, as DDP's ``gradient_as_bucket_view``
            does); False: each result is an array of its own (one copy per tensor). The
            communicator keeps the buckets and views (of NumPy arrays, CuPy arrays and
            PyTorch tensors) for the next call of the same list, which reuses them only where
            nothing refers to the last results any more (``algorithms/reuse.py``).
        async_op
            Return one `Work` handle for the whole batch, whose ``wait()`` returns the list.

        Returns
        -------
        list
            The reduced tensors, in input order, with input shapes (views of their bucket
            where fused), of the inputs' array type.

        Raises
        ------
        TypeError
            ``xs`` is not a list of arrays of one library; ValueError for a bad spec or knob,
            a ``compression`` the op cannot take, or ``async_op=True`` with more buckets than
            a communicator holds handles (on this rank, before any data moves: its peers
            raise `PeerFailedError` naming it).
        CollectiveMismatchError
            The ranks passed different tensors or arguments (checked on every call).
        CollectiveError
            ``async_op=True`` with more buckets than the handles already unwaited leave room
            for (none is issued).
        CollectiveTimeoutError
            A peer did not arrive within ``timeout``.
        """
        from ..algorithms.batch import in_place, plan_batch, start_batch

        xs = checked_list(xs, "xs")
        edge = Edge(xs[0]) if xs and is_foreign(xs[0]) else None
        arrays = self.arrays  # the library the tensors are packed and unpacked in
        if edge is not None and edge.arrays is not None:  # packed on their side: only the
            arrays = edge.arrays                           # buckets cross over
        else:
            if edge is not None:
                xs = [edge.adopt(x, f"xs[{k}]") for k, x in enumerate(xs)]
            xs = self.adapt_batch(xs, "xs")
        shapes, dtypes = layout_of(arrays, xs, "xs")
        layout = tuple(zip(shapes, dtypes))
        parts = plan_batch(shapes, dtypes,
                           algorithm, num_packs=num_packs,
                           agg_small_grads_max_bytes=agg_small_grads_max_bytes,
                           agg_small_grads_max_group=agg_small_grads_max_group,
                           bytes_per_pack=bytes_per_pack, shards=check_shards(shards),
                           extra_names=self.calls.native_names, bucket_bytes=bucket_bytes,
                           alone_bytes=arrays.alone_bytes(xs[0]) if xs else None)
        # The arguments checked once the list's buckets are known. A bad one is refused by
        # ``refusing`` as many times as the peers issued calls here (they issue an
        # asynchronous batch's buckets before waiting on any): this rank's count of its own
        # buckets is no guide, as its list may be what is wrong (a dtype of its own makes a
        # bucket of its own).
        timeout = check_timeout(timeout)
        check_flag(async_op, "async_op")
        resolve_groups(groups, self.size)
        for dtype in set(dtypes):  # (per dtype, naming its first tensor)
            check_op_for(op, dtype, f"xs[{dtypes.index(dtype)}]")
        for_batch(compression, op, [])  # (a compression the op cannot take: raised here)
        if not isinstance(views, bool):
            raise TypeError(f"views={views!r} must be True (results are views of their "
                            "bucket) or False (each result an array of its own)")
        count = sum(len(p.plan.packs) for p in parts)
        if async_op and count > MAX_IN_FLIGHT:  # (on every rank, however idle: not "crowded")
            how = (f"fewer num_packs: num_packs={num_packs} makes that many packs of each "
                   "dtype" if num_packs else "a larger bucket_bytes, or TensorFlow's knobs")
            raise ValueError(f"this asynchronous batch would issue {count} calls, one per "
                             f"bucket, and a communicator holds at most {MAX_IN_FLIGHT} "
                             f"handles unwaited; fuse the list into fewer buckets ({how}), or "
                             "call it blocking")
        if async_op:  # every bucket a handle: refused before the first is issued, once for
            crowded = self.calls.engine.crowded(count=count)  # each of the calls its peers
            if crowded is not None:  # make (they may have room)
                refuse(self.calls, "batch_all_reduce", crowded)
        if not xs:
            return agree_on_empty(self, op, timeout, async_op)
        crossing = arrays is not self.arrays

        issued: list = []  # (an asynchronous batch's handles, as its buckets go out)
        made = [0, False]  # the buckets' calls made so far, and whether one is being made

        def reduce_pack(part, buffers, fresh):
            (buf,) = buffers
            if crossing:
                buf = self.adapt(edge.adopt(buf, "a bucket of xs"), "a bucket of xs")
            squeeze = for_batch(compression, op, [buf.dtype])[0]
            made[0], made[1] = made[0] + 1, True
            reduced = self.all_reduce(buf, op, part.spec.algorithm, shards=part.spec.shards,
                                      groups=groups, timeout=timeout, compression=squeeze,
                                      out=buf if in_place(fresh, op, buf.dtype) else None,
                                      async_op=async_op)
            made[1] = False
            if async_op:
                issued.append(reduced)
            return reduced

        order = [(part, j) for part in parts for j in range(len(part.plan.packs))]
        tag = batch_tag(layout, bucket_plan(order), async_op)
        with self.calls.part_of(tag):
            try:
                batch = start_batch([xs], parts, reduce_pack, arrays=arrays, validated=True,
                                    keeper=self._bucket_keeper(arrays))
            except Exception as exc:
                for handle in issued:  # (the error raised here covers the batch: its issued
                    handle.reported_elsewhere()  # buckets' must not surface at a later call)
                if made[1]:  # (a bucket's own call failed: it said so to its peers)
                    raise
                # packing or reading a bucket failed (a tensor PyTorch cannot hand over): the
                # calls its peers make of the buckets not yet made are refused, so that they
                # fail at once
                names = [f"xs[{k}]" for k in range(len(xs))]
                error = unreadable(edge, xs, names, exc) if crossing else exc
                refuse_rest(self.calls, "batch_all_reduce", error, made[0], len(order), async_op)

        def finish(reduced: list) -> list:
            if crossing:  # the buckets go back, then unpack on the tensors' side
                assert edge is not None  # (crossing: packed on the edge's side)
                reduced = [edge.back(buf) for buf in reduced]
            results = [r[0] for r in batch.finish([[buf] for buf in reduced])]
            if not views:
                results = [own_copy(arrays, r) for r in results]
            return [edge.back(r) for r in results] if edge and not crossing else results

        if async_op:
            return BatchWork(batch.pending, finish, f"batch_all_reduce of {len(xs)} tensors")
        return finish(batch.pending)

    def _bucket_keeper(self, arrays: Any) -> BucketKeeper:
        """This communicator's keeper of fused buckets in ``arrays``' library (reuse.py)."""
        return keeper_in(self.__dict__.setdefault("_bucket_keepers", {}), arrays)

    @setting_up("buckets")
    def buckets(self, like: Sequence[ArrayT], op: Op = "sum", algorithm: SpmdAlgorithm = "auto",
                *, bucket_bytes: int = OVERLAP_BUCKET_BYTES, groups: Any = None,
                timeout: float | None = None) -> Buckets[ArrayT]:
        """Buckets that all-reduce a gradient list while it is still being computed.

        Parameters
        ----------
        like
            Tensors of the list's shapes and dtypes, **in the order they become ready** (for a
            backward pass: the last layer's first, as DDP orders its buckets). Every rank
            passes the same list, and makes its buckets at the same point among its calls (a
            bad argument on one rank raises there on every rank).
        op, algorithm
            As in `all_reduce`.
        bucket_bytes
            Fuse runs of consecutive tensors of a dtype into buckets of at most this many
            bytes, as DDP does (25 MiB by default, the first bucket at most 1 MiB so that
            communication starts early; smaller buckets start sooner; 0: every tensor alone).
            The last buckets shrink: each holds at most half the bytes from its first tensor
            to the list's end (down to 256 KiB), so the tensors ready last wait behind
            little. A tensor is copied into its bucket unless it fills one alone (a bucket
            never waits behind a later tensor).
        groups
            The groups of a two-level ``"A/B"`` (None: the transport's nodes, where it has
            them).
        timeout
            Seconds each bucket may wait for its peers (None: the communicator's).

        Returns
        -------
        Buckets
            Mark each tensor with ``ready(k, x)``: a bucket starts (asynchronously) once its
            tensors are ready and every bucket before it has started; ``wait()`` returns the
            reduced list, and the buckets are ready for the next step.
        """
        check_bucket_bytes(bucket_bytes)  # (the buckets' plan needs it)
        xs = checked_list(like, "like", read=False)  # (shapes and dtypes: parameters will do)
        edge = Edge(xs[0]) if xs and is_foreign(xs[0]) else None
        arrays = self.arrays  # the library the buckets are packed and unpacked in
        if edge is None:
            xs = self.adapt_batch(xs, "like")
        elif edge.arrays is None:
            raise TypeError(f"like[0] is a {type(xs[0]).__module__}.{type(xs[0]).__name__}, "
                            "whose library has no array kind to pack buckets in; pass arrays "
                            "of the transport's library (or use batch_all_reduce)")
        else:
            arrays = edge.arrays
        layout = tuple(zip(*layout_of(arrays, xs, "like"), strict=True))
        alone = arrays.alone_bytes(xs[0]) if xs else None
        # (a bad argument is refused on every rank at the set-up call: ``setting_up``)
        timeout = check_timeout(timeout)
        resolve_groups(groups, self.size)  # (a bad one raises now, not at a bucket)
        dtypes = [d for _, d in layout]
        for dtype in set(dtypes):  # (per dtype, naming its first tensor)
            check_op_for(op, dtype, f"like[{dtypes.index(dtype)}]")
        return Buckets(self, layout, op, algorithm, bucket_bytes, timeout, alone, edge, groups)
