"""Fused buckets kept from one batched call to the next (``collectives/algorithms/reuse.py``),
on PyTorch tensors (CPU) over thread ranks: a call whose last results nobody refers to any
more packs into the same bucket and hands back the same view objects, with fresh values;
anything that still refers to a result (the result, a view or export of it, a handle in
flight) keeps its values through the next call. CuPy's side runs in tests/gpu."""

from __future__ import annotations

import gc

import pytest

import collectives

torch = pytest.importorskip("torch")

SHAPES = [(3, 4), (5,), (2, 2, 2), (7,)]  # one fused bucket of four tensors
RANKS = 2


def grads(c, step: int) -> list:
    return [torch.full(s, float((c.rank + 1) * step)) for s in SHAPES]


def total(step: int) -> float:
    return float(sum((r + 1) * step for r in range(RANKS)))


def holds(results: list, step: int) -> bool:
    return all(bool((r == total(step)).all()) for r in results)


def test_a_call_whose_results_are_gone_reuses_bucket_and_views():
    def body(c):
        first = c.batch_all_reduce(grads(c, 1))
        ids, address = [id(r) for r in first], first[0].data_ptr()
        del first
        gc.collect()
        second = c.batch_all_reduce(grads(c, 2))
        return ([id(r) for r in second] == ids, second[0].data_ptr() == address,
                holds(second, 2), [tuple(r.shape) for r in second] == SHAPES)

    for reused, same_memory, values, shapes in collectives.run(body, RANKS):
        assert reused and same_memory and values and shapes


HOLDERS = {
    "the result list": lambda rs: rs,
    "one result": lambda rs: [rs[2]],
    "a view of a result": lambda rs: [rs[0][1:]],
    "a reshaped result": lambda rs: [rs[0].reshape(-1)],
    "a NumPy array on a result's memory": lambda rs: [torch.from_numpy(rs[3].numpy())],
    "a DLPack export of a result": lambda rs: [torch.from_dlpack(rs[1])],
}


@pytest.mark.parametrize("holder", HOLDERS)
def test_what_refers_to_a_result_keeps_its_values(holder):
    keep = HOLDERS[holder]

    def body(c):
        c.batch_all_reduce(grads(c, 1))  # (a kept bucket, free)
        kept = keep(c.batch_all_reduce(grads(c, 2)))
        gc.collect()
        later = c.batch_all_reduce(grads(c, 3))
        return holds(kept, 2), holds(later, 3)

    for kept_values, later_values in collectives.run(body, RANKS):
        assert kept_values, f"{holder}: the next call overwrote it"
        assert later_values


def test_calls_in_flight_at_once_each_get_their_own_bucket():
    def body(c):
        c.batch_all_reduce(grads(c, 1))  # (a kept bucket, free)
        handles = [c.batch_all_reduce(grads(c, step), async_op=True) for step in (2, 3, 4)]
        results = [h.wait() for h in handles]
        again = c.batch_all_reduce(grads(c, 5))
        # waited last to first: the call that took the kept bucket finishes last
        handles = [c.batch_all_reduce(grads(c, step), async_op=True) for step in (6, 7)]
        late = [h.wait() for h in handles[::-1]][::-1]
        after = c.batch_all_reduce(grads(c, 8))
        return ([holds(r, step) for r, step in zip(results + late, (2, 3, 4, 6, 7))],
                holds(again, 5) and holds(after, 8))

    for in_flight, again in collectives.run(body, RANKS):
        assert in_flight == [True] * 5 and again


def test_own_copies_and_every_op_stay_right_when_buckets_are_reused():
    def body(c):
        checks = []
        for step in (1, 2, 3):
            copies = c.batch_all_reduce(grads(c, step), views=False)
            checks.append(holds(copies, step))
            for op, want in (("max", float(RANKS * step)), ("mean", total(step) / RANKS)):
                got = c.batch_all_reduce(grads(c, step), op)
                checks.append(all(bool((r == want).all()) for r in got))
        return checks

    for checks in collectives.run(body, RANKS):
        assert all(checks), checks


def test_buckets_keep_theirs_from_step_to_step():
    def body(c):
        buckets = c.buckets(grads(c, 1), bucket_bytes=1 << 20)

        def step(s):
            for k, x in enumerate(grads(c, s)):
                buckets.ready(k, x)
            return buckets.wait()

        first = step(1)
        ids = [id(r) for r in first]
        del first
        gc.collect()
        second = step(2)
        reused = [id(r) for r in second] == ids
        kept = [second[0][1:]]  # (a view of a result: the next step takes a new bucket)
        del second
        third = step(3)
        return reused, holds(kept, 2), holds(third, 3)

    for reused, kept, third in collectives.run(body, RANKS):
        assert reused and kept and third


def test_a_list_with_tensors_alone_reuses_its_fused_bucket():
    big = (512, 1024)  # 2 MiB of float32: travels alone in host memory, not in a bucket
    shapes = SHAPES[:2] + [big] + SHAPES[2:]

    def body(c):
        def step(s):
            return c.batch_all_reduce([torch.full(x, float((c.rank + 1) * s)) for x in shapes])

        first = step(1)
        fused_ids = [id(r) for i, r in enumerate(first) if i != 2]
        del first
        gc.collect()
        second = step(2)
        return ([id(r) for i, r in enumerate(second) if i != 2] == fused_ids,
                holds(second, 2), tuple(second[2].shape) == big)

    for reused, values, shape in collectives.run(body, RANKS):
        assert reused and values and shape
