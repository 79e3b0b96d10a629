"""All-reduce specs: TensorFlow's forms and worked examples, and the stricter checks."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import collectives
from collectives.algorithms.spec import (
    SpecRange,
    assign_ranges,
    group_device_names,
    parse_general_int,
    parse_spec,
)

# TensorFlow's own namedtuple; a namedtuple is a tuple, so it must be accepted.
AllReduceSpecTuple = namedtuple("AllReduceSpecTuple", "alg shards limit")

TF_NAMES = ["nccl", "nccl/xring", "nccl/rechd", "nccl/pscpu", "xring", "pscpu", "psgpu",
            "pscpu/pscpu", "collective"]
OUR_NAMES = ["auto", "ring", "rechd", "tree", "shuffle", "one_device", "ring/tree"]
SUFFIX = {"": 1, "K": 1024, "k": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def test_tf_worked_example() -> None:
    assert parse_spec("pscpu:2k:pscpu#2:64k:xring") == [
        ("pscpu", 1, 2048), ("pscpu", 2, 65536), ("xring", 1, -1)]


def test_result_is_spec_ranges() -> None:
    ranges = parse_spec("pscpu:2k:pscpu#2:64k:xring")
    assert all(isinstance(r, SpecRange) for r in ranges)
    assert ranges[1].algorithm == "pscpu" and ranges[1].shards == 2 and ranges[1].limit == 65536


@pytest.mark.parametrize("name", TF_NAMES + OUR_NAMES)
def test_plain_name_keeps_user_text(name: str) -> None:
    assert parse_spec(name) == [SpecRange(name, 1, -1)]


@pytest.mark.parametrize(("spec", "expected"), [
    (("pscpu/pscpu",), [("pscpu/pscpu", 1, -1)]),
    (("pscpu/pscpu", 2), [("pscpu/pscpu", 2, -1)]),
    (("pscpu/pscpu", 2, -1), [("pscpu/pscpu", 2, -1)]),
    (AllReduceSpecTuple("nccl/xring", 3, -1), [("nccl/xring", 3, -1)]),
    ([("pscpu", 1, 2048), ("pscpu", 2, 65536), ("xring",)],
     [("pscpu", 1, 2048), ("pscpu", 2, 65536), ("xring", 1, -1)]),
    ([AllReduceSpecTuple("nccl", 1, 10), SpecRange("ring", 4, -1)],
     [("nccl", 1, 10), ("ring", 4, -1)]),
    ("xring#4", [("xring", 4, -1)]),
])
def test_tuple_and_list_forms(spec: object, expected: list[tuple]) -> None:
    assert parse_spec(spec) == expected


def test_parse_is_idempotent() -> None:
    ranges = parse_spec("pscpu:2k:pscpu#2:64k:xring")
    assert parse_spec(ranges) == ranges


@pytest.mark.parametrize(("text", "value"), [
    ("17", 17), ("2k", 2048), ("64K", 65536), ("3M", 3 * 1024**2), ("1G", 1024**3),
    ("2T", 2 * 1024**4), ("-1", -1), ("0", 0),
])
def test_parse_general_int(text: str, value: int) -> None:
    assert parse_general_int(text) == value


@pytest.mark.parametrize("text", ["2m", "2g", "2kb", "k", "", "1.5k"])
def test_parse_general_int_rejects(text: str) -> None:
    # Lower-case m/g/t are not suffixes in TensorFlow's rule: they fall through to int().
    with pytest.raises(ValueError):
        parse_general_int(text)


@pytest.mark.parametrize(("spec", "match"), [
    ("pscpu:2k", r"not well formed.*'2k'"),
    ("xring#a", r"non-integer shards 'a'"),
    ("xring#1.5", r"non-integer shards '1.5'"),
    ("xring#0", r"'xring#0'.*shards=0 must be 1 or more"),
    ("xring#-2", r"'xring#-2'.*shards=-2"),
    ("xring#2#3", r"'xring#2#3' has more than one '#'"),
    ("pscpu:2x:xring", r"non-integer range '2x'"),
    ("pscpu:2m:xring", r"non-integer range '2m'"),
    ("foo:2k:xring", r"'foo'.*unknown algorithm 'foo'"),
    ("pscpu:2k:bogus", r"'bogus'.*unknown algorithm 'bogus'"),
    ("pscpu:0:xring", r"'pscpu:0'.*positive limit"),
    ("pscpu:-5:xring", r"'pscpu:-5'.*positive limit"),
    ("pscpu:4k:ring:2k:xring", r"'ring:2k'.*not greater than.*4096"),
    ("pscpu:4k:ring:4k:xring", r"'ring:4k'.*strictly increase"),
    ("", r"''.*malformed"),
    ("nosuch", r"unknown algorithm 'nosuch'"),
    ((), r"empty tuple"),
    ([], r"empty list"),
    (("ring", 2, 5), r"\('ring', 2, 5\).*last range must have limit -1"),
    (("ring", 0), r"\('ring', 0\).*shards=0"),
    (("ring", "2"), r"\('ring', '2'\).*shards must be a whole number"),
    (("ring", 2.0), r"\('ring', 2.0\).*shards must be a whole number"),
    (("ring", True), r"shards must be a whole number, not True"),
    (("ring", 1, "2k"), r"limit must be a whole number, not '2k'"),
    (("ring", 1, 2, 3), r"\('ring', 1, 2, 3\) has 4 elements"),
    (("nope", 1), r"\('nope', 1\).*unknown algorithm 'nope'"),
    ([("ring", 1, 5), "xring"], r"tuple .* is expected, not 'xring'"),
    ([("ring", 1, -1), ("xring", 1, -1)], r"\('ring', 1, -1\).*positive limit"),
    ([("ring", 1, 10), ("xring", 1, 10), ("tree",)], r"\('xring', 1, 10\).*not greater"),
])
def test_value_errors_name_the_bad_part(spec: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_spec(spec)


@pytest.mark.parametrize("spec", [{}, {"alg": "ring"}, 3, None, 2.5, b"ring"])
def test_other_types_are_type_errors(spec: object) -> None:
    with pytest.raises(TypeError, match=r"all_reduce_spec must be .*tuple.*list"):
        parse_spec(spec)


def test_non_string_algorithm_in_tuple() -> None:
    with pytest.raises(TypeError, match=r"all_reduce_spec tuple \(3,\).*must be a string"):
        parse_spec((3,))


def test_assign_ranges_worked_example() -> None:
    ranges = parse_spec("pscpu:2k:pscpu#2:64k:xring")
    sizes = [1, 2048, 2049, 65536, 65537, 0, 10**9]
    # The limit counts elements and is inclusive (size <= limit).
    assert assign_ranges(sizes, ranges) == [[0, 1, 5], [2, 3], [4, 6]]


def test_assign_ranges_without_unlimited_range() -> None:
    with pytest.raises(ValueError, match=r"tensor 1 has 11 elements"):
        assign_ranges([3, 11], [SpecRange("ring", 1, 10)])


def test_group_device_names_examples() -> None:
    assert group_device_names(["a", "b", "c"], 2) == [["a", "c"], ["b", "a"]]
    assert group_device_names(["a", "b", "c", "d"], 2) == [["a", "c"], ["b", "d"]]
    assert group_device_names(["a", "b", "c"], 1) == [["a"], ["b"], ["c"]]
    assert group_device_names(["a", "b", "c"], 3) == [["a", "b", "c"]]


@pytest.mark.parametrize(("group_size", "match"), [
    (4, r"only 3 devices, but group_size=4"),
    (0, r"group_size=0 must be 1 or more"),
])
def test_group_device_names_errors(group_size: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        group_device_names(["a", "b", "c"], group_size)


@given(st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=12),
       st.integers(1, 12))
def test_group_device_names_properties(devices: list[str], group_size: int) -> None:
    if group_size > len(devices):
        with pytest.raises(ValueError):
            group_device_names(devices, group_size)
        return
    groups = group_device_names(devices, group_size)
    assert len(groups) == -(-len(devices) // group_size)
    assert all(len(g) == group_size for g in groups)
    # Every device is used, the first n slots in round-robin order are the devices in order.
    slots = [groups[i % len(groups)][i // len(groups)] for i in range(len(devices))]
    assert slots == devices


@st.composite
def grammar_specs(draw: st.DrawFn) -> tuple[str, list[SpecRange]]:
    count = draw(st.integers(1, 4))
    limits = draw(st.lists(st.tuples(st.integers(1, 3000), st.sampled_from(list(SUFFIX))),
                           min_size=count - 1, max_size=count - 1,
                           unique_by=lambda t: t[0] * SUFFIX[t[1]]))
    limits.sort(key=lambda t: t[0] * SUFFIX[t[1]])
    parts, expected = [], []
    for k in range(count):
        alg = draw(st.sampled_from(TF_NAMES + OUR_NAMES))
        shards = draw(st.none() | st.integers(1, 16))
        parts.append(alg if shards is None else f"{alg}#{shards}")
        if k < count - 1:
            digits, suffix = limits[k]
            parts.append(f"{digits}{suffix}")
            limit = digits * SUFFIX[suffix]
        else:
            limit = -1
        expected.append(SpecRange(alg, shards or 1, limit))
    return ":".join(parts), expected


@given(grammar_specs())
def test_grammar_round_trip(case: tuple[str, list[SpecRange]]) -> None:
    text, expected = case
    assert parse_spec(text) == expected


@st.composite
def sizes_and_ranges(draw: st.DrawFn) -> tuple[list[int], list[SpecRange]]:
    limits = sorted(draw(st.sets(st.integers(1, 100), max_size=4)))
    ranges = [SpecRange("ring", 1, lim) for lim in limits] + [SpecRange("tree", 2, -1)]
    sizes = draw(st.lists(st.integers(0, 150), max_size=30))
    return sizes, ranges


@given(sizes_and_ranges())
def test_assign_ranges_partitions_and_respects_limits(
        case: tuple[list[int], list[SpecRange]]) -> None:
    sizes, ranges = case
    parse_spec(list(ranges))  # the generated ranges are valid specs
    assigned = assign_ranges(sizes, ranges)
    assert len(assigned) == len(ranges)
    assert sorted(i for part in assigned for i in part) == list(range(len(sizes)))
    for slot, part in enumerate(assigned):
        assert part == sorted(part)
        for i in part:
            limit = ranges[slot].limit
            assert limit == -1 or sizes[i] <= limit
            # The first matching range wins: no earlier range would have taken it.
            assert all(sizes[i] > r.limit for r in ranges[:slot])


# --- a valid argument's cached plan lets no equal but invalid one through ----------------------
# (the plan caches were keyed by value: 2.0 == 2 and True == 1, so after one call with 2, a
# call with 2.0 skipped the checks that refuse it; whether a rank raised depended on the
# calls before it, and on thread ranks on which rank ran first)


@pytest.mark.parametrize("knob, good, bad", [("num_packs", 2, 2.0), ("num_packs", 1, True),
                                             ("agg_small_grads_max_bytes", 64, 64.0),
                                             ("bytes_per_pack", 16, 16.0)])
def test_packing_knobs_are_checked_after_an_equal_valid_one(knob, good, bad) -> None:
    import numpy as np

    import collectives

    lists = [[np.ones(5)] * 2, [np.ones(7)] * 2]  # (two tensors, each on two devices)
    collectives.batch_all_reduce(lists, "sum", "pscpu", **{knob: good})
    with pytest.raises(TypeError, match=f"{knob}={bad!r} must be a whole number"):
        collectives.batch_all_reduce(lists, "sum", "pscpu", **{knob: bad})


@pytest.mark.parametrize("good, bad", [(("ring", 2), ("ring", 2.0)), (("ring", 1), ("ring", True)),
                                       (("ring", 1, -1), ("ring", 1, -1.0))])
def test_spec_tuples_are_checked_after_an_equal_valid_one(good, bad) -> None:
    import numpy as np

    import collectives

    values = [np.ones(6), np.ones(6)]
    collectives.all_reduce(values, "sum", good)
    with pytest.raises(ValueError, match="must be a whole number"):
        collectives.all_reduce(values, "sum", bad)

    def body(comm):
        comm.all_reduce(np.ones(6), "sum", good)
        try:
            comm.all_reduce(np.ones(6), "sum", bad)
        except ValueError as exc:
            return "whole number" in str(exc)
        return False

    assert collectives.run(body, 2) == [True, True]


@pytest.mark.parametrize("spec", ["native", "mpi:2k:xring", ("shm", 1), [("xring", 1, 64), ("native", 1)]])
def test_a_transports_own_collective_in_a_spec_is_named_as_such(spec) -> None:
    # (a batch, buckets or any spec of more than a name said "unknown algorithm 'native'",
    # where a single call's plain name said which transport runs it)
    with pytest.raises(ValueError, match="names a transport's own collective.*has none"):
        parse_spec(spec)
    assert parse_spec(spec, extra_names=("native", "mpi", "shm"))

    import numpy as np

    import collectives

    def body(comm):
        with pytest.raises(ValueError, match="names a transport's own collective"):
            comm.batch_all_reduce([np.ones(3)], "sum", spec)
        return comm.all_reduce(np.ones(2)).tolist()

    assert collectives.run(body, 2) == [[2.0, 2.0]] * 2


@pytest.mark.parametrize("spec, shards", [("pscpu:2k:xring", 2), (("xring",), 2), ("xring#2", 2),
                                          ("xring#1", 3), ("xring#2", 3), ("xring", 3),
                                          ("pscpu#1", 0), ("pscpu", 0)])
def test_single_calls_and_batches_read_a_spec_and_shards_alike(spec, shards) -> None:
    # (a batch refused shards= beside any spec, even one that sets no count of its own,
    # where a single call took it)
    import numpy as np

    import collectives
    from collectives.algorithms.batch import plan_batch
    from collectives.runtime.calls import resolve_algorithm

    def single():
        name, count = resolve_algorithm(spec, 3000, shards)
        return collectives.algorithms.canonical(name), count

    def batch():
        part, = plan_batch([(3000,)], [np.float32], spec, shards=shards)
        return collectives.algorithms.canonical(part.spec.algorithm), part.spec.shards

    outcomes = []
    for read in (single, batch):
        try:
            outcomes.append(read())
        except ValueError as exc:
            outcomes.append("conflicts" if "conflicts with" in str(exc) else str(exc))
    assert outcomes[0] == outcomes[1], outcomes
    values = [np.arange(6, dtype=np.float32) + d for d in range(4)]
    if outcomes[0] != "conflicts":  # (and both run it)
        want = sum(values)
        assert np.array_equal(collectives.all_reduce(values, "sum", spec, shards=shards)[0], want)
        assert np.array_equal(
            collectives.batch_all_reduce([values], "sum", spec, shards=shards)[0][0], want)


def test_groups_are_checked_after_an_equal_valid_one() -> None:
    # (keyed by the partition's value, ((0, 1), (2, 3.0)) met the cached ((0, 1), (2, 3)))
    import numpy as np

    import collectives

    good, bad = ((0, 1), (2, 3)), ((0, 1), (2, 3.0))
    values = [np.ones(6) for _ in range(4)]
    collectives.all_reduce(values, "sum", "ring/ring", groups=good)
    with pytest.raises(TypeError, match="groups"):
        collectives.all_reduce(values, "sum", "ring/ring", groups=bad)

    def body(comm):
        comm.all_reduce(np.ones(6), "sum", "ring/ring", groups=good)
        try:
            comm.all_reduce(np.ones(6), "sum", "ring/ring", groups=bad)
        except TypeError as exc:
            return "groups" in str(exc)
        return False

    assert collectives.run(body, 4) == [True] * 4


@pytest.mark.parametrize(("spec", "error", "start"), [
    ("rign", ValueError, "algorithm='rign': unknown algorithm"),
    (5, TypeError, "algorithm must be a string"),
    (("ring", 2.5), ValueError, "algorithm tuple ('ring', 2.5): shards must be a whole number"),
    ("pscpu:2k:bogus", ValueError, "algorithm 'pscpu:2k:bogus' part 'bogus'"),
])
def test_the_librarys_calls_name_their_own_argument(spec, error, start) -> None:
    # (a batch's or buckets' bad algorithm= was named all_reduce_spec, TensorFlow's argument)
    with pytest.raises(error) as info:
        parse_spec(spec, argument="algorithm")
    assert str(info.value).startswith(start) and "all_reduce_spec" not in str(info.value)

    def body(comm):
        with pytest.raises(error) as info:
            comm.batch_all_reduce([np.ones(3), np.ones(4)], algorithm=spec)
        return str(info.value)

    assert collectives.run(body, 1)[0].startswith(start)
