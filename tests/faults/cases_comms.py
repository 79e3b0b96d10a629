"""Fault cases about making communicators: ``split`` and ``dup`` with a bad argument on one rank
or called by one rank only, arguments MPI cannot hold, a rank that raises while the others split
or use a child, and child communicators that must not outlive their use. ``faults.table``
gathers them.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np

from faults.bodies import boom
from faults.kit import Call, Case, Ctx, ok, raises
from faults.steps import bad, good, inputs, peer_failed, timed_out

CASES: list[Case] = []
THREADS = {"where": ("threads",)}
T = 0.5  # the timeout of cases where ranks stay away


def add(name: str, *steps, **meta) -> None:
    CASES.append(Case(name, steps, **meta))


def then_usable(ctx: Ctx) -> Call:
    return good(seed=7)(ctx)


def _split(color, key=0):
    return lambda comm: comm.split(color, key)


def _one_rank_bad(bad_call, right_call, error: str):
    def step(ctx: Ctx) -> Call:
        if ctx.rank == 1:
            return Call(bad_call, expect=raises(error, within=1.0), caught=True)
        return Call(right_call, expect=peer_failed(1, error), caught=True)
    return step


# --- a bad argument on one rank, or on every rank ---------------------------------------------

add("split-bad-color-on-one-rank", _one_rank_bad(_split(-1), _split(0), "ValueError"),
    then_usable, timeout=2.0, limit=8)
add("split-bad-key-on-one-rank", _one_rank_bad(_split(0, 1.5), _split(0), "TypeError"),
    then_usable, timeout=2.0, limit=8)
add("split-color-too-large", bad("split", 2 ** 40, error="ValueError", match="color"),
    then_usable, timeout=2.0, limit=8)
# (a color of the wrong type raised ValueError, where the docstring promises TypeError)
add("split-color-not-an-int", bad("split", 1.5, error="TypeError", match="color"),
    then_usable, timeout=2.0, limit=8)
add("split-key-too-large", bad("split", 0, 2 ** 40, error="ValueError", match="key"),
    then_usable, timeout=2.0, limit=8)

# --- one rank alone makes a communicator: it times out instead of waiting forever ------------


def _alone(method: str, *args):
    def step(ctx: Ctx) -> Call | None:
        if ctx.rank != 0:
            return None
        return Call(method, args, {}, timed_out(method, T))
    return step


add("dup-on-one-rank", _alone("dup"), timeout=T, limit=8)
add("split-on-one-rank", _alone("split", 0), timeout=T, limit=8)

# --- a rank whose own code raises: the others hear it in split and in children --------------


def _raising_rank_while(body):
    def step(ctx: Ctx) -> Call:
        if ctx.rank == 1:
            return Call(boom, expect=raises("RuntimeError"))
        return Call(body(ctx), expect=peer_failed(1, "RuntimeError", within=1.5))
    return step


def _in_split(ctx: Ctx):
    return lambda comm: comm.split(0)


def _raising_after(make):
    """Every rank makes a child; then rank 1's own code raises while the others use it."""
    def step(ctx: Ctx) -> Call:
        x = inputs(ctx)[ctx.rank]

        def run(comm):
            child = make(comm)
            if comm.rank == 1:
                boom(comm)
            return child.all_reduce(x)

        expect = (raises("RuntimeError") if ctx.rank == 1
                  else peer_failed(1, "RuntimeError", within=1.5))
        return Call(run, expect=expect)
    return step


add("raising-rank-during-split", _raising_rank_while(_in_split), timeout=5.0, **THREADS)
add("raising-rank-in-dup-child", _raising_after(lambda comm: comm.dup()), timeout=5.0,
    **THREADS)
add("raising-rank-in-split-child", _raising_after(lambda comm: comm.split(0)), timeout=5.0,
    **THREADS)

# --- children do not outlive their use -------------------------------------------------------


def _children_released(ctx: Ctx) -> Call:
    """200 ``dup().free()`` and 50 splits, each child dropped: the parent holds none of them."""
    def body(comm):
        worlds = []
        for k in range(250):
            child = comm.dup() if k < 200 else comm.split(comm.rank % 2)
            worlds.append(weakref.ref(child.transport.world))
            child.free()
            del child
        comm.barrier()  # every rank has joined every child
        gc.collect()
        return [sum(w() is not None for w in worlds), len(comm.transport.world.children)]

    return Call(body, expect=ok(check=lambda got: None if got == [0, 0] else
                                f"{got[0]} child worlds still alive, {got[1]} held by the parent"))


add("children-released", _children_released, limit=20, **THREADS)


def _child_works(ctx: Ctx) -> Call:
    """After all that, a split still gives working children (a plain check of the path)."""
    xs = inputs(ctx)
    evens = [x for r, x in enumerate(xs) if r % 2 == ctx.rank % 2]

    def run(comm):
        child = comm.split(comm.rank % 2, key=-comm.rank)
        try:
            return child.all_reduce(xs[comm.rank])
        finally:
            child.free()

    return Call(run, expect=ok(np.sum(evens, axis=0)), same=False)


add("split-children-work", _child_works, then_usable)
