"""Wire compression (``compression="fp16"|"bf16"``): float32/float64 SUM and MEAN all-reduces
carried in a narrower float, cast back.

Checks: every rank (device) gets bitwise the same result, of the input's dtype; sums exact in
the narrow type come back exact; on random normal data the error stays within the rounding
bound of the narrow type (one rounding per input and per addition); the call travels as the
narrow dtype (a rank that does not compress disagrees about the dtype, before data moves);
clear errors for other ops, dtypes and names, and for bf16 without ml_dtypes.
"""

from __future__ import annotations

import numpy as np
import pytest

import collectives
from collectives import compression as compression_module
from collectives.errors import CollectiveMismatchError
from collectives.ops import BFLOAT16

UNIT = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}  # unit roundoff of float16, bfloat16
TINY = {"fp16": 2.0 ** -25, "bf16": 2.0 ** -134}  # half their smallest subnormal
SIZES = [0, 1, 13, 4099, 100_003]


def _inputs(n: int, size: int, dtype, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(size).astype(dtype) for _ in range(n)]


def _check_bound(result, values, op: str, compression: str) -> None:
    """|result - exact| <= (p + 1) * (u * sum |x_i| + tiny) (MEAN: sum / p): an input's
    rounding, p - 1 additions and the pre-division each add at most one unit roundoff of what
    they touch, or half a subnormal step near zero."""
    p = len(values)
    exact = np.sum([v.astype(np.float64) for v in values], axis=0)
    magnitude = np.sum([np.abs(v.astype(np.float64)) for v in values], axis=0)
    if op == "mean":
        exact, magnitude = exact / p, magnitude / p
    bound = (p + 1) * (UNIT[compression] * magnitude + TINY[compression])
    assert np.all(np.abs(result.astype(np.float64) - exact) <= bound)


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_spmd_all_reduce(compression, dtype, op):
    n = 4
    inputs = {size: _inputs(n, size, dtype, seed=size) for size in SIZES}

    def body(comm):
        out = {}
        for size, values in inputs.items():
            x = values[comm.rank]
            before = x.copy()
            out[size] = comm.all_reduce(x, op, "ring" if size % 2 else "rechd",
                                        compression=compression)
            assert np.array_equal(x, before)  # inputs are never modified
        target = np.empty_like(inputs[4099][comm.rank])
        got = comm.all_reduce(inputs[4099][comm.rank], op, out=target, compression=compression)
        assert got is target
        work = comm.all_reduce(inputs[13][comm.rank], op, compression=compression, async_op=True)
        out["async"] = work.wait()
        return out

    results = collectives.run(body, n)
    for key in [*SIZES, "async"]:
        first = results[0][key]
        assert first.dtype == np.dtype(dtype)
        for other in results[1:]:
            assert first.tobytes() == other[key].tobytes()  # bitwise identical on every rank
        values = inputs[13 if key == "async" else key]
        _check_bound(first, values, op, compression)


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_exact_sums_come_back_exact(compression):
    # small integers: every input, partial sum and (power-of-two) mean is exact in the
    # narrow type, so compression loses nothing
    values = [np.arange(-20, 21, dtype=np.float32) * (r + 1) for r in range(4)]
    sums = collectives.run(lambda c: c.all_reduce(values[c.rank], "sum",
                                                  compression=compression), 4)
    means = collectives.all_reduce(values, "mean", "tree", compression=compression)
    for s in sums:
        assert np.array_equal(s, np.arange(-20, 21, dtype=np.float32) * 10)
    for m in means:
        assert np.array_equal(m, np.arange(-20, 21, dtype=np.float32) * 2.5)


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
@pytest.mark.parametrize("algorithm", ["one_device", "ring", "shuffle", "auto"])
def test_multi_device(compression, algorithm):
    for n in (1, 3, 4):
        for size in (0, 1, 4099, 300_007):
            values = _inputs(n, size, np.float32, seed=n * size)
            for op in ("sum", "mean"):
                results = collectives.all_reduce(values, op, algorithm, compression=compression)
                assert all(r.tobytes() == results[0].tobytes() for r in results)
                assert results[0].dtype == np.float32
                _check_bound(results[0], values, op, compression)
                shared = collectives.all_reduce(values, op, algorithm, shared_result=True,
                                                compression=compression)
                assert shared[0].tobytes() == results[0].tobytes()
                assert not shared[0].flags.writeable
            outs = [np.empty(size, np.float32) for _ in range(n)]
            got = collectives.all_reduce(values, "sum", algorithm, out=outs,
                                         compression=compression, async_op=True).wait()
            assert all(g is o for g, o in zip(got, outs))


def test_batches_compress_their_floating_tensors():
    """As Horovod's compressors: float32/float64 packs compressed, integers travel exact."""
    big = 2.0 ** 12 + 1  # not a float16: it comes back rounded where compressed
    floats = [np.full(5, big, np.float32) for _ in range(2)]
    ints = [np.full(3, 2 ** 20 + 1, np.int64) for _ in range(2)]
    out = collectives.batch_all_reduce([floats, ints], "sum", compression="fp16")
    assert np.array_equal(out[0][0], np.full(5, np.float32(np.float16(big)) * 2))
    assert np.array_equal(out[1][1], np.full(3, 2 * (2 ** 20 + 1)))
    spmd = collectives.run(lambda c: c.batch_all_reduce([floats[c.rank], ints[c.rank]], "sum",
                                                        compression="fp16"), 2)
    for tensors in spmd:
        assert np.array_equal(tensors[0], out[0][0]) and np.array_equal(tensors[1], out[1][0])


@pytest.mark.parametrize("devices", [2, 3, 7])
def test_an_integer_mean_in_a_compressed_batch_is_exact(devices):
    """An integer MEAN is summed exactly in float64, compressed or not: a multi-device batch
    widened its integers before packing and then compressed the float64 pack (the mean of 7
    int32 devices came back off in the fourth digit), where the SPMD batch's travel as they
    are. Its float32 tensors are still compressed."""
    big = 2.0 ** 12 + 1  # not a float16: it comes back rounded where compressed
    ints = [np.array([-5, 1, 3 * d, 2 ** 30 + d], np.int32) for d in range(devices)]
    wides = [np.full(3, 2.0 ** 40 + d) for d in range(devices)]  # (no float16 holds them)
    floats = [np.full(5, big, np.float32) for _ in range(devices)]
    for value_lists in ([ints], [floats, ints, wides]):
        want = [np.mean(np.stack(v).astype(np.float64), axis=0) for v in value_lists]
        got = collectives.batch_all_reduce(value_lists, "mean", compression="fp16")
        for k, (values, mean) in enumerate(zip(value_lists, want)):
            if values[0].dtype == np.int32:
                assert all(g.tobytes() == mean.tobytes() for g in got[k]), (got[k][0], mean)
            elif values[0].dtype == np.float32:  # (compressed, as in a list of its own)
                alone = collectives.batch_all_reduce([values], "mean", compression="fp16")[0]
                assert all(g.tobytes() == alone[0].tobytes() for g in got[k])
                assert not np.array_equal(alone[0], np.full(5, big, np.float32))
        spmd = collectives.run(lambda c, lists=value_lists: c.batch_all_reduce(
            [v[c.rank] for v in lists], "mean", compression="fp16"), devices)
        for tensors in spmd:  # (the SPMD batch's integer means: the same bits)
            assert all(t.tobytes() == g[0].tobytes() for t, g, values in zip(
                tensors, got, value_lists) if values[0].dtype == np.int32)


def test_ranks_that_disagree_on_compressing_are_told():
    """The wire carries float16: a rank that sends float32 disagrees, before data moves."""
    def body(comm):
        x = np.ones(8, np.float32)
        return comm.all_reduce(x, compression="fp16" if comm.rank == 0 else None, timeout=20)

    with pytest.raises(CollectiveMismatchError, match="float16"):
        collectives.run(body, 2)


def test_errors_name_the_fix():
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="compression=None"):
        collectives.all_reduce([x, x], "max", compression="fp16")
    with pytest.raises(TypeError, match="float32 and float64"):
        collectives.all_reduce([np.ones(3, np.int32)] * 2, compression="bf16")
    with pytest.raises(TypeError, match="float32 and float64"):
        collectives.all_reduce([np.ones(3, np.float16)] * 2, compression="fp16")
    with pytest.raises(ValueError, match="'fp16', 'bf16' or None"):
        collectives.all_reduce([x, x], compression="int8")
    with pytest.raises(ValueError, match="accumulation_fn"):
        collectives.all_reduce([x, x], compression="fp16", accumulation_fn=sum)
    # on every rank, before any data moves
    errors = collectives.run(lambda c: _error_of(lambda: c.all_reduce(x, "prod",
                                                                      compression="fp16")), 3)
    assert all(isinstance(e, ValueError) and "sum and mean" in str(e) for e in errors)
    # "none" and None mean no compression
    assert np.array_equal(collectives.all_reduce([x, x], compression="none")[0], 2 * x)


def test_bf16_without_ml_dtypes_says_what_to_install(monkeypatch):
    monkeypatch.setattr(compression_module, "BFLOAT16", None)
    with pytest.raises(ValueError, match=r"pip install 'collective-schedules\[bfloat16\]'"):
        collectives.all_reduce([np.ones(2, np.float32)] * 2, compression="bf16")
    assert np.array_equal(collectives.all_reduce([np.ones(2, np.float32)] * 2,
                                                 compression="fp16")[0], [2.0, 2.0])


def _error_of(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_a_big_endian_float_compresses_as_its_native_twin(compression):
    # (">f4" was refused: "compresses float32 and float64; x has dtype >f4")
    native = np.arange(6, dtype=np.float32) * 1.5
    swapped = native.astype(">f4")
    got = collectives.run(lambda c: c.all_reduce(swapped, "mean", compression=compression), 3)
    want = collectives.run(lambda c: c.all_reduce(native, "mean", compression=compression), 3)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    batch = collectives.run(lambda c: c.batch_all_reduce([swapped, native], "sum",
                                                          compression=compression), 2)[0]
    np.testing.assert_array_equal(batch[0], batch[1])


def test_errors_name_a_compressed_call_as_the_caller_made_it():
    # (they named its wire call: "all_reduce(float16[1000], op=sum)" for a float32 mean)
    def body(comm):
        if comm.rank == 1:
            return None  # (leaves: rank 0's call cannot finish)
        with pytest.raises(collectives.PeerFailedError) as raised:
            comm.all_reduce(np.ones(1000, np.float32), "mean", compression="fp16", timeout=5)
        return str(raised.value)

    said = collectives.run(body, 2, timeout=10)[0]
    assert "all_reduce(float32[1000], op=mean, compression=float16)" in said, said


def _at_the_edge(wire: str, n: int) -> list[np.ndarray]:
    """Every participant's values at the wire type's largest (and just inside it), which a
    mean of ``n`` of them keeps, and values just inside ``largest / n``, whose sum it keeps."""
    largest = float(np.finfo(np.float16 if wire == "fp16" else BFLOAT16).max)
    edge = [largest, -largest, largest * (1 - 2 ** -12), largest / n * (1 - 2 ** -20), 1.5]
    return [np.array(edge, np.float32) for _ in range(n)]


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
@pytest.mark.parametrize("n", [2, 3, 5, 7, 10, 18])
def test_a_mean_within_the_wires_range_never_overflows(compression, n):
    """Each share is rounded to the nearest wire value except at the very top of its range,
    where it goes a few steps down, so that n of them added in the wire's rounding stay within
    range (65504 / 3 rounded up to 21840: three made ``inf``; ten shares of 6548 added one
    after another rounded past 65504 on the ring). Every call kind: plain (on each algorithm),
    ``out=``, async, a fused batch (blocking and async), the multi-device list and its batch."""
    values = _at_the_edge(compression, n)
    shares = np.array([v[3] for v in values], np.float64)  # sum within range: never inf

    def body(comm):
        x = values[comm.rank]
        for algorithm in ("ring", "rechd", "tree", "shuffle", "one_device"):
            got = comm.all_reduce(x, "mean", algorithm, compression=compression)
            assert np.isfinite(got).all(), (algorithm, got)
            _check_bound(got, values, "mean", compression)
        return [comm.all_reduce(x, "mean", compression=compression),
                comm.all_reduce(x, "mean", out=np.empty_like(x), compression=compression),
                comm.all_reduce(x, "mean", compression=compression, async_op=True).wait(),
                comm.batch_all_reduce([x, x], "mean", compression=compression)[1],
                comm.batch_all_reduce([x], "mean", compression=compression,
                                      async_op=True).wait()[0],
                comm.all_reduce(x, "sum", compression=compression)]

    per_rank = collectives.run(body, n)
    kinds = [*per_rank[0], collectives.all_reduce(values, "mean", compression=compression)[0],
             collectives.batch_all_reduce([values], "mean", compression=compression)[0][1]]
    for result in kinds[:-3] + kinds[-2:]:  # the means
        assert np.isfinite(result).all(), result
        _check_bound(result, values, "mean", compression)
    assert np.isfinite(kinds[-3][3]) and abs(kinds[-3][3] - shares.sum()) <= (
        (n + 1) * UNIT[compression] * shares.sum())
    for results in per_rank[1:]:
        assert all(a.tobytes() == b.tobytes() for a, b in zip(results, per_rank[0]))
