"""The SPMD API: one process (or thread) per rank, each calling the same collectives.

A ``Communicator`` wraps a point-to-point transport (thread ranks, MPI, ...). Each call:
validates its own arguments, agrees with every other rank on what is being called (the
collective, shape, dtype, op, root, algorithm; a mismatch raises the same
``CollectiveMismatchError`` everywhere, before any data moves), builds the shared schedule
and runs this rank's steps of it.

The agreement costs one small all-gather of a tuple per call (a few microseconds between
threads); ``check=False`` skips it where every microsecond counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import algorithms
from .api import pick_algorithm, resolve_groups
from .batch import plan_batch
from .errors import CollectiveMismatchError
from .execute import run_spmd
from .ops import ReduceOp, divide_for_mean, result_dtype
from .schedule import Collective
from .select import CostModel
from .validate import as_array, check_op, check_out, check_root, check_shards, flat

_FIELDS = ("collective", "shape", "dtype", "op", "root", "algorithm", "shards", "axis", "groups")


class Communicator:
    """Collectives among ``size`` ranks; this one is ``rank``."""

    def __init__(self, transport, *, timeout: float = 300.0, check: bool = True,
                 name: str = "local"):
        self.transport = transport
        self.rank: int = transport.rank
        self.size: int = transport.size
        self.timeout = timeout
        self.check = check
        self.name = name
        self._seq = 0
        self.cost_model: CostModel = getattr(transport, "cost_model", CostModel())

    def __repr__(self) -> str:
        return f"<Communicator {self.name} rank {self.rank} of {self.size}>"

    # --- plumbing -------------------------------------------------------------------------

    def _begin(self, collective: str, timeout: float | None, signature: dict) -> list[dict]:
        self._seq += 1
        timeout = self.timeout if timeout is None else float(timeout)
        self.transport.what = collective
        self.transport.timeout = timeout
        if not self.check:
            return [signature] * self.size
        signatures = self.transport.agree(("sig", self._seq), signature, timeout)
        if all(s == signature for s in signatures):
            return signatures
        for field in _FIELDS:
            seen = [s.get(field) for s in signatures]
            if field in ("shape", "dtype") and collective == "broadcast":
                seen = [v for v in seen if v is not None]
            if len(set(map(repr, seen))) > 1:
                by_rank = ", ".join(f"rank {r}: {s.get(field)!r}" for r, s in enumerate(signatures))
                raise CollectiveMismatchError(
                    f"rank {self.rank}: ranks called {signatures[0]['collective']} with different "
                    f"{field} ({by_rank}); every rank must pass the same {field}")
        return signatures

    def _schedule(self, collective: Collective, algorithm: str, nbytes: int, *, root: int = 0,
                  shards: int = 0, groups=None):
        name = pick_algorithm(collective, algorithm, self.size, nbytes, self.cost_model)
        return algorithms.build(collective, name, self.size, root=root, shards=shards,
                                groups=resolve_groups(groups, self.size))

    def _run(self, schedule, buf: np.ndarray, op: ReduceOp, granule: int = 1) -> None:
        run_spmd(schedule, buf, op, self.transport, granule=granule, seq=self._seq)

    def _signature(self, collective, x=None, op=None, root=None, algorithm="auto", shards=0,
                   axis=None, groups=None) -> dict:
        return {"collective": collective,
                "shape": None if x is None else tuple(x.shape),
                "dtype": None if x is None else str(np.dtype(x.dtype)),
                "op": None if op is None else op.value, "root": root,
                "algorithm": algorithms.canonical(algorithm), "shards": shards, "axis": axis,
                "groups": resolve_groups(groups, self.size)}

    # --- collectives ----------------------------------------------------------------------

    def all_reduce(self, x, op: ReduceOp | str = "sum", algorithm: str = "auto", *, out=None,
                   shards: int = 0, groups=None, timeout: float | None = None) -> np.ndarray:
        """Reduce ``x`` over all ranks; every rank gets the (bitwise identical) result."""
        x = as_array(x, "x")
        op = check_op(op, x.dtype, "x")
        shards = check_shards(shards)
        final = result_dtype(op, x.dtype)
        if out is not None:
            check_out(out, x.shape, final)
        self._begin("all_reduce", timeout,
                    self._signature("all_reduce", x, op, None, algorithm, shards, groups=groups))
        schedule = self._schedule(Collective.ALL_REDUCE, algorithm, x.nbytes, shards=shards,
                                  groups=groups)
        work = out if out is not None and final == x.dtype else np.empty(x.shape, x.dtype)
        if work is not x:
            np.copyto(work, x)
        self._run(schedule, work.reshape(-1), op.wire_op)
        if op is ReduceOp.MEAN:
            return divide_for_mean(work, self.size, out=out if out is not None else
                                   (work if final == x.dtype else None))
        return work

    def reduce(self, x, op: ReduceOp | str = "sum", root: int = 0, algorithm: str = "auto", *,
               shards: int = 0, timeout: float | None = None):
        """Reduce onto ``root``; returns the result there and None on every other rank."""
        x = as_array(x, "x")
        op = check_op(op, x.dtype, "x")
        root = check_root(root, self.size)
        shards = check_shards(shards)
        self._begin("reduce", timeout, self._signature("reduce", x, op, root, algorithm, shards))
        schedule = self._schedule(Collective.REDUCE, algorithm, x.nbytes, root=root, shards=shards)
        work = np.array(x, copy=True, order="C")
        self._run(schedule, work.reshape(-1), op.wire_op)
        if self.rank != root:
            return None
        return divide_for_mean(work, self.size) if op is ReduceOp.MEAN else work

    def broadcast(self, x=None, root: int = 0, algorithm: str = "auto", *, out=None,
                  timeout: float | None = None) -> np.ndarray:
        """Every rank gets root's ``x``; other ranks may pass None (or ``out`` to fill)."""
        root = check_root(root, self.size)
        if self.rank == root or x is not None:
            x = as_array(x, "x")
        if x is None and not self.check:
            raise ValueError("x is None on a non-root rank and check=False, so its shape is "
                             "unknown; pass an array of the root's shape and dtype")
        signatures = self._begin("broadcast", timeout,
                                 self._signature("broadcast", x, None, root, algorithm))
        shape, dtype = signatures[root]["shape"], np.dtype(signatures[root]["dtype"])
        if out is not None:
            check_out(out, shape, dtype)
        work = out if out is not None else np.empty(shape, dtype)
        if self.rank == root:
            np.copyto(work, x)
        schedule = self._schedule(Collective.BROADCAST, algorithm, work.nbytes, root=root)
        self._run(schedule, work.reshape(-1), ReduceOp.SUM)
        return work

    def all_gather(self, x, axis: int = 0, algorithm: str = "auto", *,
                   timeout: float | None = None) -> np.ndarray:
        """Concatenation of every rank's ``x`` along ``axis``, in rank order."""
        x = as_array(x, "x")
        ndim = max(x.ndim, 1)
        if not -ndim <= axis < ndim:
            raise ValueError(f"axis={axis} is out of range for x of {x.ndim} dimensions")
        self._begin("all_gather", timeout,
                    self._signature("all_gather", x, None, None, algorithm, 0, axis % ndim))
        n, size = self.size, x.size
        schedule = self._schedule(Collective.ALL_GATHER, algorithm, n * x.nbytes)
        work = np.empty(n * size, x.dtype)
        work[self.rank * size:(self.rank + 1) * size] = flat(x)
        self._run(schedule, work, ReduceOp.SUM, granule=size if size else 1)
        base = x.shape if x.ndim else (1,)
        return np.concatenate(list(work.reshape((n, *base))), axis=axis)

    def reduce_scatter(self, x, op: ReduceOp | str = "sum", algorithm: str = "auto", *,
                       shards: int = 0, timeout: float | None = None) -> np.ndarray:
        """Reduce, then rank ``i`` keeps rows ``floor(i R / n)`` to ``floor((i+1) R / n)``."""
        x = as_array(x, "x")
        if x.ndim == 0:
            raise ValueError("x is a scalar; reduce_scatter splits axis 0, so pass an array")
        op = check_op(op, x.dtype, "x")
        shards = check_shards(shards)
        self._begin("reduce_scatter", timeout,
                    self._signature("reduce_scatter", x, op, None, algorithm, shards))
        schedule = self._schedule(Collective.REDUCE_SCATTER, algorithm, x.nbytes, shards=shards)
        work = np.array(x, copy=True, order="C")
        row = int(np.prod(x.shape[1:]))
        self._run(schedule, work.reshape(-1), op.wire_op, granule=row if row else 1)
        rows, n, i = x.shape[0], self.size, self.rank
        mine = work[i * rows // n:(i + 1) * rows // n]
        return divide_for_mean(mine, n) if op is ReduceOp.MEAN else mine

    def barrier(self, timeout: float | None = None) -> None:
        """Return once every rank has arrived (or raise naming those that did not)."""
        self._seq += 1
        self.transport.what = "barrier"
        self.transport.agree(("barrier", self._seq), None,
                             self.timeout if timeout is None else timeout)

    def batch_all_reduce(self, xs: Sequence, op: ReduceOp | str = "sum", algorithm="auto", *,
                         num_packs: int = 0, agg_small_grads_max_bytes: int = 0,
                         agg_small_grads_max_group: int = 10, bytes_per_pack: int | None = None,
                         shards: int = 0, groups=None, timeout: float | None = None) -> list:
        """All-reduce a list of tensors as few packed buffers; results in input order.

        ``algorithm`` takes any all-reduce spec (see ``collectives.spec``); the packing knobs
        are those of ``collectives.batch_all_reduce``.
        """
        xs = [as_array(x, f"xs[{k}]") for k, x in enumerate(xs)]
        for k, x in enumerate(xs):
            check_op(op, x.dtype, f"xs[{k}]")
        parts = plan_batch([tuple(x.shape) for x in xs], [np.dtype(x.dtype) for x in xs], algorithm,
                           num_packs=num_packs, agg_small_grads_max_bytes=agg_small_grads_max_bytes,
                           agg_small_grads_max_group=agg_small_grads_max_group,
                           bytes_per_pack=bytes_per_pack, shards=check_shards(shards))
        results: list = [None] * len(xs)
        for part in parts:
            packed = part.plan.pack([xs[i] for i in part.indices])
            reduced = [self.all_reduce(buf, op, part.spec.algorithm, shards=part.spec.shards,
                                       groups=groups, timeout=timeout) for buf in packed]
            for i, result in zip(part.indices, part.plan.unpack(reduced)):
                results[i] = result
        return results
