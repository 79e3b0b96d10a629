"""Packing plans: TensorFlow's worked examples, and round-trip properties for every plan kind."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from collectives.algorithms.packing import (
    Pack,
    PackPlan,
    aggregate_small,
    concat_and_split,
    extract_ranges,
    fuse,
    group_by_size,
    make_plan,
    no_packing,
)

DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.float16)]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shape, dtype and bytes (NaNs and -0.0 included)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------- TensorFlow's worked examples

@pytest.mark.parametrize(("total", "num_packs", "sizes"), [
    (10, 3, [3, 3, 4]),
    (2, 3, [0, 0, 2]),
    (9, 1, [9]),
])
def test_concat_and_split_sizes(total: int, num_packs: int, sizes: list[int]) -> None:
    plan = concat_and_split([(total,)], [np.float32], num_packs)
    assert [p.size for p in plan.packs] == sizes


def test_concat_and_split_sizes_over_several_tensors() -> None:
    # Same totals as above, spread over tensors of several shapes: only the total matters.
    plan = concat_and_split([(2, 2), (), (0, 3), (5,)], [np.float32] * 4, 3)
    assert [p.size for p in plan.packs] == [3, 3, 4]


def test_concat_and_split_groups_by_dtype() -> None:
    plan = concat_and_split([(4,), (6,), (2,)], [np.float32, np.int32, np.float32], 2)
    assert [(p.dtype, p.size) for p in plan.packs] == [
        (np.float32, 3), (np.float32, 3), (np.int32, 3), (np.int32, 3)]


@pytest.mark.parametrize("num_packs", [0, -1])
def test_concat_and_split_rejects_num_packs(num_packs: int) -> None:
    with pytest.raises(ValueError, match=rf"num_packs must be greater than zero.*{num_packs}"):
        concat_and_split([(3,)], [np.float32], num_packs)


@pytest.mark.parametrize(("indices", "limit", "ranges", "singles"), [
    ([0, 1, 2, 3, 4], 1, [[0, 2], [3, 4]], []),  # the reference's off-by-two example
    ([], 32, [], []),
    ([5], 32, [], [5]),
    ([1, 3, 4, 6, 7, 8, 9], 32, [[3, 4], [6, 9]], [1]),
    ([1, 3, 4, 6, 7, 9], 32, [[3, 4], [6, 7]], [1, 9]),
    ([0, 1, 2, 3, 4, 5, 6], 0, [[0, 1], [2, 3], [4, 5]], [6]),
])
def test_extract_ranges_examples(indices: list[int], limit: int, ranges: list[list[int]],
                                 singles: list[int]) -> None:
    assert extract_ranges(indices, limit) == (ranges, singles)


def reference_chunks(indices: Sequence[int], limit: int) -> list[list[int]]:
    """Independent restatement: split into consecutive runs, cut runs into limit+2 chunks."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][-1] + 1 == i:
            runs[-1].append(i)
        else:
            runs.append([i])
    width = max(limit + 2, 1)
    return [run[k:k + width] for run in runs for k in range(0, len(run), width)]


@given(st.lists(st.integers(0, 60), unique=True).map(sorted), st.integers(-2, 6))
def test_extract_ranges_matches_chunking(indices: list[int], limit: int) -> None:
    chunks = reference_chunks(indices, limit)
    assert extract_ranges(indices, limit) == (
        [[c[0], c[-1]] for c in chunks if len(c) > 1], [c[0] for c in chunks if len(c) == 1])


def test_aggregate_small_tf_grouping() -> None:
    # 4-byte float32 tensors are small at max_bytes=4; the 400-byte one (index 5) is large.
    shapes = [(1,)] * 5 + [(100,)] + [(1,)] * 3
    plan = aggregate_small(shapes, [np.float32] * 9, max_bytes=4, max_group=1)
    # Limit 1 allows runs of 3: [0..2], [3, 4], [6..8]; then the unpacked tensor.
    assert [p.indices for p in plan.packs] == [(0, 1, 2), (3, 4), (6, 7, 8), (5,)]


def test_aggregate_small_isolated_small_not_packed() -> None:
    plan = aggregate_small([(1,), (100,), (1,)], [np.float32] * 3, max_bytes=4, max_group=10)
    assert [p.indices for p in plan.packs] == [(0,), (1,), (2,)]


def test_aggregate_small_any_dtype_and_dtype_breaks_runs() -> None:
    dtypes = [np.float64, np.float64, np.int32, np.int32, np.int32, np.float16]
    plan = aggregate_small([(1,)] * 6, dtypes, max_bytes=8, max_group=10)
    assert [p.indices for p in plan.packs] == [(0, 1), (2, 3, 4), (5,)]


@pytest.mark.parametrize(("max_bytes", "max_group"), [(0, 10), (10, 0), (-1, -1)])
def test_aggregate_small_rejects(max_bytes: int, max_group: int) -> None:
    with pytest.raises(ValueError, match=r"max_bytes.*max_group.*greater than zero"):
        aggregate_small([(1,)], [np.float32], max_bytes, max_group)


@pytest.mark.parametrize(("bytes_per_pack", "groups"), [
    # Five float32 tensors of 8 bytes each. A pack closes only once it EXCEEDS the target.
    (8, [(0, 1), (2, 3), (4,)]),
    (7, [(0,), (1,), (2,), (3,), (4,)]),
    (16, [(0, 1, 2), (3, 4)]),
    (15, [(0, 1), (2, 3), (4,)]),
    (0, [(0, 1, 2, 3, 4)]),
])
def test_group_by_size_strict_closing(bytes_per_pack: int, groups: list[tuple[int, ...]]) -> None:
    plan = group_by_size([(2,)] * 5, [np.float32] * 5, bytes_per_pack)
    assert [p.indices for p in plan.packs] == groups


def test_group_by_size_dtype_change_closes() -> None:
    plan = group_by_size([(1,)] * 4, [np.float32, np.float32, np.int32, np.float32], 0)
    assert [p.indices for p in plan.packs] == [(0, 1), (2,), (3,)]


def test_group_by_size_rejects_negative() -> None:
    with pytest.raises(ValueError, match=r"bytes_per_pack.*-1"):
        group_by_size([(1,)], [np.float32], -1)


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({}, no_packing),
    ({"num_packs": 2, "agg_small_grads_max_bytes": 8, "bytes_per_pack": 4},
     lambda s, d: concat_and_split(s, d, 2)),
    ({"agg_small_grads_max_bytes": 8, "bytes_per_pack": 4},
     lambda s, d: aggregate_small(s, d, 8, 10)),
    ({"agg_small_grads_max_bytes": 8, "agg_small_grads_max_group": 0, "bytes_per_pack": 4},
     lambda s, d: group_by_size(s, d, 4)),
    ({"agg_small_grads_max_bytes": 8, "agg_small_grads_max_group": 0}, no_packing),
    ({"bytes_per_pack": 0}, lambda s, d: group_by_size(s, d, 0)),
])
def test_make_plan_chooses_like_tf(kwargs: dict, expected: Callable[..., PackPlan]) -> None:
    shapes, dtypes = [(1,), (2,), (30,), (1,), (1,)], [np.float32] * 5
    assert make_plan(shapes, dtypes, **kwargs) == expected(shapes, dtypes)


@pytest.mark.parametrize("narrow", [np.int8, np.uint8, np.int16])
@pytest.mark.parametrize("kwargs", [
    {"num_packs": 2}, {"agg_small_grads_max_bytes": 100, "agg_small_grads_max_group": 3},
    {"agg_small_grads_max_bytes": 8, "agg_small_grads_max_group": 0, "bytes_per_pack": 40},
])
def test_make_plan_takes_narrow_numpy_integers(narrow, kwargs: dict) -> None:
    # (the plan's sums took an int8 num_packs' dtype: 1300 // int8(2) overflowed)
    shapes, dtypes = [(1000,), (300,), (7,), (5,)], [np.float32] * 4
    narrowed = {k: narrow(v) for k, v in kwargs.items()}
    assert make_plan(shapes, dtypes, **narrowed) == make_plan(shapes, dtypes, **kwargs)


def test_make_plan_rejects_negative_num_packs() -> None:
    with pytest.raises(ValueError, match=r"num_packs.*-2"):
        make_plan([(1,)], [np.float32], num_packs=-2)


# ---------------------------------------------------------------- behaviour of pack / unpack

def test_single_member_pack_is_a_view() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (buf,) = no_packing([x.shape], [x.dtype]).pack([x])
    assert np.shares_memory(buf, x)
    (fresh,) = no_packing([x.shape], [x.dtype]).pack([x], copy=True)
    assert not np.shares_memory(fresh, x) and fresh.flags.writeable


def test_non_contiguous_input() -> None:
    x = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]
    plan = concat_and_split([x.shape], [x.dtype], 2)
    assert same_bits(plan.unpack(plan.pack([x]))[0], x)


def test_unpack_takes_buffer_dtype() -> None:
    # Integer MEAN yields float64 buffers; the results follow the buffers' dtype.
    xs = [np.arange(3, dtype=np.int32), np.arange(4, dtype=np.int32).reshape(2, 2)]
    for plan in (no_packing([x.shape for x in xs], [x.dtype for x in xs]),
                 concat_and_split([x.shape for x in xs], [x.dtype for x in xs], 3)):
        bufs = [b / 2 for b in plan.pack(xs)]
        out = plan.unpack(bufs)
        for x, y in zip(xs, out, strict=True):
            assert y.dtype == np.float64 and y.shape == x.shape
            np.testing.assert_array_equal(y, x / 2)


def test_pack_checks_inputs() -> None:
    plan = no_packing([(2,)], [np.float32])
    with pytest.raises(ValueError, match=r"1 tensors, got 2"):
        plan.pack([np.zeros(2, np.float32)] * 2)
    with pytest.raises(ValueError, match=r"tensor 0 has shape \(3,\)"):
        plan.pack([np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match=r"dtype float64.*float32"):
        plan.pack([np.zeros(2, np.float64)])


def test_unpack_checks_buffers() -> None:
    plan = concat_and_split([(5,)], [np.float32], 2)
    with pytest.raises(ValueError, match=r"2 packs, got 1"):
        plan.unpack([np.zeros(5, np.float32)])
    with pytest.raises(ValueError, match=r"buffer 1 has 2 elements; pack 1 has 3"):
        plan.unpack([np.zeros(2, np.float32), np.zeros(2, np.float32)])


def test_plan_rejects_incomplete_cover() -> None:
    f32 = np.dtype(np.float32)
    with pytest.raises(ValueError, match=r"tensor 1"):
        PackPlan(((2,), (2,)), (f32, f32), (Pack((0,), f32, ((0, 2),)),))
    with pytest.raises(ValueError, match=r"tensor 0"):
        PackPlan(((3,),), (f32,), (Pack((0, 0), f32, ((0, 2), (1, 3))),))
    with pytest.raises(ValueError, match=r"cannot hold tensor 0"):
        PackPlan(((3,),), (f32,), (Pack((0,), np.dtype(np.int32), ((0, 3),)),))


def test_empty_list() -> None:
    for plan in (no_packing([], []), concat_and_split([], [], 2), aggregate_small([], [], 4, 2),
                 group_by_size([], [], 0)):
        assert plan.packs == () and plan.pack([]) == [] and plan.unpack([]) == []


# ---------------------------------------------------------------- properties

shapes_st = st.lists(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
                     max_size=8)


@st.composite
def tensor_lists(draw: st.DrawFn) -> list[np.ndarray]:
    shapes = draw(shapes_st)
    return [draw(hnp.arrays(draw(st.sampled_from(DTYPES)), shape)) for shape in shapes]


plan_makers = st.one_of(
    st.just(("none", lambda s, d: no_packing(s, d))),
    st.integers(1, 5).map(lambda n: ("concat", lambda s, d: concat_and_split(s, d, n))),
    st.tuples(st.integers(1, 64), st.integers(1, 4)).map(
        lambda a: ("small", lambda s, d: aggregate_small(s, d, *a))),
    st.integers(0, 64).map(lambda b: ("size", lambda s, d: group_by_size(s, d, b))),
)


@settings(max_examples=200, deadline=None)
@given(tensor_lists(), plan_makers, st.booleans())
def test_round_trip_every_plan(xs: list[np.ndarray], maker: tuple[str, Callable[..., PackPlan]],
                               copy: bool) -> None:
    kind, make = maker
    shapes, dtypes = [x.shape for x in xs], [x.dtype for x in xs]
    plan = make(shapes, dtypes)
    assert plan == make(list(shapes), list(dtypes))  # depends only on shapes and dtypes
    before = [x.copy() for x in xs]
    buffers = plan.pack(xs, copy=copy)
    assert len(buffers) == len(plan.packs)
    for buf, pack in zip(buffers, plan.packs, strict=True):
        assert buf.ndim == 1 and buf.dtype == pack.dtype and buf.size == pack.size
        assert buf.flags.c_contiguous
        assert all(dtypes[i] == pack.dtype for i in pack.indices)
    out = plan.unpack(buffers)
    assert len(out) == len(xs)
    assert all(same_bits(y, x) for x, y in zip(xs, out, strict=True))
    assert all(same_bits(x, b) for x, b in zip(xs, before, strict=True))

    members = [i for pack in plan.packs for i in pack.indices]
    if kind == "concat":
        # Per dtype: the packs hold every element, cut as total // num_packs + remainder.
        for dt in set(dtypes):
            total = sum(prod(s) for s, d in zip(shapes, dtypes, strict=True) if d == dt)
            sizes = [p.size for p in plan.packs if p.dtype == dt]
            split = total // len(sizes)
            assert sizes == [split] * (len(sizes) - 1) + [total - split * (len(sizes) - 1)]
        assert set(members) == set(range(len(xs)))
    else:
        assert sorted(members) == list(range(len(xs)))
        assert all(span == (0, prod(shapes[i]))
                   for pack in plan.packs for i, span in zip(pack.indices, pack.spans,
                                                            strict=True))
    if kind == "size":
        for pack in plan.packs:
            assert list(pack.indices) == list(range(pack.indices[0], pack.indices[-1] + 1))
        assert members == list(range(len(xs)))  # order preserved


@given(st.lists(st.tuples(st.integers(0, 6), st.sampled_from(DTYPES)), max_size=20),
       st.integers(1, 24), st.integers(1, 3))
def test_aggregate_small_matches_chunking(tensors: list[tuple[int, np.dtype]], max_bytes: int,
                                          max_group: int) -> None:
    shapes = [(n,) for n, _ in tensors]
    dtypes = [d for _, d in tensors]
    plan = aggregate_small(shapes, dtypes, max_bytes, max_group)
    small = [i for i, (n, d) in enumerate(tensors) if n * d.itemsize <= max_bytes]
    # Runs never cross a dtype change: shift indices apart at each change, then chunk.
    gap = [0]
    for i in range(1, len(tensors)):
        gap.append(gap[-1] + (dtypes[i] != dtypes[i - 1]))
    chunks = reference_chunks([i + gap[i] for i in small], max_group)
    back = {i + gap[i]: i for i in range(len(tensors))}
    packed = [tuple(back[j] for j in c) for c in chunks if len(c) > 1]
    alone = sorted(set(range(len(tensors))) - {i for c in packed for i in c})
    assert [p.indices for p in plan.packs] == packed + [(i,) for i in alone]


@given(st.lists(st.tuples(st.integers(0, 6), st.sampled_from(DTYPES)), max_size=20),
       st.integers(1, 40))
def test_group_by_size_closing_rule(tensors: list[tuple[int, np.dtype]],
                                    bytes_per_pack: int) -> None:
    shapes = [(n,) for n, _ in tensors]
    dtypes = [d for _, d in tensors]
    plan = group_by_size(shapes, dtypes, bytes_per_pack)
    nbytes = [n * d.itemsize for n, d in tensors]
    for k, pack in enumerate(plan.packs):
        # Still open before its last member: not over the target, one dtype.
        assert sum(nbytes[i] for i in pack.indices[:-1]) <= bytes_per_pack
        if k + 1 < len(plan.packs):
            nxt = plan.packs[k + 1].indices[0]
            closed_by_size = sum(nbytes[i] for i in pack.indices) > bytes_per_pack
            assert closed_by_size or dtypes[nxt] != pack.dtype


# ---------------------------------------------------------------- fusion buckets (the default)

@settings(max_examples=80, deadline=None)
@given(tensors=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(DTYPES)), max_size=25),
       bucket_bytes=st.integers(1, 120))
def test_fuse_buckets(tensors: list[tuple[int, np.dtype]], bucket_bytes: int) -> None:
    """One dtype per bucket; a bucket's members in input order and within ``bucket_bytes``;
    a tensor of ``bucket_bytes`` or more alone; buckets in order of their first tensor; a
    bucket closes only when its next tensor of that dtype would overflow it."""
    shapes = [(size,) for size, _ in tensors]
    dtypes = [dt for _, dt in tensors]
    plan = fuse(shapes, dtypes, bucket_bytes)  # (PackPlan checks that it covers every tensor)
    nbytes = [size * dt.itemsize for size, dt in tensors]
    firsts = [pack.indices[0] for pack in plan.packs]
    assert firsts == sorted(firsts)
    for k, pack in enumerate(plan.packs):
        assert all(dtypes[i] == pack.dtype for i in pack.indices)
        assert list(pack.indices) == sorted(pack.indices)
        if len(pack.indices) > 1:
            assert sum(nbytes[i] for i in pack.indices) <= bucket_bytes
        if any(nbytes[i] >= bucket_bytes for i in pack.indices):
            assert len(pack.indices) == 1
        later = [p for p in plan.packs[k + 1:] if p.dtype == pack.dtype and len(p.indices) > 1
                 or p.dtype == pack.dtype and nbytes[p.indices[0]] < bucket_bytes]
        if later and all(nbytes[i] < bucket_bytes for i in pack.indices):
            # the next bucket of this dtype opened because its first tensor did not fit
            nxt = later[0].indices[0]
            assert sum(nbytes[i] for i in pack.indices) + nbytes[nxt] > bucket_bytes


def test_fuse_examples() -> None:
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    plan = fuse([(2,), (3,), (100,), (1,), (2,), (1,)], [f32, f64, f32, f32, f64, f64], 32)
    # f64 tensor 4 (16 bytes) overflows tensor 1's bucket (24): a new one, which 5 joins
    assert [p.indices for p in plan.packs] == [(0, 3), (1,), (2,), (4, 5)]
    assert fuse([(2,)] * 3, [f32] * 3, 0).packs == no_packing([(2,)] * 3, [f32] * 3).packs
    with pytest.raises(ValueError, match="bucket_bytes"):
        fuse([(2,)], [f32], -1)


def test_make_plan_fuses_only_without_tensorflow_knobs() -> None:
    shapes, dtypes = [(4,)] * 4, [np.float32] * 4
    assert len(make_plan(shapes, dtypes, bucket_bytes=1 << 20).packs) == 1
    assert len(make_plan(shapes, dtypes).packs) == 4  # (the plan alone: no bucket given)
    assert len(make_plan(shapes, dtypes, num_packs=2, bucket_bytes=1 << 20).packs) == 2
    assert len(make_plan(shapes, dtypes, bytes_per_pack=16, bucket_bytes=1 << 20).packs) == 2


def test_fuse_sends_tensors_of_alone_bytes_alone() -> None:
    f32 = np.dtype(np.float32)
    plan = fuse([(2,), (64,), (3,), (16,)], [f32] * 4, 1 << 20, alone_bytes=64)
    # 256 and 64 bytes: alone (no copy); 8 and 12: one bucket
    assert [p.indices for p in plan.packs] == [(0, 2), (1,), (3,)]
    assert fuse([(64,)] * 2, [f32] * 2, 100, alone_bytes=1 << 20).packs == \
        fuse([(64,)] * 2, [f32] * 2, 100).packs  # (never above the bucket size)
