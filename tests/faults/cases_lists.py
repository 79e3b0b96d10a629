"""Tensor lists that differ on one rank, and buckets after a refused step.

* Lists that differ from the first call on, or after the list was agreed: one tensor's dtype,
  or one rank's list empty. Every kind that reduces a list as one (a fused batch, blocking and
  asynchronous, unfused, buckets fused and unfused, a sub-communicator's batch) raises an
  error naming the mismatch on every rank within a second (the blocking kinds:
  ``CollectiveMismatchError`` naming the lists): never the wrong error, never one rank
  returning at once while its peers wait out their timeout.
* Buckets whose step one rank refused (a bad ``ready``, an early ``wait()``) take the next
  step's tensors on every rank, and reduce them right.
"""

from __future__ import annotations

import weakref

import numpy as np

from faults.cases_kinds import (
    BOTH,
    COMM_TIMEOUT,
    KINDS,
    ONE_RANK_BAD_BATCH,
    SIZES,
    run,
    sums,
    tensors,
)
from faults.kit import Call, Case, Ctx, ok, raises
from faults.steps import bucket_step, peer_failed

CASES: list[Case] = []
L = [(2, 3), (5,), (3, 2)]


def _buckets_fused(comm, xs, op="sum", timeout=None):
    return bucket_step(comm, xs, None, op, timeout=timeout)


LIST_KINDS = {**{k: KINDS[k] for k in ("batch", "batch-async", "batch-unfused", "buckets",
                                       "subcomm")},
              "buckets-fused": _buckets_fused}
BLOCKING = ("batch", "batch-unfused", "subcomm")
# one rank's list against its peers': a tensor of another dtype, or nothing at all
ODD_LISTS = {"dtype": lambda xs: [xs[0], xs[1].astype(np.float64), xs[2]],
             "empty": lambda xs: []}


def one_list_differs(kind: str, odd: str):
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, L)
        if ctx.rank == ctx.size - 1:
            xs = ODD_LISTS[odd](xs)
        if kind in BLOCKING:  # (naming the lists, whatever bucket differs; a rank whose
            # peer raised it and left first hears of it from that peer)
            expect = raises("CollectiveMismatchError", "PeerFailedError",
                            match="different tensor lists", within=1.0)
        else:  # (pipelined buckets: a rank may find the mismatch in a later bucket's
            # message, and its peers then hear of it from that rank)
            expect = raises("CollectiveMismatchError", within=1.0) | raises(
                "PeerFailedError", "CommunicatorBrokenError", match="CollectiveMismatchError",
                within=1.0)
        return Call(lambda comm: LIST_KINDS[kind](comm, xs), expect=expect, same=False)
    return step


def agreed(kind: str):
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, L)
        return Call(lambda comm: LIST_KINDS[kind](comm, xs), expect=ok(sums(ctx, L)))
    return step


for kind in LIST_KINDS:
    for odd in ODD_LISTS:
        CASES.append(Case(f"lists-{kind}-one-rank-{odd}-first-call",
                          (one_list_differs(kind, odd),), where=BOTH, sizes=SIZES,
                          timeout=COMM_TIMEOUT, limit=20.0))
        CASES.append(Case(f"lists-{kind}-one-rank-{odd}-after-agreement",
                          (agreed(kind), one_list_differs(kind, odd)), where=BOTH, sizes=SIZES,
                          timeout=COMM_TIMEOUT, limit=20.0))


def _split(xs):
    """The same bytes as ``xs``, of the same dtype, cut elsewhere: one fused bucket alike."""
    flat = np.concatenate([x.reshape(-1) for x in xs])
    return [flat[:8], flat[8:]]


def both_lists(kind: str):
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, L)
        def body(comm):
            for _ in range(2):
                LIST_KINDS[kind](comm, xs)
                LIST_KINDS[kind](comm, _split(xs))
        return Call(body, expect=ok(None), same=False)
    return step


def split_on_one_rank(kind: str):
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, L)
        mine = _split(xs) if ctx.rank == ctx.size - 1 else xs
        return Call(lambda comm: LIST_KINDS[kind](comm, mine), same=False,
                    expect=raises("CollectiveMismatchError", "PeerFailedError",
                                  match=r"float32\(8,\), float32\(9,\)", within=1.0))
    return step


for kind in BLOCKING:
    # Both lists agreed before, one rank now passes the other: the same bucket (17 float32)
    # under another tag, whose check rides with the data. The error named no list: "it runs
    # all_reduce(float32[17], op=sum) where this rank runs all_reduce(float32[17], op=sum)"
    # (MPI), "its message belongs to a call with other arguments" (threads).
    CASES.append(Case(f"lists-{kind}-cut-otherwise-on-one-rank-both-agreed",
                      (both_lists(kind), split_on_one_rank(kind)), where=BOTH, sizes=SIZES,
                      timeout=COMM_TIMEOUT, limit=20.0))


def all_empty(ctx: Ctx) -> Call:
    """Every rank's list empty: every kind returns an empty list (agreed, nothing moves)."""
    def body(comm):
        return {kind: LIST_KINDS[kind](comm, []) for kind in LIST_KINDS}

    def empty(got) -> str | None:
        return None if got == dict.fromkeys(LIST_KINDS, []) else f"got {got!r}"
    return Call(body, expect=ok(check=empty))


CASES.append(Case("lists-every-rank-empty", (all_empty, run("batch", L)), where=BOTH,
                  sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))

# --- buckets after a refused step: the next step runs on every rank ------------------------------

# three buckets, each tensor alone: tensor 0's starts, then the step is refused (the peers
# issue all three); and two tensors fused in one bucket (tensor 0 marked, nothing started)
SHAPES = {"three": [(3,), (4,), (5,)], "fused": [(3,), (4,)]}
KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _kept(comm, xs):
    """This communicator's one ``Buckets`` for ``xs``'s shapes, made in the first step."""
    buckets = KEPT.get(comm)
    if buckets is None:
        buckets = KEPT[comm] = comm.buckets(xs, bucket_bytes=0 if len(xs) == 3 else 1 << 20)
    return buckets


def _run_kept(comm, xs):
    buckets = _kept(comm, xs)
    for k, x in enumerate(xs):
        buckets.ready(k, x)
    return buckets.wait()


def kept_step(layout: str):
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, SHAPES[layout])
        return Call(lambda comm: _run_kept(comm, xs), expect=ok(sums(ctx, SHAPES[layout])))
    return step


def refused_step(how: str, layout: str):
    """Rank 0 marks tensor 0 ready, then refuses the step (``ready`` of a tensor of the wrong
    shape, or ``wait()`` before tensor 1): it raises naming why, its peers hear of it."""
    why = {"bad-ready": "tensor 1 is", "early-wait": "wait\\(\\) before every tensor"}[how]

    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, SHAPES[layout])
        if ctx.rank != 0:
            return Call(lambda comm: _run_kept(comm, xs), expect=peer_failed(0, why),
                        caught=True)

        def body(comm):
            buckets = _kept(comm, xs)
            buckets.ready(0, xs[0])
            if how == "bad-ready":
                buckets.ready(1, np.zeros(7, np.float32))  # (tensor 1 is 4 long)
            buckets.wait()
        return Call(body, expect=raises("ValueError", match=why, within=1.0), caught=True)
    return step


# (the list's first step: its peers' buckets are calls not yet agreed, so they move no data
# before they hear of the refusal, and the communicator stays whole; once the list was agreed
# they move a bucket's data first, and a refusal breaks the communicator, as documented)
for how in ("bad-ready", "early-wait"):
    for layout in SHAPES:
        CASES.append(Case(f"buckets-next-step-after-one-rank-{how}-{layout}",
                          (refused_step(how, layout), kept_step(layout), kept_step(layout)),
                          where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))

# --- one list cut into other buckets: ranks stay in step, or break together -----------------


def cut_differently(kind: str):
    """The same list on every rank, the last rank's cut into a bucket per tensor
    (``bucket_bytes=0``), its peers' fused into one: a mismatch naming the buckets on every
    rank within a second."""
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, L)
        cut = {"bucket_bytes": 0} if ctx.rank == ctx.size - 1 else {}

        def body(comm):
            if kind == "buckets":
                return bucket_step(comm, xs, **cut)
            if kind == "batch-async":
                return comm.batch_all_reduce(xs, async_op=True, **cut).wait()
            return comm.batch_all_reduce(xs, **cut)
        # (a rank still issuing its buckets may hear the verdict first: a broken
        # communicator then, and the error says by what; a rank slower still may hear first
        # that a peer left, broken so: about one run in 200 on a loaded machine)
        return Call(body, expect=raises("CollectiveMismatchError", match="in 3 buckets",
                                        within=1.0) | raises(
            "CommunicatorBrokenError", match="different numbers of calls.*in 3 buckets",
            within=1.0) | raises("PeerFailedError", match="left after call .*: "
                                 "CommunicatorBrokenError", within=1.0),
                    same=False, caught=True)
    return step


def after_cut(kind: str):
    """The next call: a blocking batch issued one bucket on every rank, so the ranks are in
    step and it runs; asynchronous kinds issued three against one, so no later call can pair,
    and every rank says so at once (not after its timeout)."""
    def step(ctx: Ctx) -> Call:
        if kind == "batch":
            return Call("all_reduce", (np.ones(2),), expect=ok(np.full(2, float(ctx.size))))
        return Call("all_reduce", (np.ones(2),), expect=raises(
            "CommunicatorBrokenError", match="different numbers of calls", within=1.0))
    return step


for kind in ("batch", "batch-async", "buckets"):
    CASES.append(Case(f"lists-{kind}-cut-into-other-buckets", (cut_differently(kind),
                                                                after_cut(kind)),
                      where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))


def bad_arg_three_buckets(kind: str, bad: dict, error: str, match: str, bad_xs=None,
                          bucket_bytes: int = 0):
    """Rank 0 passes a bad argument (``bad``, or its list made by ``bad_xs``) to a list its
    peers cut into three buckets, all issued at once (asynchronous, or as buckets), on the
    list's first step: rank 0 raises naming it, its peers a PeerFailedError, and as rank 0
    refuses each of their three calls, every rank's next call works (once, the peers' second
    bucket paired with rank 0's next call; then rank 0 refused one call against their three,
    and every rank's next call said the ranks were out of step; a bad list or
    ``bucket_bytes``, which leaves rank 0 without the buckets, did so until its first
    refusal's verdict told it their count). With ``bucket_bytes`` the peers fuse their list
    into one bucket, where rank 0's bad dtype makes a bucket of its own: it counted two, and
    the communicator broke."""
    if kind == "buckets":  # (their list is ``like``, and its errors name it so)
        match = match.replace("xs ", "like ").replace("xs\\[", "like\\[")

    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, L)
        kwargs = {"bucket_bytes": bucket_bytes, **(bad if ctx.rank == 0 else {})}
        given = bad_xs(xs) if bad_xs is not None and ctx.rank == 0 else xs

        def body(comm):
            if kind == "buckets":
                return bucket_step(comm, given, xs, **kwargs)
            return comm.batch_all_reduce(given, async_op=True, **kwargs).wait()
        mine = raises(error, match=match, within=1.0)
        theirs = peer_failed(0, match)
        return Call(body, expect=mine if ctx.rank == 0 else theirs, same=False, caught=True)
    return step


def works_after(ctx: Ctx) -> Call:
    return Call("all_reduce", (np.ones(2),), expect=ok(np.full(2, float(ctx.size)), within=1.0))


def cut_differently_bad_ready(ctx: Ctx) -> Call:
    """The last rank cuts the list into a bucket per tensor, its peers into one, and its
    first ``ready`` is bad: it raises naming the tensor, its peers a PeerFailedError, and the
    next call works (it refused its own three buckets against their one, and broke the
    communicator: before any bucket agreed, its peers say how many they issued)."""
    xs = tensors(ctx, L)
    last = ctx.rank == ctx.size - 1

    def body(comm):
        given = [x.astype(np.float64) if last and k == 0 else x for k, x in enumerate(xs)]
        return bucket_step(comm, xs, given, **({"bucket_bytes": 0} if last else {}))
    mine = raises("ValueError", match="tensor 0 is float64", within=1.0)
    return Call(body, expect=mine if last else peer_failed(ctx.size - 1, "tensor 0"),
                same=False, caught=True)


CASES.append(Case("lists-buckets-cut-into-other-buckets-bad-ready-first-step",
                  (cut_differently_bad_ready, works_after),
                  where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))


# Every bad argument of a blocking batch's matrix (cases_kinds), and those a list's buckets
# check once they are known (JAX's list left out: its import takes seconds in every process)
BAD_FOR_THREE_BUCKETS = {
    **{what: bad for what, bad in ONE_RANK_BAD_BATCH.items() if what != "mixed-libraries"},
    "timeout": ({"timeout": -1}, "ValueError", "timeout=-1", None),
    "groups": ({"groups": [[0]]}, "ValueError", r"groups=\[\[0\]\]", None)}
for kind in ("batch-async", "buckets"):
    for what, (bad, error, match, bad_xs) in BAD_FOR_THREE_BUCKETS.items():
        CASES.append(Case(f"lists-{kind}-bad-{what.removeprefix('bad-')}-one-rank-three-buckets",
                          (bad_arg_three_buckets(kind, bad, error, match, bad_xs), works_after),
                          where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))

# A tensor of a dtype of its own on rank 0: a bucket its peers' fused list does not have
BAD_OWN_BUCKET = {
    "object": ({}, "TypeError", r"xs\[2\] has dtype object",
               lambda xs: [*xs[:2], xs[2].astype(object)]),
    "complex-max": ({"op": "max"}, "TypeError", r"xs\[2\] of dtype complex64",
                    lambda xs: [*xs[:2], xs[2].astype(np.complex64)])}
for kind in ("batch-async", "buckets"):
    for what, (bad, error, match, bad_xs) in BAD_OWN_BUCKET.items():
        CASES.append(Case(f"lists-{kind}-bad-{what}-one-rank-bucket-of-its-own",
                          (bad_arg_three_buckets(kind, bad, error, match, bad_xs, 1 << 20),
                           works_after),
                          where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))


def more_packs_than_handles(ctx: Ctx) -> Call:
    """An asynchronous batch of ``num_packs`` packs of each of two dtypes, more in all than a
    communicator holds handles unwaited (each within num_packs' own limit): a ValueError
    naming num_packs on every rank at once, and the next call works (it was refused as the
    rank's handles being crowded, "wait() for some first", with none unwaited; a list of too
    many buckets: ``cases_kinds.too_many_buckets``)."""
    return Call("batch_all_reduce", ([np.ones(3), np.ones(3, np.float32)],),
                dict(async_op=True, num_packs=600),
                expect=raises("ValueError", match="1200 calls.*num_packs=600", within=1.0),
                caught=True)


CASES.append(Case("lists-batch-async-more-packs-than-handles", (more_packs_than_handles,
                                                                 works_after),
                  where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT, limit=20.0))


# --- one list reduced as different kinds on different ranks: they pair, call for call ------


def _reduced_as(kind: str):
    """Small tensors in buckets of one each (MPI: persistent requests, made in the same order
    on every rank): a blocking batch, or the last rank's ``kind`` in that step alone."""
    def step(ctx: Ctx) -> Call:
        xs = tensors(ctx, [(1000,), (1000,), (7,)])

        def body(comm):
            mine = kind if ctx.rank == ctx.size - 1 else "batch"
            if kind == "buckets":  # (made on every rank: a step they all take)
                buckets = comm.buckets(xs, bucket_bytes=0)
            if mine == "buckets":
                for k, x in enumerate(xs):
                    buckets.ready(k, x)
                return buckets.wait()
            if mine == "batch-async":
                return comm.batch_all_reduce(xs, bucket_bytes=0, async_op=True).wait()
            return comm.batch_all_reduce(xs, bucket_bytes=0)
        return Call(body, expect=ok(sums(ctx, [(1000,), (1000,), (7,)]), within=1.0))
    return step


for kind in ("batch-async", "buckets"):
    # (MPI: a bucket's persistent request was kept per signature, whose batch tag tells a
    # blocking batch from an asynchronous one: the last rank made a request its peers did
    # not, their requests never matched again, and every rank waited out its timeout)
    CASES.append(Case(f"lists-one-rank-as-{kind}-pairs-with-a-blocking-batch",
                      (_reduced_as("batch"), _reduced_as(kind), _reduced_as("batch"),
                       _reduced_as("batch")), where=BOTH, sizes=SIZES, timeout=COMM_TIMEOUT,
                      limit=20.0))
