"""Step builders for the SPMD cases: what each rank calls, with its inputs and expected outcome.

Every builder returns a ``Step`` (a function of the rank's ``Ctx`` giving its ``Call``). Inputs
are small integers whose reductions are exact in any order, so a right result is compared bit
for bit against the float64 NumPy reference.
"""

from __future__ import annotations

import numpy as np

from collectives import ReduceOp
from collectives.tools.reference import exact_inputs, reference
from faults.kit import Call, Ctx, Expect, Step, ok, raises

COUNT = 6  # elements per rank: more than any rank count, and not a multiple of 4


def bucket_step(comm, like, xs=None, *args, **kwargs):
    """One step of ``comm.buckets(like, *args, **kwargs)``: each tensor of ``xs`` (``like``
    itself by default) marked ready in order, then the step's ``wait()``."""
    buckets = comm.buckets(like, *args, **kwargs)
    for k, x in enumerate(like if xs is None else xs):
        buckets.ready(k, x)
    return buckets.wait()


def inputs(ctx: Ctx, *, dtype=np.float64, op="sum", count: int = COUNT, seed: int = 0) -> list:
    """Every rank's input (this rank's is ``inputs(...)[ctx.rank]``)."""
    return exact_inputs(ctx.size, count, dtype, ReduceOp.parse(op), seed=seed)


def tolerance(op, dtype) -> float:
    """MEAN divides once: a float result may differ from the reference in its last bit."""
    return 1e-6 if ReduceOp.parse(op) is ReduceOp.MEAN and np.dtype(dtype).kind in "fc" else 0.0


def good(method: str = "all_reduce", *, op="sum", dtype=np.float64, count: int = COUNT,
         root: int = 0, seed: int = 0, delay: float = 0.0, **kwargs) -> Step:
    """A valid call of ``method`` on every rank, expecting the reference result."""

    def step(ctx: Ctx) -> Call:
        xs = inputs(ctx, dtype=dtype, op=op, count=count, seed=seed)
        x, rtol = xs[ctx.rank], tolerance(op, dtype)
        if method == "all_reduce":
            return Call(method, (x, op), kwargs, ok(reference(xs, ReduceOp.parse(op)), rtol=rtol),
                        delay=delay)
        if method == "reduce":
            want = reference(xs, ReduceOp.parse(op)) if ctx.rank == root else None
            return Call(method, (x, op), {"root": root, **kwargs}, ok(want, rtol=rtol),
                        delay=delay, same=False)
        if method == "broadcast":
            return Call(method, (x if ctx.rank == root else None,), {"root": root, **kwargs},
                        ok(xs[root]), delay=delay)
        if method == "all_gather":
            return Call(method, (x,), kwargs, ok(np.concatenate(xs)), delay=delay)
        if method == "reduce_scatter":
            full, n, i = reference(xs, ReduceOp.parse(op)), ctx.size, ctx.rank
            block = full[i * count // n:(i + 1) * count // n]
            return Call(method, (x, op), kwargs, ok(block, rtol=rtol), delay=delay, same=False)
        if method == "barrier":
            return Call(method, (), kwargs, ok(None), delay=delay)
        if method == "batch_all_reduce":
            ys = inputs(ctx, dtype=dtype, op=op, count=count + 3, seed=seed + 1)
            want = [reference(xs, ReduceOp.parse(op)), reference(ys, ReduceOp.parse(op))]
            return Call(method, ([x, ys[ctx.rank]], op), kwargs, ok(want, rtol=rtol), delay=delay)
        raise ValueError(f"no valid call for {method!r}")

    return step


def expecting(step: Step, expect=None, *, caught: bool = False, only=None,
              delay: float | None = None) -> Step:
    """``step`` with another expectation (an ``Expect``, or a function of the ``Ctx`` giving
    one), a caught error or a delay; ``only(ctx)``: the ranks this applies to."""

    def changed(ctx: Ctx) -> Call | None:
        c = step(ctx)
        if c is None or (only is not None and ctx.rank not in only(ctx)):
            return c
        if expect is not None:
            c.expect = expect if isinstance(expect, Expect) else expect(ctx)
        if delay is not None:
            c.delay = delay
        c.caught = caught or c.caught
        return c

    return changed


def absent(step: Step, who) -> Step:
    """``step`` with the ranks ``who(ctx)`` staying away from it."""
    return lambda ctx: None if ctx.rank in who(ctx) else step(ctx)


def bad(method: str, *args, error: str | tuple, match: str, **kwargs) -> Step:
    """A call with a bad argument on every rank: each raises ``error`` (or one of several) at
    once, before any data moves (after one agreement with its peers, which is how a rank's
    bad argument reaches them); the program catches it and goes on."""
    errors = (error,) if isinstance(error, str) else tuple(error)
    return lambda ctx: Call(method, args, dict(kwargs), raises(*errors, match=match, within=1.0),
                            caught=True)


def last(ctx: Ctx) -> set:
    return {ctx.size - 1}


def all_but_last(ctx: Ctx) -> set:
    return set(range(ctx.size - 1))


def timed_out(method: str, timeout: float, *, naming: str | None = None) -> Expect:
    """A ``CollectiveTimeoutError`` in ``method`` naming the missing ranks, raised within a
    second of ``timeout``; or, where another waiter timed out first and woke this one, a
    ``PeerFailedError`` that carries that timeout (thread ranks)."""
    who = rf" waiting for rank\(s\) {naming}," if naming else ""
    message = rf"{method}(\([^)]*\))?( \(call \d+\))? timed out after {timeout:g} s{who}"
    return (raises("CollectiveTimeoutError", match=message, within=timeout + 1.0)
            | raises("PeerFailedError", match=r"failed[^:]*: CollectiveTimeoutError: .*" + message))


def peer_failed(rank: int, error: str, within: float = 1.0) -> Expect:
    """``PeerFailedError`` naming the failed rank and its error, within ``within`` seconds."""
    return raises("PeerFailedError", match=rf"rank {rank}\b.*{error}", within=within)
