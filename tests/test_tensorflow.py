"""The TensorFlow adapter: host-side reductions in process, TensorFlow checks in subprocesses
(the GPU path's own tests, which need a GPU, are ``tests/gpu/test_tensorflow_gpu.py``).

TensorFlow can split the CPU into logical devices only once per process, so the TensorFlow
checks run as scripts of ``tests/tf_scenarios/`` in processes of their own (one for 1 to 4
devices, the multi-worker one under ``mpiexec -n 2``); each prints a JSON report as its last
line. The
NumPy side of the adapter (``collectives.adapters.tensorflow.host``) needs no TensorFlow and is
tested here directly against the core.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tracemalloc
import weakref
from pathlib import Path

import numpy as np
import pytest
from collectives.adapters.tensorflow import host
from collectives.adapters.tensorflow.agreement import BatchAgreement, Signature, agree
from collectives.adapters.tensorflow.pool import ALIGNMENT, BufferPool
from collectives.adapters.tensorflow.world import launched_world_size, open_communicator
from conftest import find_mpiexec

import collectives
from collectives.algorithms.spec import parse_spec

# real MirroredStrategy runs: left out of the quick subset; the scenario process of every device
# count takes about 100 s of CPU, 200-250 s on a busy 2-core machine, within its own 600 s
# (``four_devices``): the test that starts it may take that long
pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]

SCENARIOS = Path(__file__).parent / "tf_scenarios"
HAVE_TF = importlib.util.find_spec("tensorflow") is not None
needs_tf = pytest.mark.skipif(not HAVE_TF, reason="tensorflow is not installed")

ALGORITHMS = ["one_device", "ring", "rechd", "tree", "shuffle", "auto", "xring", "pscpu", "nccl"]


# --- host side: NumPy in, NumPy out -------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("algorithm", ALGORITHMS + ["ring/tree", "pscpu/pscpu"])
def test_reduce_to_root_matches_core_all_reduce(n, algorithm, rng):
    values = [rng.standard_normal(37).astype(np.float32) for _ in range(n)]
    kwargs = {"groups": 2} if "/" in algorithm else {}
    got = host.reduce_to_root(values, "sum", algorithm, **kwargs)
    want = collectives.all_reduce(values, "sum", algorithm, **kwargs)[0]
    assert got.tobytes() == want.tobytes()  # the same schedule's sums, bit for bit
    before = [v.copy() for v in values]
    host.reduce_to_root(values, "mean", algorithm, **kwargs)
    for v, b in zip(values, before):
        assert v.tobytes() == b.tobytes()  # inputs are never written


def test_reduce_to_root_mean_and_dtypes():
    ints = [np.arange(4, dtype=np.int32) * (p + 1) for p in range(3)]
    mean = host.reduce_to_root(ints, "mean", "ring")
    assert mean.dtype == np.float64 and np.array_equal(mean, np.arange(4) * 2.0)
    total = host.reduce_to_root([np.ones((2, 3), np.float16)] * 4, "sum", "tree")
    assert total.dtype == np.float16 and total.shape == (2, 3) and np.all(total == 4)
    with pytest.raises(ValueError, match="empty"):
        host.reduce_to_root([], "sum")
    with pytest.raises(ValueError, match="shape"):
        host.reduce_to_root([np.ones(2), np.ones(3)], "sum")


def test_reduce_to_root_uses_the_allocator():
    made = []

    def empty(shape, dtype):
        made.append((shape, np.dtype(dtype)))
        return np.empty(shape, dtype)

    host.reduce_to_root([np.ones(5, np.float32)] * 3, "sum", "ring", empty=empty)
    assert made == [((5,), np.dtype(np.float32))]


@pytest.mark.parametrize("spec", ["ring", "pscpu:8:ring#2", [("tree", 1, 16), ("rechd", 1, -1)],
                                  ("nccl/xring", 2)])
@pytest.mark.parametrize("packing", [host.Packing(), host.Packing(num_packs=2),
                                     host.Packing(agg_small_grads_max_bytes=64),
                                     host.Packing(bytes_per_pack=40)])
def test_reduce_batch_keeps_input_order(spec, packing, rng):
    shapes = [(3,), (40,), (2, 2), (), (9, 5), (1,)]
    dtypes = [np.float32, np.float32, np.float64, np.float32, np.float32, np.int64]
    n = 3
    values = [[(rng.integers(-9, 9, s)).astype(d) for _ in range(n)] for s, d in zip(shapes, dtypes)]
    got = host.reduce_batch(values, "sum", spec, packing=packing, groups=2)
    for g, v in zip(got, values):
        want = np.sum(v, axis=0).astype(v[0].dtype)
        assert g.shape == want.shape and g.dtype == want.dtype
        np.testing.assert_array_equal(g, want)
    assert host.reduce_batch([], "sum") == []


def test_cross_worker_spec():
    ranges = parse_spec("pscpu:2k:pscpu/pscpu#2:64k:nccl/xring")
    assert host.cross_worker_spec(ranges) == [("pscpu", 1, 2048), ("pscpu", 2, 65536),
                                              ("xring", 1, -1)]
    assert [host.local_algorithm(r.algorithm) for r in ranges] == ["pscpu", "pscpu", "nccl"]


@pytest.mark.parametrize("workers_sum", ["mean", "sum"])
def test_reduce_batch_across_workers(workers_sum):
    # 2 workers x 3 devices; device d of worker w holds (3w + d + 1) * base.
    bases = [np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(5, dtype=np.int32)]

    def worker(comm):
        values = [[b * (3 * comm.rank + d + 1) for d in range(3)] for b in bases]
        return (host.reduce_batch_across_workers(values, "sum", "pscpu:4:nccl/xring", comm,
                                                 workers_sum=workers_sum),
                host.reduce_batch_across_workers(values, "mean", ("ring", 2), comm))

    for sums, means in collectives.run(worker, 2):
        total = 21  # 1 + ... + 6
        scale = total / 2 if workers_sum == "mean" else total
        np.testing.assert_array_equal(sums[0], bases[0] * scale)
        np.testing.assert_array_equal(sums[1], bases[1] * total)  # integers: never averaged
        assert sums[1].dtype == np.int32
        np.testing.assert_allclose(means[0], bases[0] * total / 6, rtol=1e-6)
        assert means[1].dtype == np.float64


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_reduce_batch_across_workers_compressed(compression):
    """The float totals cross between workers in the narrow float (a sum that float16 and
    bfloat16 round shows it), integers exactly; every worker gets the same bits."""
    odd = 1.0 + 2.0 ** -12  # rounds to 1.0 in both narrow floats
    bases = [np.full(7, odd, np.float32), np.full(3, 2 ** 20 + 1, np.int64)]

    def worker(comm):
        values = [[b * 1 for _ in range(2)] for b in bases]
        return host.reduce_batch_across_workers(values, "sum", "ring/ring", comm,
                                                workers_sum="sum", compression=compression)

    results = collectives.run(worker, 2)
    local = np.float32(odd) * 2  # exact among a worker's devices (shared memory)
    narrow = np.float32(local.astype(np.float16 if compression == "fp16" else
                                     np.dtype(collectives.ops.BFLOAT16)))
    for floats, ints in results:
        np.testing.assert_array_equal(floats, np.full(7, narrow * 2, np.float32))
        np.testing.assert_array_equal(ints, np.full(3, 4 * (2 ** 20 + 1)))
        assert floats.tobytes() == results[0][0].tobytes()


@pytest.mark.parametrize("spellings", [("fp16", "half"), ("bf16", "bfloat16")])
def test_workers_that_spell_one_compression_two_ways_agree(spellings):
    # (the workers agreed on the name as spelled: "fp16" beside "half" was a mismatch, where
    # every call of the core takes them for one wire type)
    def worker(comm):
        values = [[np.full(4, 3.0, np.float32) for _ in range(2)]]
        return host.reduce_batch_across_workers(values, "mean", "ring/ring", comm,
                                                compression=spellings[comm.rank])[0]

    for result in collectives.run(worker, 2):
        np.testing.assert_array_equal(result, np.full(4, 3.0, np.float32))


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_a_compressed_mean_across_workers_divides_before_the_narrow_float(compression):
    """A mean (or a sum averaged over the workers) whose total over the workers passes
    float16's range where it does not: divided before it crosses as float16 (it came back
    inf: 2 workers x 2 devices of 16384 sum to 65536 > 65504; every step is exact in both
    narrow floats)."""
    def worker(comm):
        values = [[np.full(3, 16384.0, np.float32) for _ in range(2)]]
        return (host.reduce_batch_across_workers(values, "mean", "ring/ring", comm,
                                                 compression=compression)[0],
                host.reduce_batch_across_workers(values, "sum", "ring/ring", comm,
                                                 compression=compression)[0])

    for mean, averaged in collectives.run(worker, 2):
        np.testing.assert_array_equal(mean, np.full(3, 16384.0, np.float32))
        np.testing.assert_array_equal(averaged, np.full(3, 32768.0, np.float32))
        assert mean.dtype == averaged.dtype == np.float32


@pytest.mark.parametrize("compression", [None, "fp16"])
@pytest.mark.parametrize("dtype, value", [("int8", 100), ("uint8", 200), ("int32", 1_500_000_000),
                                          ("int64", 2 ** 62)])
def test_an_integer_mean_across_workers_is_one_process_mean(dtype, value, compression):
    """2 workers x 2 devices give what one process over the 4 devices gives, the float64
    mean (summed in its own dtype it wrapped: int8 100s gave -28.0, int32 1.5e9s 4.26e8;
    compression leaves integers exact). A float32 tensor beside it is still compressed."""
    odd = np.float32(1.0 + 2.0 ** -12)  # rounds to 1.0 in float16

    def worker(comm):
        values = [[np.full(5, value, dtype) for _ in range(2)], [np.full(3, odd)] * 2]
        return host.reduce_batch_across_workers(values, "mean", "ring/ring", comm,
                                                compression=compression)

    one = host.reduce_batch([[np.full(5, value, dtype)] * 4], "mean")[0]
    assert np.array_equal(one, np.full(5, float(value)))
    for mean, floats in collectives.run(worker, 2):
        assert mean.dtype == one.dtype and np.array_equal(mean, one), mean
        assert np.array_equal(floats, np.full(3, 1.0 if compression else odd)), floats


def test_workers_whose_lists_differ_raise_before_an_integer_mean_takes_a_call_of_its_own():
    # (with compression, which tensors go in the uncompressed call depends on the list: worker
    # 1's float32 tensor paired with worker 0's second one, and returned, quietly)
    floats = [np.full(3, 1.0, np.float32)] * 2

    def worker(comm):
        values = [[np.full(5, 7, np.int8)] * 2, floats] if comm.rank == 0 else [floats]
        with pytest.raises(collectives.CollectiveMismatchError, match="different lengths"):
            host.reduce_batch_across_workers(values, "mean", "ring/ring", comm,
                                             compression="fp16")
        return comm.all_reduce(np.ones(2)).tolist()

    assert collectives.run(worker, 2, timeout=10) == [[2.0, 2.0]] * 2


def test_gather_ragged():
    def worker(comm):
        x = np.full((comm.rank + 1, 2), float(comm.rank))
        return host.gather_ragged(comm, x, 0), host.gather_ragged(comm, x.T, 1)

    for rows, cols in collectives.run(worker, 3):
        want = np.concatenate([np.full((r + 1, 2), float(r)) for r in range(3)])
        np.testing.assert_array_equal(rows, want)
        np.testing.assert_array_equal(cols, want.T)


def test_check_packing():
    host.check_packing(host.Packing(num_packs=3))
    with pytest.raises(ValueError):
        host.check_packing(host.Packing(num_packs=-1))
    with pytest.raises(ValueError):
        host.check_packing(host.Packing(bytes_per_pack=-1))


# --- the result-buffer pool: bounded, least recently used out ------------------------------------

def test_pool_stays_bounded_when_sizes_vary():
    """200 steps with a new length each (0.4 to 1.2 MB): the pool's count and the NumPy memory
    still allocated stay within its bounds (an unbounded pool keeps about 160 MB)."""
    limit = 8 << 20
    pool = BufferPool(max_bytes=limit, max_entries=16)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for step in range(200):
            out = pool.empty((100_000 + 1000 * step,), np.float32)
            assert out.ctypes.data % ALIGNMENT == 0
            out.fill(step)  # written, as a result is
            del out  # and let go of, as TensorFlow does once the result is consumed
            assert pool.nbytes <= limit and len(pool) <= 16
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held - before <= limit + (1 << 20), (held - before) / 1e6


def test_pool_reuses_free_buffers_and_forgets_the_least_recently_used():
    pool = BufferPool(max_bytes=1 << 20, max_entries=3)
    first = pool.empty((100,), np.float32)
    owner = weakref.ref(first.base)
    del first
    again = pool.empty((25, 4), np.float32)  # same byte size, free: the same buffer
    assert again.base is owner() and again.shape == (25, 4)
    other = pool.empty((100,), np.float32)  # the first is in use: never handed out twice
    assert other.base is not owner()
    del again, other
    for n in (200, 300, 400):  # three newer sizes push both 100-float buffers out
        pool.empty((n,), np.float32)
    assert len(pool) == 3 and owner() is None
    assert pool.nbytes == sum(pool.empty((n,), np.float32).base.nbytes for n in (200, 300, 400))

    small = BufferPool(max_bytes=1000, keep=2)
    big = small.empty((1000,), np.float64)  # larger than the whole pool: never kept
    assert len(small) == 0 and big.shape == (1000,)
    held = [small.empty((10,), np.uint8) for _ in range(3)]
    assert len(small) == 2 and len({id(h.base) for h in held}) == 3  # keep=2 of one size
    small.limit(max_bytes=0)
    assert len(small) == 0 and small.nbytes == 0
    with pytest.raises(ValueError, match="max_entries"):
        small.limit(max_entries=-1)


# --- workers agree on each batch before data moves --------------------------------------------

def _batch(count: int, devices: int = 2, shape=(3,), op: str = "SUM") -> Signature:
    return Signature({"call": "batch_reduce", "op": op, "workers_sum": "mean",
                      "devices": [devices] * count, "route": [[["ring", 1, -1], {}]] * count,
                      "tensors": [["dense", "float32", list(shape)]] * count})


def _sparse(table: list) -> Signature:
    return Signature({"call": "batch_reduce", "op": "SUM", "workers_sum": "mean", "devices": [2],
                      "route": [None], "tensors": [["sparse", "float32/int64", table]]})


def _agree_then_reduce(describe):
    """Every rank agrees on its own signature, then all-reduces (rank + 1): the ranks must still
    be in step after an error, so the sum is right."""
    def worker(comm):
        try:
            agree(comm, describe(comm.rank), timeout=10)
            error = None
        except collectives.CollectiveMismatchError as exc:
            error = str(exc)
        total = comm.all_reduce(np.array([comm.rank + 1.0]), timeout=10)
        return error, float(total[0])

    return collectives.run(worker, 3, timeout=30)


def test_agreement_passes_identical_batches():
    for error, total in _agree_then_reduce(lambda rank: _batch(2)):
        assert error is None and total == 6.0


@pytest.mark.parametrize("describe, fragment", [
    (lambda rank: _batch(1 if rank == 0 else 2),
     "batches of different lengths (rank 0: 1 tensor(s), rank 1: 2 tensor(s), rank 2: 2 tensor(s))"),
    (lambda rank: _batch(2, devices=2 - (rank == 2)), "different numbers of devices"),
    (lambda rank: _batch(2, shape=(3 + rank,)),
     "different tensors at position 0 (rank 0: dense float32 [3], rank 1: dense float32 [4]"),
    (lambda rank: _batch(2, op="MEAN" if rank else "SUM"), "different reduce ops"),
    (lambda rank: Signature({"call": "gather"}) if rank == 1 else _batch(1),
     "different operations (rank 0: batch_reduce, rank 1: gather"),
    # (a sparse value has no route: its tensor is what differs, not the algorithm)
    (lambda rank: _sparse([5, 4]) if rank == 1 else _batch(1),
     "different tensors at position 0 (rank 0: dense float32 [3], rank 1: sparse float32/int64 "
     "[5, 4]"),
    (lambda rank: _sparse([3 + rank, 4]),
     "(rank 0: sparse float32/int64 [3, 4], rank 1: sparse float32/int64 [4, 4]"),
])
def test_agreement_mismatch_raises_on_every_worker(describe, fragment):
    for rank, (error, total) in enumerate(_agree_then_reduce(describe)):
        assert error is not None and error.startswith(f"rank {rank}: ") and fragment in error, error
        assert total == 6.0  # still in step: nothing moved for the mismatched call


def test_agreement_digest_is_small_and_stable():
    assert _batch(3).digest.nbytes == 8  # what travels in the steady state
    assert _batch(3).digest.tobytes() == _batch(3).digest.tobytes()
    assert _batch(3).digest.tobytes() != _batch(2).digest.tobytes()


def test_batch_agreement_fills_in_shapes_unknown_while_tracing():
    sparse = ("sparse", "float32/int64", (None, 2))  # rows differ between workers by design
    traced = BatchAgreement({"call": "batch_reduce", "tensors": (("dense", "float32", (None, 3)),
                                                                 sparse)})
    known = BatchAgreement({"call": "batch_reduce", "tensors": (("dense", "float32", (5, 3)),
                                                                sparse)})
    assert traced.open == [0] and known.open == [] and known.fixed is not None
    assert traced.signature({0: (5, 3)}).digest == known.signature().digest
    assert traced.signature({0: (4, 3)}).digest != known.signature().digest


# --- which workers take part ------------------------------------------------------------------

def test_open_communicator_accepts_the_documented_values(monkeypatch):
    assert open_communicator(None) is None
    assert collectives.run(lambda comm: open_communicator(comm) is comm, 2) == [True, True]
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(name, raising=False)
    assert open_communicator("auto", auto=True) is None  # not launched by mpiexec: one worker
    assert launched_world_size({"PMI_SIZE": "4"}) == 4 and launched_world_size({}) == 1
    with pytest.raises(ValueError, match="communicator='auto' is not a known name; pass a "
                                         "collectives.Communicator, 'mpi'"):
        open_communicator("auto")
    with pytest.raises(ValueError, match="'mpl'"):
        open_communicator("mpl", auto=True)
    with pytest.raises(TypeError, match="communicator=3 is a int; pass a collectives.Communicator"):
        open_communicator(3)
    # (a bad timeout raised only where mpiexec launched more than one worker)
    with pytest.raises(TypeError, match="timeout='x' must be a number of seconds"):
        open_communicator("auto", auto=True, timeout="x")
    with pytest.raises(ValueError, match="timeout=-1 must be a positive number"):
        open_communicator(None, timeout=-1)
    # (a timeout beside a Communicator was ignored: its own, maybe 300 s, applied)
    with pytest.raises(ValueError, match=r"timeout=3 applies to a communicator this opens.*"
                                         r"keeps its own \(init\(timeout=\.\.\.\)\)"):
        collectives.run(lambda comm: open_communicator(comm, timeout=3), 2)


# --- TensorFlow, one process per configuration --------------------------------------------------

def run_scenario(args: list[str], timeout: float = 280, launcher: list[str] | None = None) -> dict:
    """Run a scenario script; fail with its failures (or its output when it gives no report)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    command = [*(launcher or []), sys.executable, *args]
    proc = subprocess.run(command, cwd=SCENARIOS, env=env, capture_output=True, text=True,
                          timeout=timeout)
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if not reports:
        pytest.fail(f"{' '.join(command)} exited {proc.returncode} without a report:\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    failed = [f for r in reports for f in r["failed"]]
    assert not failed, "\n".join(f"{f['name']}: {f['error']}\n{f['traceback']}" for f in failed)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return reports[0]


# One process for every device count: it splits the CPU into 4 logical devices and runs the
# 2- and 3-device suites on the first 2 and 3 of them (the checks use only the devices they
# are given), so TensorFlow and Keras start once (about 9 s of CPU each time) instead of three
# times, and the checks that do not depend on the device count run once.

@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    """Also saves TensorFlow's 4-device Keras weights, which the MPI test must reproduce."""
    path = tmp_path_factory.mktemp("tf") / "reference.npz"
    report = run_scenario(["run.py", "4", "fixtures", "fixtures@2", "fixtures@3", "keras-quick@3",
                           "threads", "keras", "device", "--save-reference", str(path)],
                          timeout=600)
    return report, path


def _names(report, prefix: str) -> list[str]:
    return [n for n in report["passed"] if n.startswith(prefix)]


@needs_tf
@pytest.mark.slow
def test_fixtures_one_and_two_devices(four_devices):
    report, _ = four_devices
    assert _names(report, "NcclAllReduce k=1 ") and _names(report, "NcclAllReduce k=2 ")
    assert "results stay valid k=2" in report["passed"]


@needs_tf
@pytest.mark.slow
def test_fixtures_three_devices(four_devices):
    report, _ = four_devices
    assert _names(report, "HierarchicalCopyAllReduce k=3 ")
    assert "strategy paths k=3" in report["passed"]


@needs_tf
@pytest.mark.slow
def test_keras_fit_three_devices(four_devices):
    report, _ = four_devices
    assert "k=3 fit HierarchicalCopyAllReduce" in report["passed"]
    assert "k=3 custom loop HierarchicalCopyAllReduce" in report["passed"]


@needs_tf
@pytest.mark.slow
def test_fixtures_four_devices(four_devices):
    report, _ = four_devices
    assert _names(report, "MultiWorkerAllReduce k=4 tf.function")
    for name in ("errors and edges", "memory over 200 varying sizes", "replicas that disagree",
                 "hierarchical copy, odd counts", "under XLA"):  # once in the process
        assert report["passed"].count(name) == 1, name


@needs_tf
@pytest.mark.slow
def test_keras_fit_four_devices(four_devices):
    report, _ = four_devices
    assert len(_names(report, "fit ")) == 8 and "custom loop CrossDeviceOps('ring')" in report["passed"]


@needs_tf
@pytest.mark.slow
def test_multi_worker_threads(four_devices):
    report, _ = four_devices
    assert len(_names(report, "threads: ")) == 8


@needs_tf
@pytest.mark.slow
def test_device_path_on_logical_cpus(four_devices):
    """The device path (GPU tensors' route) with the NumPy kit: TensorFlow's fixtures for 13
    classes, graph ops, unknown shapes, replica context, Keras fit, two workers."""
    report, _ = four_devices
    names = _names(report, "device path: ")
    assert len(names) == 13 * 4 + 6, names
    assert "device path: workers" in names and "device path: keras" in names


@needs_tf
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or find_mpiexec() is None,
                    reason="needs mpi4py and mpiexec")
def test_multi_worker_mpi(four_devices, tmp_path):
    _, reference = four_devices
    prefix = tmp_path / "weights"
    run_scenario(["multi_worker_mpi.py", str(reference), str(prefix)],
                 launcher=[find_mpiexec(), "-n", "2"])
    data = np.load(reference)
    count = int(data["count"])
    want = [data[f"arr_{i}"] for i in range(count, 2 * count)]
    ranks = [np.load(f"{prefix}.{r}.npz") for r in range(2)]
    workers = [[r[f"arr_{i}"] for i in range(count)] for r in ranks]
    for a, b in zip(*workers):
        assert a.tobytes() == b.tobytes()  # identical on every worker
    for got, ref in zip(workers[0], want):
        assert np.max(np.abs(got - ref)) <= 1e-5 * np.max(np.abs(ref))
