"""Buckets started as their tensors become ready: runs of consecutive tensors, a small first
bucket, and every bucket started as soon as its run is ready (``Communicator.buckets``)."""

from __future__ import annotations

import numpy as np
import pytest

import collectives
from collectives.algorithms.fusion import FIRST_BUCKET_BYTES, TAIL_BUCKET_BYTES, runs
from collectives.algorithms.packing import make_plan

MIB = 1 << 20


def _groups(plan):
    return [list(p.indices) for p in plan.packs]


def test_runs_are_consecutive_with_a_small_first_bucket():
    shapes = [(MIB // 8,)] * 6 + [(4 * MIB,)] + [(MIB // 8,)] * 3  # float32: 0.5 MiB, 16 MiB
    plan = runs(shapes, [np.float32] * len(shapes), 2 * MIB, alone_bytes=8 * MIB,
                first_bytes=FIRST_BUCKET_BYTES)
    groups = _groups(plan)
    assert [i for g in groups for i in g] == list(range(len(shapes)))  # contiguous, in order
    assert groups[0] == [0, 1]  # the first bucket holds at most 1 MiB
    assert groups[1] == [2, 3, 4, 5]  # the others 2 MiB
    assert groups[2] == [6]  # large: alone, and the open bucket closes before it
    assert groups[3] == [7, 8, 9]


def test_the_last_buckets_shrink_to_the_tail_size():
    """Each bucket holds at most half the bytes from its first tensor to the end (or the tail
    size): the tensors ready last wait behind a small bucket, not a full one still filling."""
    shapes = [(MIB // 8,)] * 40  # 40 tensors of 0.5 MiB (float32): 20 MiB
    sizes = [MIB // 2] * 40
    plain = _groups(runs(shapes, [np.float32] * 40, 4 * MIB, first_bytes=FIRST_BUCKET_BYTES))
    tapered = _groups(runs(shapes, [np.float32] * 40, 4 * MIB, first_bytes=FIRST_BUCKET_BYTES,
                           tail_bytes=MIB // 2))
    assert [len(g) for g in plain] == [2, 8, 8, 8, 8, 6]  # the last bucket: 3 MiB
    assert [i for g in tapered for i in g] == list(range(40))  # still contiguous, in order
    for g in tapered:
        assert sum(sizes[i] for i in g) <= max(MIB // 2, sum(sizes[g[0]:]) // 2), g
    assert [len(g) for g in tapered] == [2, 8, 8, 8, 7, 3, 2, 1, 1]  # the last: 0.5 MiB
    # what Communicator.buckets plans: the first bucket 1 MiB, the tail down to 256 KiB
    in_order = _groups(make_plan(shapes, [np.float32] * 40, bucket_bytes=4 * MIB, in_order=True))
    assert in_order == _groups(runs(shapes, [np.float32] * 40, 4 * MIB, first_bytes=MIB,
                                    tail_bytes=TAIL_BUCKET_BYTES)) == tapered


def test_runs_split_at_a_dtype_change_and_take_zero():
    plan = runs([(4,), (4,), (4,)], [np.float32, np.float64, np.float64], 1 << 10)
    assert _groups(plan) == [[0], [1, 2]]
    assert _groups(runs([(4,), (4,)], [np.float32] * 2, 0)) == [[0], [1]]


@pytest.mark.parametrize("algorithm", ["auto", "pscpu:20k:xring"])
@pytest.mark.parametrize("size", [1, 2])
def test_each_bucket_starts_once_its_run_is_ready(size, algorithm):
    """ResNet-like: many small tensors, a few large ones; after each ready(k), every bucket
    whose tensors are all ready has started (none waits behind a later tensor), and every
    bucket is a run of consecutive tensors, with a spec whose ranges interleave too (a
    bucket of one range's tensors 0 and 2 waited for tensor 2, and the buckets after it)."""
    rng = np.random.default_rng(0)
    shapes = [(int(n),) for n in rng.integers(1, 200_000, 40)]

    def body(comm):
        like = [np.zeros(s, np.float32) for s in shapes]
        buckets = comm.buckets(like, "sum", algorithm, bucket_bytes=256 << 10)
        members = [[part.indices[i] for i in p.indices] for part in buckets.parts
                   for p in part.plan.packs]
        assert all(m == list(range(m[0], m[-1] + 1)) for m in members), members
        plan_runs = sorted((min(m), max(m)) for m in members)
        late = []
        for k, x in enumerate(like):
            buckets.ready(k, np.full(x.shape, float(comm.rank + 1), np.float32))
            complete = sum(1 for _, last in plan_runs if last <= k)
            if buckets.started != complete:
                late.append((k, buckets.started, complete))
        results = buckets.wait()
        total = float(sum(range(1, comm.size + 1)))
        return late, len(plan_runs), all(bool((r == total).all()) for r in results)

    for late, count, right in collectives.run(body, size):
        assert not late, f"buckets started late: (k, started, complete) {late[:5]}"
        assert count > 3 and right


def test_numpy_scalars_are_numpy_arrays_to_buckets_as_to_every_call():
    # (``like=[numpy.float32(1.5)]`` was refused as an array of "no library", while
    # batch_all_reduce took it: arithmetic on 0-d arrays gives such scalars)
    def step(comm):
        xs = [np.float32(1.5) * (comm.rank + 1), np.complex64(1 + 2j), np.zeros((), np.int32)]
        buckets = comm.buckets(xs)
        for k, x in enumerate(xs):
            buckets.ready(k, x)
        return [r.tolist() for r in buckets.wait()]

    assert collectives.run(step, 2) == [[4.5, 2 + 4j, 0]] * 2


def test_a_wait_after_a_step_that_raised_says_what_ended_it():
    # (it blamed the tensors "never passed to ready", as if the step had not begun)
    def step(comm):
        buckets = comm.buckets([np.zeros(3), np.zeros(3)], bucket_bytes=0)
        x = np.full(3, comm.rank + 1.0)
        buckets.ready(0, x)
        buckets.ready(1, x)
        with pytest.raises(IndexError, match="k=2 is out of range"):
            buckets.ready(2, x)  # every bucket is out: the step is over, here alone
        with pytest.raises(ValueError) as raised:
            buckets.wait()
        return str(raised.value)

    for message in collectives.run(step, 1):
        assert "the last step ended here when it raised IndexError: k=2" in message, message


def test_a_wait_after_a_wait_that_timed_out_says_what_ended_the_step():
    # (the step's end went unrecorded where its wait() raised: the next wait() blamed the
    # tensors "never passed to ready")
    import time

    def step(comm):
        xs = [np.ones(3), np.ones(5, np.float32)]
        buckets = comm.buckets(xs)
        if comm.rank == 1:
            time.sleep(1.5)  # (away: alive, so that its peer's wait times out)
            return None
        for k, x in enumerate(xs):
            buckets.ready(k, x)
        with pytest.raises(collectives.CollectiveTimeoutError, match="after 0.3 s"):
            buckets.wait(timeout=0.3)
        with pytest.raises(ValueError) as raised:
            buckets.wait()
        return str(raised.value)

    message = collectives.run(step, 2, timeout=5)[0]
    assert "the last step ended here when it raised CollectiveTimeoutError" in message, message


def test_a_tensor_ready_twice_says_what_ends_the_step_and_what_takes_the_rest():
    # (it said only "already marked ready this step": a program whose own exception left a
    # step midway had no word of wait() taking the rest of it)
    def body(comm):
        like = [np.zeros(4) for _ in range(3)]
        buckets = comm.buckets(like, bucket_bytes=0)
        buckets.ready(0, np.ones(4))
        with pytest.raises(ValueError, match=r"ready this step \(1 of 3 tensors ready\).*call "
                                             r"wait\(\) before the next step"):
            buckets.ready(0, np.ones(4))
        return True

    assert collectives.run(body, 1) == [True]


def test_a_spec_of_ranges_cuts_buckets_as_a_plain_name_does_and_prices_each_by_its_size():
    # (cut by each tensor's range, weights and biases of alternating ranges made a bucket of
    # every tensor: 100 buckets for 50 layers, and 1200 for 600 refused the list; before
    # that, a bucket of one range's tensors waited for later tensors)
    like = [np.zeros(n, np.float32) for _ in range(50) for n in (40_000, 40)]

    def body(comm):
        plain = comm.buckets(like, "sum", "ring")
        ranged = comm.buckets(like, "sum", "ring:2k:rechd")
        cut = [[[part.indices[i] for i in pack.indices] for pack in part.plan.packs]
               for buckets in (plain, ranged) for part in buckets.parts]
        names = {part.spec.algorithm for part in ranged.parts
                 for _ in part.plan.packs if sum(like[i].size for i in part.indices) > 2048}
        return [m for part in cut[:len(plain.parts)] for m in part], \
            [m for part in cut[len(plain.parts):] for m in part], names

    plain, ranged, names = collectives.run(body, 1)[0]
    assert ranged == plain and len(plain) < 10, (len(plain), len(ranged))
    assert names == {"rechd"}  # (every bucket of more than 2k elements: the second range)


def test_a_spec_of_ranges_keeps_every_bucket_between_steps_as_a_plain_name_does():
    # (a bucket per part under a spec of ranges, and a keeper of 4 parts' buckets: of 20
    # buckets, 16 were made anew every step)
    sizes = [n for _ in range(20) for n in (3000, 7)]
    like = [np.zeros(n, np.float32) for n in sizes]

    def body(comm):
        kept = []
        for spec in ("ring", "ring:2k:rechd"):
            buckets = comm.buckets(like, "sum", spec, bucket_bytes=16384)
            for step in range(3):
                for k, n in enumerate(sizes):
                    buckets.ready(k, np.full(n, step + 1.0, np.float32))
                kept.append(len(buckets.took))
                assert float(buckets.wait()[1][0]) == (step + 1.0) * comm.size
        return kept

    plain_first, plain, plain_again, ranged_first, ranged, ranged_again = \
        collectives.run(body, 2)[0]
    assert plain_first == ranged_first == 0 and plain == plain_again > 10
    assert ranged == ranged_again == plain


def test_buckets_take_groups_as_an_array_as_the_plain_call_does():
    # (a bucket compared its groups with None elementwise: an array of groups raised at ready)
    def body(comm):
        groups = np.array([[0, 1], [2, 3]])
        buckets = comm.buckets([np.ones(4)], "sum", "ring/ring", groups=groups)
        buckets.ready(0, np.full(4, float(comm.rank)))
        plain = comm.all_reduce(np.full(4, float(comm.rank)), "sum", "ring/ring", groups=groups)
        return buckets.wait()[0].tolist(), plain.tolist()

    for got, plain in collectives.run(body, 4):
        assert got == plain == [6.0] * 4
