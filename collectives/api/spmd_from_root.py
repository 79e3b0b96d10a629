"""Broadcast's and scatter's arguments: what each rank checks before the opening all-reduce
that tells non-roots what they will receive (``collectives.runtime.from_root``).

Non-roots may pass ``x=None``; every error (a bad root, algorithm, the root's ``x``, or any
rank's ``out``) goes into the opening agreement, so every rank hears of it before any data
moves. A non-root that passes ``out`` but no ``x`` knows the shape and dtype it will receive
from it: those are agreed with the root's like an ``x``'s, so an ``out`` unlike the root's
array is a mismatch on every rank, not an error on its own rank after the root has returned.
"""

from __future__ import annotations

from typing import Any

from .. import algorithms
from ..algorithms.schedule import Collective
from ..runtime.calls import resolve_algorithm
from ..runtime.from_root import FromRoot, Header, Opening, check_describable, dtype_token, from_token
from ..runtime.validate import check_out, check_root


def build_broadcast(comm, x: Any, root: int, algorithm: Any, out: Any):
    """The builder ``comm.calls.start`` runs for ``comm.broadcast(...)``."""
    return build_rooted(comm, Collective.BROADCAST, x, root, algorithm, out)


def build_rooted(comm, kind: Collective, x: Any, root: int, algorithm: Any, out: Any, *,
                 problem: TypeError | ValueError | None = None):
    """The builder of a broadcast or a scatter: the root's ``x`` goes out whole, or one row of
    its leading axis (of length ``size``) to each rank. ``problem``: why this rank cannot take
    part (e.g. a root that could not pickle its object), told to every rank in the opening."""
    scatter = kind is Collective.SCATTER

    def build(seq: int):
        arrays = comm.arrays
        known, error, src, name, root_ = None, None, None, "auto", -1
        mine = root == comm.rank
        try:  # every error goes into the opening agreement, so that every rank hears of it
            root_ = check_root(root, comm.size)
            if problem is not None:
                raise problem
            name, _ = resolve_algorithm(algorithm, 0, 0, comm.calls.native_names)
            if name not in comm.calls.native_names and name != "auto" and not algorithms.supports(
                    kind, name):
                raise ValueError(f"algorithm={algorithm!r} has no {kind.value}; use 'auto' or one "
                                 f"of {', '.join(algorithms.names_for(kind))}")
            if mine:  # the root prepares everything it can before agreeing
                xa = comm.adapt(x, "x")
                if scatter:
                    _check_rows(xa, comm.size, "")
                call = comm.calls.validated(kind, xa, None, name, root=root_)
                known = (call.shape[1:] if scatter else call.shape), dtype_token(call.dtype)
                if len(known[0]) > 16:
                    raise ValueError(f"x has {len(known[0])} dimensions; at most 16 broadcast")
                check_describable(known, call.dtype)
                src = arrays.flat(xa)
            elif x is not None:  # (agreed with the root's: the same shape and dtype)
                xa = comm.adapt(x, "x")
                if scatter:
                    _check_rows(xa, comm.size, ", as the root's, or pass None")
                known = tuple(xa.shape[1:] if scatter else xa.shape), dtype_token(xa.dtype)
            elif out is not None:  # (what it will receive, agreed with the root's)
                check_out(out, None, None, "out", arrays)
                known = tuple(out.shape), dtype_token(out.dtype)
            elif not comm.check:
                raise ValueError("with check=False, non-root ranks must pass x or out (the "
                                 "shape and dtype to receive); or use check=True")
            if out is not None and known is not None:  # (the root's too: it returns out)
                check_out(out, known[0], from_token(known[1]), "out", arrays)
        except (TypeError, ValueError, MemoryError) as exc:
            if not comm.check:
                raise
            error = exc
        # (-1: a root that is not a rank, every rank hears why)
        header = Header(root_, name, kind, comm.calls.batch)
        # natives start in call order: this call's place is taken now, whatever it runs later
        turn = comm.calls.engine.reserve_turn()
        result = FromRoot(comm, seq, header, src, out, turn)
        stage = Opening(comm, seq, header, known, error, result.data_stage, turn)
        return header, [stage], result

    return build


def _check_rows(xa: Any, size: int, or_else: str) -> None:
    """A scatter's ``x`` has one row per rank along its leading axis."""
    if len(xa.shape) == 0 or xa.shape[0] != size:
        raise ValueError(f"x has shape {tuple(xa.shape)}; scatter's x needs a leading axis of "
                         f"length {size} (one row per rank){or_else}")
