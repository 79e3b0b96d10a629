"""Shared test helpers: the parameter axes and assertions. Exact inputs and the float64
reference come from ``collectives.tools.reference`` (re-exported here for the test modules)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from run_scripts import Forks

from collectives.ops import ReduceOp, check_dtype, supported_dtypes
from collectives.tools.reference import exact_inputs, reference

__all__ = ["exact_inputs", "reference"]  # re-exported: the test modules import them from here

ALGORITHMS = ["one_device", "ring", "rechd", "tree", "shuffle", "auto"]
TF_NAMES = ["xring", "pscpu", "psgpu", "nccl"]
TWO_LEVEL = ["pscpu/pscpu", "nccl/xring", "nccl/rechd", "nccl/pscpu", "tree/ring", "rechd/tree"]
RANKS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16]
OPS = list(ReduceOp)
DTYPES = supported_dtypes()
SIZES = [0, 1, 7, 1000]


def find_mpiexec() -> str | None:
    """``mpiexec`` next to this Python (a venv's MPICH wheel), else on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def tf_lean(env: dict) -> dict:
    """``env`` with ``tests/tf_lean`` first on ``PYTHONPATH``: its sitecustomize hides JAX and
    matplotlib from a process that imports TensorFlow and uses neither."""
    path = os.pathsep.join(p for p in (str(Path(__file__).parent / "tf_lean"),
                                       env.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path}


def combos(dtypes=DTYPES, ops=OPS):
    """Every (dtype, op) pair the library accepts."""
    out = []
    for dtype in dtypes:
        for op in ops:
            try:
                check_dtype(op, dtype)
            except TypeError:
                continue
            out.append((np.dtype(dtype), op))
    return out


def assert_reduced(result: np.ndarray, expected: np.ndarray, op: ReduceOp) -> None:
    assert result.dtype == expected.dtype, (result.dtype, expected.dtype)
    assert result.shape == expected.shape, (result.shape, expected.shape)
    if op is ReduceOp.MEAN and expected.dtype.kind in "fc":
        # one correctly rounded division of an exact sum (float16/bfloat16 may round twice)
        tol = 1e-2 if expected.dtype.itemsize <= 2 else 1e-6
        np.testing.assert_allclose(result.astype(np.complex128), expected.astype(np.complex128),
                                   rtol=tol, atol=0)
    elif not np.array_equal(result, expected):  # (the quick test first: most calls pass)
        np.testing.assert_array_equal(result, expected)  # NaN equals NaN here; else it says where


def assert_identical(results: list[np.ndarray]) -> None:
    """Bitwise identical across participants: the same dtype, shape and bits."""
    first = results[0]
    first_bits = np.ascontiguousarray(first).view(np.uint8)
    for r in results[1:]:
        assert (r.dtype, r.shape) == (first.dtype, first.shape), (r.dtype, r.shape, first.dtype,
                                                                  first.shape)
        assert np.array_equal(np.ascontiguousarray(r).view(np.uint8), first_bits)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def record(tmp_path):
    """Record a timeline into tmp_path/timeline while the test runs; yields that folder."""
    from collectives import timeline

    folder = tmp_path / "timeline"
    timeline.start(folder)
    try:
        yield folder
    finally:
        timeline.stop()


# --- commands in processes forked from one that has imported the library ---------------------
# Many tests run ``collectives ...`` as a user would, each in a process of its own; most of such
# a process's CPU (0.5 s) is its imports. ``python`` runs them forked from one process that has
# imported those (tests/run_scripts.py --serve), with everything each one's checks read (exit
# status, stdout, stderr, files) as before. Checks of what a fresh interpreter imports, of
# signals, pipes and resource limits, of packaging, keep a fresh process of their own.
CLI_IMPORTS = ("numpy,collectives,collectives.tools.bench,collectives.tools.probe,"
               "collectives.tools.simulate,collectives.timeline.command")  # all cli.py imports


def as_text(data: bytes) -> str:
    """Bytes a process wrote, as ``subprocess.run(..., text=True)`` gives them."""
    return io.TextIOWrapper(io.BytesIO(data)).read()


@pytest.fixture(scope="session")
def forks(tmp_path_factory):
    """A process that has imported NumPy and what ``collectives.tools.cli`` imports, forking
    one child per command (one for all the modules a worker runs)."""
    with Forks(tmp_path_factory.mktemp("forks"), CLI_IMPORTS) as forks:
        yield forks


@pytest.fixture
def python(forks):
    """``subprocess.run([sys.executable, "-c" or "-m", ...], capture_output=True, text=True)``,
    in a process forked from ``forks``; ``blocked``: modules the command makes fail to import
    (it must not find them imported: forked from a bare process where ``forks`` has them)."""
    def run(*argv: str, blocked: tuple[str, ...] = (), cwd=None, env=None,
            timeout: float = 60) -> subprocess.CompletedProcess:
        status, out, err = forks.run(argv, cwd=cwd, env=env, timeout=timeout, unloaded=blocked)
        return subprocess.CompletedProcess([sys.executable, *argv], status, as_text(out),
                                           as_text(err))
    return run


# --- scheduling: the longest modules start first ------------------------------------------------
# A module's tests stay on one worker (``--dist loadscope``), and a worker that starts a long
# module last keeps the run going after the others have finished (mypy's 16 s over the
# package, left to the end, ran alone on one core). These start first, in this order (their
# share of the suite's time, most first); the rest, none over about 10 s, follow in
# collection order. test_tensorflow_docs.py waits for a free worker: in a fresh venv the first
# import of TensorFlow compiles its modules (17.5 s of CPU, 6.1 s once compiled), and started
# beside test_tensorflow.py's scenario process it compiled them a second time.
LONG_MODULES = ("test_tensorflow.py", "test_mpi.py", "test_benchmark_scripts.py",
                "test_tensorflow_docs.py", "test_multi_device.py", "test_suite_threads.py",
                "test_fault_cases.py", "test_plans.py", "test_docs.py", "test_multihost.py",
                "test_simulate_scale.py", "test_cli.py", "test_torch_ddp.py", "test_timeline.py",
                "test_bench.py", "test_typing.py", "test_train_step_script.py", "test_torch.py",
                "test_user_typing.py", "test_fault_commands.py", "test_jax_arrays.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_MODULES)))  # (stable)


def pytest_sessionfinish(session, exitstatus):
    """Remove the shared-memory segments of MPI jobs the suite ended on purpose.

    A rank killed (or ended by the hang guard) before MPICH unlinks its segment leaves it in
    ``/dev/shm``: RAM held until the machine restarts (a few MiB a job, gigabytes over many
    runs). A live job's segment is mapped by its ranks; one no process maps, a minute old or
    more, belongs to no job (run in the controller only, once the workers have ended)."""
    if hasattr(session.config, "workerinput") or not os.path.isdir("/dev/shm"):
        return
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped.update(line.split()[-1] for line in maps.read_text().splitlines()
                          if "/dev/shm/mpich_shm" in line)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    for segment in Path("/dev/shm").glob("mpich_shm_*"):
        try:
            stat = segment.stat()  # (this user's alone: another's maps are not ours to read)
            if (str(segment) not in mapped and stat.st_uid == os.getuid()
                    and stat.st_mtime < time.time() - 60):
                segment.unlink()
        except OSError:
            continue
