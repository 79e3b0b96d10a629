"""JAX arrays (``adapters/jax_arrays.py``): every collective, on thread ranks and on a
multi-device list, gives JAX arrays back when it was given JAX arrays, with the values of a
float64 NumPy reference; an ``out=`` that is a JAX array is refused on every rank before any
data moves (JAX arrays are immutable); asynchronous handles hand back JAX arrays too."""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import collectives
from collectives.foreign import kind_of

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not "
                                "installed (pip install jax; the test extra brings it)")
jax: Any = None
jnp: Any = None


@pytest.fixture(autouse=True, scope="module")
def _jax() -> None:
    """JAX, imported when this module's first test runs, not when pytest collects it (every
    xdist worker collects every module; importing JAX costs over a second of CPU)."""
    global jax, jnp
    import jax as module

    jax, jnp = module, module.numpy

RANKS = [1, 2, 3, 4]
DTYPES = ["float32", "int32"]
SIZES = [0, 1, 13]  # elements per rank's share: none, one, a prime


def inputs(n: int, size: int, dtype: str, seed: int = 0) -> list[np.ndarray]:
    """Per participant, ``n * size`` small integers (sums, maxima and the like are exact)."""
    rng = np.random.default_rng(seed + 97 * n + size)
    return [rng.integers(-8, 9, n * size).astype(dtype) for _ in range(n)]


def wide(values) -> np.ndarray:
    return np.stack([np.asarray(v, np.float64) for v in values])


def check(got, want: np.ndarray, name: str) -> None:
    assert isinstance(got, jax.Array), (name, type(got))
    assert got.shape == want.shape, (name, got.shape, want.shape)
    np.testing.assert_array_equal(np.asarray(got, np.float64), want, err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", RANKS)
def test_every_collective_gives_jax_arrays_on_thread_ranks(n, size, dtype):
    xs = inputs(n, size, dtype)
    total = wide(xs)

    def body(comm):
        r = comm.rank
        x = jnp.asarray(xs[r])
        table = x.reshape(n, size)
        return {
            "all_reduce": comm.all_reduce(x),
            "max": comm.all_reduce(x, "max"),
            "min": comm.all_reduce(x, "min", "ring"),
            "reduce": comm.reduce(x, "sum", root=n - 1),
            "broadcast": comm.broadcast(x, 0),  # (non-roots: an array of the shape)
            "all_gather": comm.all_gather(x),
            "reduce_scatter": comm.reduce_scatter(x),
            "gather": comm.gather(x, 0),
            "scatter": comm.scatter(table if r == 0 else None, 0),
            "all_to_all": comm.all_to_all(x),
            "batch_all_reduce": comm.batch_all_reduce([x, table, x[:size]]),
            "batch_split": comm.batch_all_reduce([x, table], algorithm="xring",
                                                 num_packs=2),
        }

    got = collectives.run(body, n)
    chunks = [xs[0].reshape(n, size)[r] for r in range(n)]
    for r, results in enumerate(got):
        want = {
            "all_reduce": total.sum(0), "max": total.max(0), "min": total.min(0),
            "broadcast": total[0], "all_gather": total.reshape(-1),
            "reduce_scatter": total.sum(0).reshape(n, size)[r],
            "scatter": np.asarray(chunks[r], np.float64),
            "all_to_all": total.reshape(n, n, size)[:, r].reshape(-1),
        }
        if r == n - 1:
            want["reduce"] = total.sum(0)
        else:
            assert results["reduce"] is None
        if r == 0:
            want["gather"] = total
        else:
            assert results["gather"] is None
        if r != 0:  # (a non-root passes None to scatter: nothing says what type it wants)
            np.testing.assert_array_equal(want.pop("scatter"), results["scatter"])
        for name, value in want.items():
            check(results[name], value, f"rank {r}: {name}")
        batch = [total.sum(0), total.sum(0).reshape(n, size), total.sum(0)[:size]]
        for k, value in enumerate(batch):
            check(results["batch_all_reduce"][k], value, f"rank {r}: batch {k}")
        for k, value in enumerate(batch[:2]):
            check(results["batch_split"][k], value, f"rank {r}: split batch {k}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", RANKS)
def test_every_multi_device_function_gives_jax_arrays(n, size, dtype):
    xs = inputs(n, size, dtype, seed=1)
    values = [jnp.asarray(x) for x in xs]
    total = wide(xs)
    table = jnp.asarray(xs[0].reshape(n, size))
    cases = {
        "all_reduce": (collectives.all_reduce(values), [total.sum(0)] * n),
        "max": (collectives.all_reduce(values, "max"), [total.max(0)] * n),
        "reduce": (collectives.reduce(values, root=n - 1), total.sum(0)),
        "broadcast": (collectives.broadcast(values[0], n), [total[0]] * n),
        "all_gather": (collectives.all_gather(values), [total.reshape(-1)] * n),
        "reduce_scatter": (collectives.reduce_scatter(values),
                           list(total.sum(0).reshape(n, size))),
        "gather": (collectives.gather(values), total),
        "scatter": (collectives.scatter(table, n), list(wide(xs[:1])[0].reshape(n, size))),
        "all_to_all": (collectives.all_to_all(values),
                       [total.reshape(n, n, size)[:, d].reshape(-1) for d in range(n)]),
    }
    for name, (got, want) in cases.items():
        if isinstance(want, list):
            assert isinstance(got, list) and len(got) == n, name
            for d, (g, w) in enumerate(zip(got, want, strict=True)):
                check(g, w, f"{name} on device {d}")
        else:
            check(got, want, name)
    batch = collectives.batch_all_reduce([values, [v.reshape(n, size) for v in values]])
    for d in range(n):
        check(batch[0][d], total.sum(0), f"batch tensor 0 on device {d}")
        check(batch[1][d], total.sum(0).reshape(n, size), f"batch tensor 1 on device {d}")


@pytest.mark.parametrize("n", [1, 3])
def test_mean_and_bfloat16_come_back_as_jax_arrays(n):
    xs = inputs(n, 5, "int32", seed=2)
    with pytest.warns(RuntimeWarning, match="jax_enable_x64") if not jax.config.jax_enable_x64 \
            else contextlib.nullcontext():  # (float32 without 64-bit types: said, not silent)
        got = collectives.all_reduce([jnp.asarray(x) for x in xs], "mean")
    for g in got:  # (integer MEAN is float64; JAX keeps float32 unless x64 is enabled)
        assert isinstance(g, jax.Array)
        np.testing.assert_allclose(np.asarray(g, np.float64), wide(xs).mean(0), rtol=1e-6)
    halves = [jnp.asarray(x, jnp.bfloat16) for x in xs]
    summed = collectives.run(lambda comm: comm.all_reduce(halves[comm.rank]), n)
    for s in summed:
        assert isinstance(s, jax.Array) and s.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(s, np.float64), wide(xs).sum(0))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_jax_out_is_refused_on_every_rank_before_any_data_moves(n):
    xs = inputs(n, 4, "float32", seed=3)

    def body(comm):
        x = jnp.asarray(xs[comm.rank])
        errors = []
        for call in (lambda: comm.all_reduce(x, out=x),
                     lambda: comm.all_reduce(xs[comm.rank], out=jnp.zeros_like(x)),
                     lambda: comm.all_gather(x, out=jnp.zeros(4 * n)),
                     lambda: comm.reduce_scatter(x, out=jnp.zeros(4 // n if n != 3 else 1)),
                     lambda: comm.broadcast(x, 0, out=jnp.zeros_like(x)),
                     lambda: comm.all_reduce(x, out=x, async_op=True)):
            with pytest.raises(TypeError) as caught:
                call()
            errors.append(str(caught.value))
        # nothing was started: the ranks still agree on the next call
        return errors, comm.all_reduce(x)

    for errors, after in collectives.run(body, n):
        for text in errors:
            assert text.startswith("out is a jax array") and "immutable" in text, text
            assert "drop out=" in text and "returned array" in text, text
        check(after, wide(xs).sum(0), "the call after the refusals")
    values = [jnp.asarray(x) for x in xs]
    with pytest.raises(TypeError, match=r"out\[0\] is a jax array .*immutable.*drop out="):
        collectives.all_reduce(values, out=[jnp.zeros(4) for _ in range(n)])
    with pytest.raises(TypeError, match=r"out\[0\] is a jax array"):
        collectives.all_reduce(xs, out=values)  # (NumPy in, JAX out: refused as well)


DELETED_CALLS = {
    "all_reduce": lambda comm, x: comm.all_reduce(x),
    "async": lambda comm, x: comm.all_reduce(x, async_op=True).wait(),
    "batch": lambda comm, x: comm.batch_all_reduce([x, x]),
    "broadcast": lambda comm, x: comm.broadcast(x, 1),
    "all_gather": lambda comm, x: comm.all_gather(x),
    "reduce_scatter": lambda comm, x: comm.reduce_scatter(x),
}


@pytest.mark.parametrize("call", list(DELETED_CALLS))
def test_a_deleted_array_on_one_rank_is_refused_on_every_rank_at_once(call):
    """A deleted (donated) JAX array on rank 0: a TypeError naming it there, a PeerFailedError
    on its peer at once, and the next call works (reading its device raised JAX's bare
    RuntimeError past the refusal: the peer waited out its timeout)."""
    import time

    def body(comm):
        x = jnp.arange(4, dtype=jnp.float32) + comm.rank
        if comm.rank == 0:
            x.delete()
        start = time.monotonic()
        with pytest.raises((TypeError, collectives.PeerFailedError)) as raised:
            DELETED_CALLS[call](comm, x)
        return (type(raised.value).__name__, str(raised.value), time.monotonic() - start,
                comm.all_reduce(np.ones(2)).tolist())

    (kind0, said0, took0, next0), (kind1, said1, took1, next1) = collectives.run(
        body, 2, timeout=10)
    name = "xs[0]" if call == "batch" else "x"
    assert kind0 == "TypeError" and said0.startswith(f"{name} ("), said0
    assert "has been deleted" in said0, said0
    assert kind1 == "PeerFailedError" and "rank 0" in said1, said1
    assert max(took0, took1) < 2.0 and next0 == next1 == [2.0, 2.0]
    with pytest.raises(TypeError, match=r"values\[1\] .*has been deleted"):
        doomed = jnp.ones(3)
        doomed.delete()
        collectives.all_reduce([jnp.ones(3), doomed])


@pytest.mark.parametrize("n", [1, 2, 3])
def test_asynchronous_handles_hand_back_jax_arrays(n):
    xs = inputs(n, 7, "float32", seed=4)
    total = wide(xs)

    def body(comm):
        x = jnp.asarray(xs[comm.rank])
        handles = {"all_reduce": comm.all_reduce(x, async_op=True),
                   "all_gather": comm.all_gather(x, async_op=True),
                   "reduce_scatter": comm.reduce_scatter(x, async_op=True),
                   "batch": comm.batch_all_reduce([x, x[:3]], async_op=True)}
        results = {name: h.wait() for name, h in handles.items()}
        assert handles["all_reduce"].wait() is results["all_reduce"]  # (one result, kept)
        assert handles["all_reduce"].is_completed() and handles["all_reduce"].exception() is None
        return results

    for r, results in enumerate(collectives.run(body, n)):
        check(results["all_reduce"], total.sum(0), "all_reduce")
        check(results["all_gather"], total.reshape(-1), "all_gather")
        check(results["reduce_scatter"], total.sum(0).reshape(n, 7)[r], "reduce_scatter")
        check(results["batch"][0], total.sum(0), "batch 0")
        check(results["batch"][1], total.sum(0)[:3], "batch 1")
    values = [jnp.asarray(x) for x in xs]
    for handle in (collectives.all_reduce(values, async_op=True),
                   collectives.all_gather(values, async_op=True)):
        got = handle.wait()
        assert len(got) == n and all(isinstance(g, jax.Array) for g in got)
    batch = collectives.batch_all_reduce([values], async_op=True).wait()
    for g in batch[0]:
        check(g, total.sum(0), "multi-device batch, async")


def test_jax_after_numpy_of_the_same_signature_still_comes_back_as_jax():
    xs = inputs(2, 8, "float32", seed=5)

    def body(comm):
        first = [comm.all_reduce(xs[comm.rank]) for _ in range(3)]  # NumPy: may go hot
        return first, [comm.all_reduce(jnp.asarray(xs[comm.rank])) for _ in range(3)]

    for first, second in collectives.run(body, 2):
        assert all(type(f) is np.ndarray for f in first)
        for s in second:
            check(s, wide(xs).sum(0), "JAX after NumPy")


def test_results_stay_on_a_committed_arrays_device_and_survive_later_calls():
    device = jax.devices()[0]
    values = [jax.device_put(jnp.full((1 << 15,), float(d)), device) for d in range(2)]
    kept = [collectives.all_reduce(values)[0] for _ in range(4)]  # 128 KiB: pooled sizes
    for k in kept:
        assert k.committed and k.devices() == {device}
        np.testing.assert_array_equal(np.asarray(k), np.full(1 << 15, 1.0))
    loose = collectives.all_reduce([jnp.ones(3), jnp.ones(3)])[0]
    assert not loose.committed  # (an uncommitted input: an uncommitted result)


def test_the_jax_kind_is_installed_and_does_not_pack():
    kind = kind_of(jnp.ones(2))
    assert kind is not None and kind.kind.name == "jax"
    assert not kind.packs and kind.out_refusal and kind.back is not None
    assert kind_of(np.ones(2)) is None


def test_a_numpy_out_beside_jax_values_is_the_result():
    # (the results went back as JAX arrays copied from out asynchronously: writing out after
    # the call changed them)
    values = [jnp.ones(1 << 16, jnp.float32)] * 2
    outs = [np.empty(1 << 16, np.float32) for _ in values]
    got = collectives.all_reduce(values, out=outs)
    assert all(g is o for g, o in zip(got, outs)) and (outs[0] == 2).all()


PLACED = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, jax.numpy as jnp, numpy as np, collectives
from jax.sharding import Mesh, NamedSharding, PartitionSpec
devices = jax.devices()
values = [jax.device_put(jnp.arange(4.0) + d, devices[d]) for d in range(2)]
print("reduce", collectives.reduce(values, root=1).devices() == {devices[1]})
print("gather", collectives.gather(values, root=1).devices() == {devices[1]})
print("broadcast", [c.devices() for c in collectives.broadcast(values[1], values)]
      == [{devices[0]}, {devices[1]}])
sharded = jax.device_put(jnp.arange(8.0), NamedSharding(Mesh(np.array(devices), ("x",)),
                                                        PartitionSpec("x")))
print("sharded", collectives.run(lambda comm: comm.all_reduce(sharded), 2)[0].tolist()
      == [2.0 * i for i in range(8)])
"""


def test_results_go_back_beside_the_root_or_the_listed_devices_and_cpu_shards_are_read():
    # (a rooted result went to device 0, broadcast's listed arrays were ignored, and an array
    # sharded over CPU devices was refused with advice to use a GPU backend)
    out = subprocess.run([sys.executable, "-c", PLACED], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["reduce", "True", "gather", "True", "broadcast", "True",
                                  "sharded", "True"], out.stdout + out.stderr[-2000:]
