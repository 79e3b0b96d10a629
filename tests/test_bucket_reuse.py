"""Fused buckets kept from one batched call to the next (``collectives/algorithms/reuse.py``),
on NumPy arrays and PyTorch tensors (CPU) over thread ranks: a call whose last results nobody
refers to any more packs into the same bucket and hands back the same view objects, with fresh
values; anything that still refers to a result (the result, a view or export of it, a handle
in flight) keeps its values through the next call. CuPy's side runs in tests/gpu."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

import collectives

SHAPES = [(3, 4), (5,), (2, 2, 2), (7,)]  # one fused bucket of four tensors
RANKS = 2


class Library:
    """The arrays a test makes: NumPy's, or PyTorch's (skipped where it is not installed)."""

    def __init__(self, name: str):
        self.name = name
        self.torch: Any = pytest.importorskip("torch") if name == "torch" else None

    def full(self, shape: tuple, value: float) -> Any:
        if self.torch is not None:
            return self.torch.full(shape, value)
        return np.full(shape, value, np.float32)

    def address(self, x: Any) -> int:
        return x.data_ptr() if self.torch is not None else x.__array_interface__["data"][0]


@pytest.fixture(params=["numpy", "torch"])
def lib(request) -> Library:
    return Library(request.param)


def grads(lib: Library, c, step: int) -> list:
    return [lib.full(s, float((c.rank + 1) * step)) for s in SHAPES]


def total(step: int) -> float:
    return float(sum((r + 1) * step for r in range(RANKS)))


def holds(results: list, step: int) -> bool:
    return all(bool((np.asarray(r) == total(step)).all()) for r in results)


def test_a_call_whose_results_are_gone_reuses_bucket_and_views(lib):
    def body(c):
        first = c.batch_all_reduce(grads(lib, c, 1))
        ids, address = [id(r) for r in first], lib.address(first[0])
        del first
        gc.collect()
        second = c.batch_all_reduce(grads(lib, c, 2))
        return ([id(r) for r in second] == ids, lib.address(second[0]) == address,
                holds(second, 2), [tuple(r.shape) for r in second] == SHAPES)

    for reused, same_memory, values, shapes in collectives.run(body, RANKS):
        assert reused and same_memory and values and shapes


CHANGES = {  # what a caller may do to a result in place before it drops it, by library
    "its shape set": ("numpy", lambda lib, r: setattr(r, "shape", (-1,))),
    "made read-only": ("numpy", lambda lib, r: setattr(r.flags, "writeable", False)),
    "resized": ("torch", lambda lib, r: r.resize_(2, 6)),
    "made to require grad": ("torch", lambda lib, r: r.requires_grad_(True)),
    "as_strided_": ("torch", lambda lib, r: r.as_strided_((4, 3), (1, 4))),
}


@pytest.mark.parametrize("kind", ["batch", "buckets", "multi-device"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_result_changed_in_place_then_dropped_is_not_handed_back(kind, change):
    """Kept views were handed back as they were left: a (3, 4) result whose shape was set to
    (12,) came back (12,), a read-only one read-only, and a tensor made to require grad
    failed the next call's packing on that rank (and broke the communicator)."""
    library, alter = CHANGES[change]
    lib = Library(library)

    def step(c, k: int) -> list:
        xs = grads(lib, c, k)
        if kind == "batch":
            return c.batch_all_reduce(xs)
        buckets = c.buckets(xs)
        for i, x in enumerate(xs):
            buckets.ready(i, x)
        return buckets.wait()

    def body(c):
        first = step(c, 1)
        alter(lib, first[0])
        del first
        gc.collect()
        second = step(c, 2)
        return ([tuple(r.shape) for r in second], holds(second, 2),
                all(getattr(r, "flags", None) is None or r.flags.writeable for r in second),
                not any(getattr(r, "requires_grad", False) for r in second))

    if kind == "multi-device":  # (a list per tensor, of one value per device)
        def lists(k: int) -> list:
            per_device = [grads(lib, type("Device", (), {"rank": d}), k) for d in range(RANKS)]
            return [list(values) for values in zip(*per_device)]

        first = collectives.batch_all_reduce(lists(1))
        alter(lib, first[0][0])
        del first
        gc.collect()
        second = list(zip(*collectives.batch_all_reduce(lists(2))))  # (per device)
        outcomes = [([tuple(r.shape) for r in row], holds(list(row), 2),
                     all(getattr(r, "flags", None) is None or r.flags.writeable for r in row),
                     not any(getattr(r, "requires_grad", False) for r in row))
                    for row in second]
    else:
        outcomes = collectives.run(body, RANKS)
    for shapes, values, writable, no_grad in outcomes:
        assert shapes == SHAPES and values and writable and no_grad


HOLDERS = {  # what may refer to a result, by library
    "the result list": ("numpy", "torch", lambda lib, rs: rs),
    "one result": ("numpy", "torch", lambda lib, rs: [rs[2]]),
    "a view of a result": ("numpy", "torch", lambda lib, rs: [rs[0][1:]]),
    "a reshaped result": ("numpy", "torch", lambda lib, rs: [rs[0].reshape(-1)]),
    "a memoryview of a result": ("numpy", lambda lib, rs: [memoryview(rs[3])]),
    "a DLPack export of a result (NumPy)": ("numpy", lambda lib, rs: [np.from_dlpack(rs[1])]),
    "a NumPy array on a result's memory": (
        "torch", lambda lib, rs: [lib.torch.from_numpy(rs[3].numpy())]),
    "a DLPack export of a result": ("torch", lambda lib, rs: [lib.torch.from_dlpack(rs[1])]),
}
CASES = [(name, holder) for holder, (*names, _) in HOLDERS.items() for name in names]


def test_a_results_storage_held_alone_keeps_its_values():
    """PyTorch counts a storage's Python object once among the storage's uses, however many
    hold it: a result's ``untyped_storage()`` kept alone went unseen, and the next call packed
    into its memory."""
    torch = pytest.importorskip("torch")

    def body(c):
        c.batch_all_reduce([torch.full((40,), 1.0), torch.ones(5)])  # (a kept bucket, free)
        result = c.batch_all_reduce([torch.full((40,), 2.0), torch.ones(5)])[0]
        storage = result.untyped_storage()
        del result
        gc.collect()
        c.batch_all_reduce([torch.full((40,), 3.0), torch.ones(5)])
        return torch.empty(0).set_(storage)[:40].tolist()

    for values in collectives.run(body, RANKS):
        assert values == [2.0 * RANKS] * 40, "the next call overwrote it"


@pytest.mark.parametrize(("library", "holder"), CASES)
def test_what_refers_to_a_result_keeps_its_values(library, holder):
    lib, keep = Library(library), HOLDERS[holder][-1]

    def body(c):
        c.batch_all_reduce(grads(lib, c, 1))  # (a kept bucket, free)
        kept = keep(lib, c.batch_all_reduce(grads(lib, c, 2)))
        gc.collect()
        later = c.batch_all_reduce(grads(lib, c, 3))
        return holds(kept, 2), holds(later, 3)

    for kept_values, later_values in collectives.run(body, RANKS):
        assert kept_values, f"{holder}: the next call overwrote it"
        assert later_values


def test_calls_in_flight_at_once_each_get_their_own_bucket(lib):
    def body(c):
        c.batch_all_reduce(grads(lib, c, 1))  # (a kept bucket, free)
        handles = [c.batch_all_reduce(grads(lib, c, step), async_op=True) for step in (2, 3, 4)]
        results = [h.wait() for h in handles]
        again = c.batch_all_reduce(grads(lib, c, 5))
        # waited last to first: the call that took the kept bucket finishes last
        handles = [c.batch_all_reduce(grads(lib, c, step), async_op=True) for step in (6, 7)]
        late = [h.wait() for h in handles[::-1]][::-1]
        after = c.batch_all_reduce(grads(lib, c, 8))
        return ([holds(r, step) for r, step in zip(results + late, (2, 3, 4, 6, 7))],
                holds(again, 5) and holds(after, 8))

    for in_flight, again in collectives.run(body, RANKS):
        assert in_flight == [True] * 5 and again


def test_own_copies_and_every_op_stay_right_when_buckets_are_reused(lib):
    def body(c):
        checks = []
        for step in (1, 2, 3):
            copies = c.batch_all_reduce(grads(lib, c, step), views=False)
            checks.append(holds(copies, step))
            for op, want in (("max", float(RANKS * step)), ("mean", total(step) / RANKS)):
                got = c.batch_all_reduce(grads(lib, c, step), op)
                checks.append(all(bool((r == want).all()) for r in got))
        return checks

    for checks in collectives.run(body, RANKS):
        assert all(checks), checks


def test_buckets_keep_theirs_from_step_to_step(lib):
    def body(c):
        buckets = c.buckets(grads(lib, c, 1), bucket_bytes=1 << 20)

        def step(s):
            for k, x in enumerate(grads(lib, c, s)):
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


@pytest.mark.parametrize("kind", ["buckets", "batch"])
def test_a_loop_that_holds_a_steps_results_into_the_next_alternates_two_buckets(lib, kind):
    # (``averaged = buckets.wait()`` holds a step's results while the next step packs: with
    # one bucket kept, every step made new ones; the step before's is free by then)
    def body(c):
        buckets = c.buckets(grads(lib, c, 1), bucket_bytes=1 << 20)

        def step(s):
            if kind == "batch":
                return c.batch_all_reduce(grads(lib, c, s))
            for k, x in enumerate(grads(lib, c, s)):
                buckets.ready(k, x)
            return buckets.wait()

        handed, right = [], True
        averaged = None
        for s in range(1, 7):
            averaged = step(s)  # (the last step's results live until this returns)
            handed.append(weakref.ref(averaged[0]))
            right = right and holds(averaged, s)
        # step 6 handed back step 4's view objects, and steps 3 to 6 took turns in two
        # buckets (the keeper holds their views: alive)
        return right, handed[3]() is averaged[0], all(h() is not None for h in handed[2:])

    for right, same, alive in collectives.run(body, RANKS):
        assert right and same and alive


def test_a_list_with_tensors_alone_reuses_its_fused_bucket(lib):
    big = (512, 1024)  # 2 MiB of float32: travels alone in host memory, not in a bucket
    shapes = SHAPES[:2] + [big] + SHAPES[2:]

    def body(c):
        def step(s):
            return c.batch_all_reduce([lib.full(x, float((c.rank + 1) * s)) for x in shapes])

        first = step(1)
        fused_ids = [id(r) for i, r in enumerate(first) if i != 2]
        del first
        gc.collect()
        second = step(2)
        return ([id(r) for i, r in enumerate(second) if i != 2] == fused_ids,
                holds(second, 2), tuple(second[2].shape) == big)

    for reused, values, shape in collectives.run(body, RANKS):
        assert reused and values and shape


def test_buckets_taken_by_failed_steps_do_not_keep_the_next_from_being_reused():
    # (a step that failed never gave its bucket back: after two, both kept buckets stayed
    # taken, and each fresh bucket was let go as soon as it was kept, so no step reused one)
    from collectives.algorithms.reuse import BucketKeeper
    from collectives.arrays import NUMPY

    keeper, plan = BucketKeeper(NUMPY), object()

    def fresh():  # (a call's fresh bucket and views, kept for the next call)
        bucket = NUMPY.result((8,), np.float32)
        keeper.keep(plan, 0, 0, bucket, [bucket[:4], bucket[4:]])

    fresh()
    fresh()
    assert keeper.bucket(plan, 0, 0) is not None  # a failed step takes one ...
    assert keeper.bucket(plan, 0, 0) is not None  # ... and another: never given back
    assert keeper.bucket(plan, 0, 0) is None      # (both taken: the next step packs anew)
    fresh()                                       # ... and keeps its bucket
    gc.collect()
    assert keeper.bucket(plan, 0, 0) is not None  # the step after reuses it
