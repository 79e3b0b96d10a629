"""The TensorFlow adapter: host-side reductions in process, TensorFlow checks in subprocesses.

TensorFlow can split the CPU into logical devices only once per process, so every
TensorFlow configuration runs as a script of ``tests/tf_scenarios/`` in its own process (the
multi-worker one under ``mpiexec -n 2``); each prints a JSON report as its last line. The
NumPy side of the adapter (``collectives.adapters.tensorflow.host``) needs no TensorFlow and is
tested here directly against the core.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from collectives.adapters.tensorflow import host

import collectives
from collectives.spec import parse_spec

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


# One process per device count; several suites share it (TensorFlow imports once).

@pytest.fixture(scope="module")
def two_devices():
    return run_scenario(["run.py", "2", "fixtures"])


@pytest.fixture(scope="module")
def three_devices():
    return run_scenario(["run.py", "3", "fixtures", "keras-quick"])


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    """Also saves TensorFlow's 4-device Keras weights, which the MPI test must reproduce."""
    path = tmp_path_factory.mktemp("tf") / "reference.npz"
    report = run_scenario(["run.py", "4", "fixtures", "threads", "keras",
                           "--save-reference", str(path)])
    return report, path


def _names(report, prefix: str) -> list[str]:
    return [n for n in report["passed"] if n.startswith(prefix)]


@needs_tf
@pytest.mark.slow
def test_fixtures_one_and_two_devices(two_devices):
    assert _names(two_devices, "NcclAllReduce k=1 ") and _names(two_devices, "NcclAllReduce k=2 ")
    assert "errors and edges" in two_devices["passed"]


@needs_tf
@pytest.mark.slow
def test_fixtures_three_devices(three_devices):
    assert _names(three_devices, "HierarchicalCopyAllReduce k=3 ")


@needs_tf
@pytest.mark.slow
def test_keras_fit_three_devices(three_devices):
    assert "fit HierarchicalCopyAllReduce" in three_devices["passed"]


@needs_tf
@pytest.mark.slow
def test_fixtures_four_devices(four_devices):
    report, _ = four_devices
    assert _names(report, "MultiWorkerAllReduce k=4 tf.function")


@needs_tf
@pytest.mark.slow
def test_keras_fit_four_devices(four_devices):
    report, _ = four_devices
    assert len(_names(report, "fit ")) == 8 and "custom loop CrossDeviceOps('ring')" in report["passed"]


@needs_tf
@pytest.mark.slow
def test_multi_worker_threads(four_devices):
    report, _ = four_devices
    assert len(_names(report, "threads: ")) == 5


def _mpiexec() -> str | None:
    found = Path(sys.executable).parent / "mpiexec"
    if found.exists():
        return str(found)
    return shutil.which("mpiexec")


@needs_tf
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or _mpiexec() is None,
                    reason="needs mpi4py and mpiexec")
def test_multi_worker_mpi(four_devices, tmp_path):
    _, reference = four_devices
    prefix = tmp_path / "weights"
    run_scenario(["multi_worker_mpi.py", str(reference), str(prefix)],
                 launcher=[_mpiexec(), "-n", "2"])
    data = np.load(reference)
    count = int(data["count"])
    want = [data[f"arr_{i}"] for i in range(count, 2 * count)]
    ranks = [np.load(f"{prefix}.{r}.npz") for r in range(2)]
    workers = [[r[f"arr_{i}"] for i in range(count)] for r in ranks]
    for a, b in zip(*workers):
        assert a.tobytes() == b.tobytes()  # identical on every worker
    for got, ref in zip(workers[0], want):
        assert np.max(np.abs(got - ref)) <= 1e-5 * np.max(np.abs(ref))
