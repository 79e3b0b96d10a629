"""``Communicator.batch_all_reduce``: a rank's tensor list as few fused buckets.

The batch loop itself is the core's (``collectives.algorithms.batch.start_batch``); here a
rank plans its list (TensorFlow's packing knobs where given, else fusion buckets), agrees the
list with its peers the first time it sees it, and reduces each bucket with ``all_reduce``
(blocking, or in flight under one handle). Tensors of a library with an array kind of its own
(PyTorch) are packed in that library, so that only the buckets cross over.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any, Generic, Literal, overload

import numpy as np

from ..algorithms.packing import DEFAULT_BUCKET_BYTES
from ..compression import for_batch
from ..errors import CollectiveMismatchError
from ..foreign import Edge, is_foreign
from ..hints import ArrayT, BatchSpec, Compression, Op, SpmdAlgorithm
from ..runtime.calls import check_op_for
from ..runtime.validate import check_shards
from ..runtime.work import BatchWork, Work
from .comm_parts import CommParts


def _brief(layout: tuple) -> str:
    """A batch's tensor list for an error message: ``[float32(3, 5), ...]``, cut short."""
    items = [f"{dtype}{shape}" for shape, dtype in layout]
    return "[" + ", ".join(items[:6]) + (f", ... {len(items)} in all" if len(items) > 6 else "") + "]"


class BatchOps(CommParts):
    """Batched all-reduce (mixed into Communicator)."""

    def _agree_batch(self, layout: tuple, timeout: float | None) -> None:
        """Agree on a batch's tensor list the first time it is seen: fused into buckets, two
        lists of different tensors could make buckets of one size and pair up silently. One
        small all-reduce (the MAX of the list's digest and of its negation: equal digests on
        every rank exactly when the two agree), paid once per list."""
        if self.size == 1 or not self.check or layout in self.calls.agreed_batches:
            return
        digest = zlib.crc32(repr([(tuple(s), str(d)) for s, d in layout]).encode())
        both = self.arrays.xp.asarray(np.array([digest, -digest], np.int64))
        highest, negated_lowest = (int(v) for v in self.all_reduce(both, "max", timeout=timeout))
        if highest != -negated_lowest:
            theirs = self.all_gather_object(_brief(layout), timeout=timeout)
            by_rank = ", ".join(f"rank {r}: {text}" for r, text in enumerate(theirs))
            raise CollectiveMismatchError(
                f"ranks called batch_all_reduce with different shape or dtype lists ({by_rank}); "
                "every rank must pass the same tensors in the same order")
        if len(self.calls.agreed_batches) > 1024:
            self.calls.agreed_batches.clear()
        self.calls.agreed_batches.add(layout)

    @overload
    def batch_all_reduce(self, xs: Sequence[ArrayT], op: Op = ...,
                         algorithm: BatchSpec | SpmdAlgorithm = ..., *, num_packs: int = ...,
                         agg_small_grads_max_bytes: int = ..., agg_small_grads_max_group: int = ...,
                         bytes_per_pack: int | None = ..., shards: int = ..., groups: Any = ...,
                         timeout: float | None = ..., compression: Compression = ...,
                         bucket_bytes: int = ...,
                         async_op: Literal[False] = ...) -> list[ArrayT]: ...
    @overload
    def batch_all_reduce(self, xs: Sequence[ArrayT], op: Op = ...,
                         algorithm: BatchSpec | SpmdAlgorithm = ..., *, num_packs: int = ...,
                         agg_small_grads_max_bytes: int = ..., agg_small_grads_max_group: int = ...,
                         bytes_per_pack: int | None = ..., shards: int = ..., groups: Any = ...,
                         timeout: float | None = ..., compression: Compression = ...,
                         bucket_bytes: int = ...,
                         async_op: Literal[True]) -> Work[list[ArrayT]]: ...
    def batch_all_reduce(self, xs: Sequence[ArrayT], op: Op = "sum",
                         algorithm: BatchSpec | SpmdAlgorithm = "auto", *, num_packs: int = 0,
                         agg_small_grads_max_bytes: int = 0, agg_small_grads_max_group: int = 10,
                         bytes_per_pack: int | None = None, shards: int = 0, groups: Any = None,
                         timeout: float | None = None, compression: Compression = None,
                         bucket_bytes: int = DEFAULT_BUCKET_BYTES,
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
            ``xs`` is not a list of arrays; ValueError for a bad spec or knob, or a
            ``compression`` the op cannot take.
        CollectiveMismatchError
            The ranks passed different tensors or arguments.
        CollectiveTimeoutError
            A peer did not arrive within ``timeout``.
        """
        from ..algorithms.batch import in_place, plan_batch, start_batch

        if isinstance(xs, (str, bytes)) or not isinstance(xs, Sequence):
            raise TypeError("xs must be a list of arrays")
        edge = Edge(xs[0]) if xs and is_foreign(xs[0]) else None
        arrays = self.arrays  # the library the tensors are packed and unpacked in
        if edge is not None and edge.arrays is not None:  # packed on their side: only the
            arrays = edge.arrays                           # buckets cross over
            for k, x in enumerate(xs):
                if not arrays.owns(x):
                    raise TypeError(f"xs[{k}] is a {type(x).__module__}.{type(x).__name__} but "
                                    f"xs[0] is a {type(xs[0]).__module__}.{type(xs[0]).__name__}"
                                    "; one batch takes arrays of one library")
        else:
            if edge is not None:
                xs = [edge.adopt(x, f"xs[{k}]") for k, x in enumerate(xs)]
            xs = self.adapt_batch(xs, "xs")
        dtypes = [arrays.dtype_of(x) for x in xs]
        for dtype in set(dtypes):  # (per dtype, naming its first tensor)
            check_op_for(op, dtype, f"xs[{dtypes.index(dtype)}]")
        layout = tuple(zip([x.shape for x in xs], dtypes))
        parts = plan_batch([shape for shape, _ in layout], dtypes,
                           algorithm, num_packs=num_packs,
                           agg_small_grads_max_bytes=agg_small_grads_max_bytes,
                           agg_small_grads_max_group=agg_small_grads_max_group,
                           bytes_per_pack=bytes_per_pack, shards=check_shards(shards),
                           extra_names=self.calls.native_names, bucket_bytes=bucket_bytes,
                           alone_bytes=arrays.alone_bytes(xs[0]) if xs else None)
        for_batch(compression, op, [])  # (a compression the op cannot take: raised here)

        self._agree_batch(layout, timeout)
        crossing = arrays is not self.arrays

        def reduce_pack(part, buffers, fresh):
            (buf,) = buffers
            if crossing:
                buf = self.adapt(edge.adopt(buf, "a bucket of xs"), "xs")
            squeeze = for_batch(compression, op, [buf.dtype])[0]
            return self.all_reduce(buf, op, part.spec.algorithm, shards=part.spec.shards,
                                   groups=groups, timeout=timeout, compression=squeeze,
                                   out=buf if in_place(fresh, op, buf.dtype) else None,
                                   async_op=async_op)

        batch = start_batch([xs], parts, reduce_pack, arrays=arrays, validated=True)

        def finish(reduced: list) -> list:
            if crossing:  # the buckets go back, then unpack on the tensors' side
                assert edge is not None  # (crossing: packed on the edge's side)
                reduced = [edge.back(buf) for buf in reduced]
            results = [r[0] for r in batch.finish([[buf] for buf in reduced])]
            return [edge.back(r) for r in results] if edge and not crossing else results

        if async_op:
            return BatchWork(batch.pending, finish, f"batch_all_reduce of {len(xs)} tensors")
        return finish(batch.pending)

    def buckets(self, like: Sequence[ArrayT], op: Op = "sum", algorithm: SpmdAlgorithm = "auto",
                *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                timeout: float | None = None) -> Buckets[ArrayT]:
        """Buckets that all-reduce a gradient list while it is still being computed.

        Parameters
        ----------
        like
            Tensors of the list's shapes and dtypes, **in the order they become ready** (for a
            backward pass: the last layer's first, as DDP orders its buckets). Every rank
            passes the same list.
        op, algorithm
            As in `all_reduce`.
        bucket_bytes
            Fuse consecutive tensors of a dtype into buckets of at most this many bytes
            (smaller buckets start sooner; 0: every tensor alone).
        timeout
            Seconds each bucket may wait for its peers (None: the communicator's).

        Returns
        -------
        Buckets
            Mark each tensor with ``ready(k, x)``: a bucket starts (asynchronously) once its
            tensors are ready and every bucket before it has started; ``wait()`` returns the
            reduced list, and the buckets are ready for the next step.
        """
        xs = list(like)
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
        layout = tuple(zip([x.shape for x in xs], [arrays.dtype_of(x) for x in xs]))
        for dtype in {d for _, d in layout}:
            check_op_for(op, dtype, "like")
        self._agree_batch(layout, timeout)
        return Buckets(self, layout, op, algorithm, bucket_bytes, timeout,
                       arrays.alone_bytes(xs[0]) if xs else None, edge)


class Buckets(Generic[ArrayT]):
    """A gradient list all-reduced bucket by bucket as its tensors become ready (DDP's
    reducer, Horovod's fusion buffer): see `Communicator.buckets`.

    Buckets start in one fixed order on every rank (a bucket waits for those before it), so
    ranks whose tensors become ready in different orders still pair the same buckets.
    """

    def __init__(self, comm: Any, layout: tuple, op: Any, algorithm: Any, bucket_bytes: int,
                 timeout: float | None, alone_bytes: int | None = None, edge: Any = None):
        from ..algorithms.batch import plan_batch

        self.comm, self.layout, self.op, self.timeout = comm, layout, op, timeout
        # tensors of another library (PyTorch) are packed there; only buckets cross over
        self.edge = edge
        self.arrays = comm.arrays if edge is None else edge.arrays
        self.parts = plan_batch([s for s, _ in layout], [d for _, d in layout], algorithm,
                                bucket_bytes=bucket_bytes, extra_names=comm.calls.native_names,
                                alone_bytes=alone_bytes)
        self.order = [(part, j) for part in self.parts for j in range(len(part.plan.packs))]
        self.bucket_of = {i: b for b, (part, j) in enumerate(self.order)
                          for i in (part.indices[m] for m in part.plan.packs[j].indices)}
        self._reset()

    def _reset(self) -> None:
        self.tensors: list = [None] * len(self.layout)
        self.missing = [len(part.plan.packs[j].indices) for part, j in self.order]
        self.pending: list = []  # the started buckets' handles, in order

    @property
    def started(self) -> int:
        """How many buckets are in flight (or done) this step."""
        return len(self.pending)

    def ready(self, k: int, x: ArrayT) -> None:
        """Tensor ``k`` (of the list's order) is ``x``; start every bucket now complete."""
        if not 0 <= k < len(self.layout):
            raise IndexError(f"k={k} is out of range for a list of {len(self.layout)} tensors")
        if self.edge is None:
            x = self.comm.adapt(x, f"tensor {k}")
        elif not self.arrays.owns(x):
            raise TypeError(f"tensor {k} is a {type(x).__module__}.{type(x).__name__}; the "
                            "buckets were made for another library's tensors")
        shape, dtype = self.layout[k]
        if tuple(x.shape) != tuple(shape) or self.arrays.dtype_of(x) != dtype:
            raise ValueError(f"tensor {k} is {x.dtype}{tuple(x.shape)}; the buckets were made "
                             f"for {dtype}{tuple(shape)}")
        if self.tensors[k] is not None:
            raise ValueError(f"tensor {k} was already marked ready this step")
        self.tensors[k] = x
        self.missing[self.bucket_of[k]] -= 1
        while self.started < len(self.order) and self.missing[self.started] == 0:
            part, j = self.order[self.started]
            buf = part.plan.pack_one(j, [self.tensors[i] for i in part.indices],
                                     arrays=self.arrays)
            if self.edge is not None:
                buf = self.comm.adapt(self.edge.adopt(buf, "a bucket"), "a bucket")
            self.pending.append(self.comm.all_reduce(
                buf, self.op, part.spec.algorithm, shards=part.spec.shards,
                timeout=self.timeout, async_op=True))

    def wait(self, timeout: float | None = None) -> list[ArrayT]:
        """The reduced tensors in the list's order, once every bucket has finished; the
        buckets then take the next step's tensors."""
        from ..algorithms.batch import StartedBatch

        if self.started < len(self.order):
            missing = [k for k, t in enumerate(self.tensors) if t is None]
            raise ValueError(f"wait() before every tensor was ready: tensors {missing[:10]} "
                             "were never passed to ready(k, x); their buckets (and the later "
                             "ones) have not started")
        try:
            reduced = BatchWork(self.pending, list, "buckets").wait(timeout)
        finally:
            self._reset()
        if self.edge is not None:  # the buckets go back, then unpack on the tensors' side
            reduced = [self.edge.back(buf) for buf in reduced]
        batch = StartedBatch(self.parts, reduced, len(self.layout), self.arrays,
                             lambda _: nullcontext())
        return [r[0] for r in batch.finish([[buf] for buf in reduced])]
