"""The CPU benchmark scripts in ``benchmarks/`` still run against the library's current API.

Nothing else imports these scripts, so a renamed or removed attribute in the library breaks them
without any other test noticing. Each case runs one script as a real subprocess
(``sys.executable``, from the repository root) with the smallest arguments that still take its
real code path (2 devices or ranks, 4-8 KiB, one repeat), and checks that it exits with 0 and
prints the table or rows a working run prints. The scripts without TensorFlow run each in a
process forked from one that has already imported NumPy and the library (conftest's ``forks``:
about 0.5 s of CPU less each). The TensorFlow scripts that split the CPU into
the same logical devices run one after another in one such process (``tests/run_scripts.py``:
each as ``__main__``, in a fresh namespace, its own output and exit status), so that
TensorFlow starts once for them, not once each (about 6 s of CPU a start).

Left out: ``lab.py``, ``multihost_compare.py``, ``gpu_compare.py``, ``gpu_run.sh`` and
``tf_gpu_compare.py`` (a GPU, root or a lab of hosts: tests/gpu and tests/multihost cover them),
and ``plans.py --old`` (it needs an old commit in the git history).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import as_text, tf_lean

pytestmark = pytest.mark.slow  # every benchmark script end to end: left out of the quick subset

ROOT = Path(__file__).resolve().parent.parent
# mpi_compare.py launches the mpiexec beside this Python and no other.
MPIEXEC = Path(sys.executable).parent / "mpiexec"
RUN_SCRIPTS = ROOT / "tests" / "run_scripts.py"

# mirror.py is a module with no entry point (overhead.py imports it): the smallest real use is
# a communicator over it, one call per algorithm.
MIRROR = """
import sys
sys.path.insert(0, "benchmarks")
import numpy as np
from mirror import MirrorTransport
from collectives.api.communicator import Communicator
for alg in ("auto", "one_device", "ring", "rechd", "tree", "shuffle"):
    comm = Communicator(MirrorTransport(1, 4))
    comm.all_reduce(np.arange(8, dtype=np.float32), "sum", alg)
    assert alg == "auto" or comm.last_algorithm == alg, (alg, comm.last_algorithm)
    print("mirror", alg, "ran", comm.last_algorithm)
"""


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # after sys.executable; "{tmp}" becomes the test's tmp_path
    expect: tuple[str, ...]  # regular expressions that must all match stdout + stderr
    needs: tuple[str, ...] = ()  # optional modules; the case skips where one is missing
    timeout: float = 60
    together: str = ""  # cases with the same value share one process (the same TF devices)


CASES = [
    Case("ceiling", ("benchmarks/ceiling.py", "-p", "2", "-b", "4K", "-e", "8K", "-r", "1",
                     "--json", "{tmp}/ceiling.json"),
         (r"copy 1T +copy 2T", r"all-reduce lower bound, 2 devices", r"\n +8192 +32768 ")),
    # TensorFlow stays out (--no-tf) so that this case needs nothing optional; the tf_worker
    # case below runs the same script with TensorFlow.
    Case("compare_multidevice",
         ("benchmarks/compare_multidevice.py", "-p", "2", "-b", "4K", "-e", "8K", "-r", "1", "-w",
          "1", "--no-tf", "--json", "{tmp}/cm.json", "--markdown", "{tmp}/cm.md"),
         (r"\| 4 KiB \|", r"\| 8 KiB \|", r"auto shared", r"Wrong output elements over all cells: 0\.")),
    Case("compression_error", ("benchmarks/compression_error.py", "-n", "4K", "-p", "2", "3"),
         (r"\| float32 \| 3 \| mean \| [0-9.e-]+ \([0-9.e-]+\) \| [0-9.e-]+ ",
          r"\| float64 \| 2 \| sum \|")),
    Case("hotspots", ("benchmarks/hotspots.py", "-r", "1"),
         (r"\| ring \(ring\) \| 16 \|", r"faults / call", r"\| 16 MiB \|")),
    Case("mirror", ("-c", MIRROR), (r"mirror shuffle ran shuffle",)),
    # torch is no dependency of the library: --no-gloo leaves its rows out (the script still
    # tries `import torch`, and carries on without it). -m keeps the rows checked (and the
    # calibrated auto, the unchecked one, no out=, the bounds): every other schedule, native
    # and shm call the same all_reduce as shuffle does, 1,000 calls each at 4 KiB.
    Case("mpi_compare", ("benchmarks/mpi_compare.py", "-p", "2", "-s", "4K", "-r", "1",
                         "--no-gloo", "-m", "auto", "prepared", "shuffle",
                         "--json", "{tmp}/mpi.json"),
         (r"\| mpi4py Allreduce \| [0-9.]+ µs", r"\| collectives auto \| [0-9.]+ µs",
          r"\| collectives prepared \| [0-9.]+ µs", r"\| collectives shuffle \| [0-9.]+ µs"),
         needs=("mpi4py", "mpiexec")),
    Case("mpi_hot_path", ("benchmarks/mpi_hot_path.py", "-s", "4K", "-n", "200", "-r", "1"),
         (r"mpi4py Allreduce +[0-9.]+", r"prepared start\(\)\.wait\(\) +[0-9.]+",
          r"\d+ Python-level function calls per call"),
         needs=("mpi4py", "mpiexec")),
    # --thread-calls 10 is the least that leaves the ring at 64 thread ranks one timed call.
    # --warmup 2: the first call agrees the signature, the second runs as every later one.
    # one host, no lab: the lab's layouts need root and namespaces (tests/test_multihost.py)
    Case("mpi_gradients", ("benchmarks/mpi_gradients.py", "-p", "2", "-r", "1", "--scale", "0.01",
                           "--json", "{tmp}/gradients.json"),
         (r"161 tensors", r"library batch_all_reduce \(fused, defaults\) +[0-9.]+ ms",
          r"library buckets \(ready one by one\) +[0-9.]+ ms", r"mpi4py flattened +[0-9.]+ ms"),
         needs=("mpi4py", "mpiexec")),
    Case("model_check", ("benchmarks/model_check.py", "--local", "2", "-s", "4K", "-r", "1"),
         (r"\| ring \| [0-9.]+ [nµm]?s / [0-9.]+ [nµm]?s", r"median prediction error \(schedules\)",
          r"resolved cells: \d+ of \d+ \(\d+%\); of those, the model's pick measured within 10%"),
         needs=("mpi4py", "mpiexec"), timeout=180),
    Case("overhead", ("benchmarks/overhead.py", "-r", "1", "--calls", "20", "--thread-calls", "10",
                      "--warmup", "2"),
         (r"Core alone \(mirror transport", r"Fit over the one-message-per-round rows",
          r"Thread ranks \(`collectives.run`\)", r"\| ring \(ring\) \| 64 \|",
          r"One plan, several buffer lengths"),
         timeout=180),
    Case("plans", ("benchmarks/plans.py", "-r", "1", "ring:8", "rechd:8", "tree:8", "shuffle:8",
                   "ring/ring:8:4", "--json", "{tmp}/plans.json"),
         (r"\| ring:8 \| 14 \(14\) \|", r"\| shuffle:8 \|", r"\| ring/ring:8:4 \|",
          r"building the `Layout` of 2 groups")),
    Case("scale", ("benchmarks/scale.py", "--clusters", "cpu", "-n", "64", "-s", "4K",
                   "--compare", "4K", "--classic"),
         (r"\| 64 \(4x16\) \| \w+ [0-9.]+ \|", r"\| 5 nodes x 8 H100", r"classic formula / model")),
    Case("tf_anchor", ("benchmarks/tf_anchor.py", "-p", "2", "-b", "4K", "-e", "4K", "-w", "1",
                       "-r", "1"),
         (r"2 logical CPU devices", r"sum +tf_r2od +tf_r2od ", r"sum +tf_r2od_batch ",
          r"sum +tf_add_n "),
         needs=("tensorflow",), timeout=120, together="tf, 2 devices"),
    # The 64 MiB workload is the smaller of the two; three methods (TF's own, a schedule and
    # auto) in both modes keep it to a few seconds. The script exits 1 on a wrong result.
    Case("tf_compare", ("benchmarks/tf_compare.py", "-p", "2", "-r", "1", "-w", "1",
                        "--workloads", "64MiB", "--methods", "tf_rtod,ring,auto"),
         (r"\*\*64MiB\*\*", r"\| tf_rtod \| [0-9.]+ \|", r"\| ring \| [0-9.]+ \|",
          r"\| auto \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|"),
         needs=("tensorflow",), timeout=120, together="tf, 2 devices"),
    Case("tf_kernels", ("benchmarks/tf_kernels.py", "-p", "2", "-r", "1"),
         (r"\| eager \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|", r"\| function \| [0-9.]+ \|"),
         needs=("tensorflow",), timeout=120, together="tf, 2 devices"),
    # tf_worker.py answers compare_multidevice.py over a pipe; run it the way it is used. The TF
    # columns hold numbers (the target verdict is met or missed, not n/a) only if it answered.
    Case("tf_worker", ("benchmarks/compare_multidevice.py", "-p", "2", "-b", "4K", "-e", "4K",
                       "-r", "1", "-w", "1", "--json", "{tmp}/cm_tf.json"),
         (r"TensorFlow \d+\.\d+", r"\| 4 KiB \| [0-9.]+ \| (met|\*\*missed\*\*) \|",
          r"Wrong output elements over all cells: 0\."),
         needs=("tensorflow",), timeout=120),
]


def missing(needs: tuple[str, ...]) -> list[str]:
    out = []
    for name in needs:
        if name == "mpiexec":
            if not MPIEXEC.exists():
                out.append(f"mpiexec beside {sys.executable}")
        elif importlib.util.find_spec(name) is None:
            out.append(name)
    return out


def environment(case: Case) -> dict:
    # TensorFlow's C++ logging would drown the output in the failure message.
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if "tensorflow" in case.needs:  # the scripts use neither JAX nor matplotlib
        env = tf_lean(env)
    return env


def argv_of(case: Case, tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in case.argv]


@pytest.fixture(scope="module")
def together(request, tmp_path_factory):
    """The output of each case that shares a process, by case id: every selected case of its
    group run in one process when the first of them asks."""
    selected = {item.name for item in request.session.items}
    done: dict[str, tuple[int, str]] = {}

    def output(case: Case) -> tuple[int, str]:
        if case.id not in done:
            group = [c for c in CASES if c.together == case.together and
                     (f"test_benchmark_script_runs[{c.id}]" in selected or c is case)]
            folder = tmp_path_factory.mktemp("together")
            plan = [{"label": c.id, "script": str(ROOT / c.argv[0]),
                     "argv": argv_of(c, folder / c.id)[1:], "cwd": str(ROOT)} for c in group]
            for c in group:
                (folder / c.id).mkdir()
            (folder / "plan.json").write_text(json.dumps(plan))
            proc = subprocess.run([sys.executable, str(RUN_SCRIPTS), str(folder / "plan.json"),
                                   str(folder)], cwd=ROOT, env=environment(case),
                                  capture_output=True, text=True,
                                  timeout=sum(c.timeout for c in group))
            for c in group:
                status = folder / f"{c.id}.status"
                done[c.id] = ((int(status.read_text()), (folder / f"{c.id}.out").read_text() +
                               (folder / f"{c.id}.err").read_text()) if status.exists() else
                              (-1, f"the shared process ended (exit {proc.returncode}) before "
                                   f"this case finished:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"))
        return done[case.id]

    return output


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_benchmark_script_runs(case: Case, tmp_path: Path, together, forks) -> None:
    lacking = missing(case.needs)
    if lacking:
        pytest.skip(f"{case.id} needs {', '.join(lacking)}")
    if case.together:
        returncode, output = together(case)
    elif "tensorflow" not in case.needs:  # forked from a process that has imported the library
        returncode, out, err = forks.run(argv_of(case, tmp_path), cwd=ROOT, env=environment(case),
                                         timeout=case.timeout)
        output = as_text(out) + as_text(err)
    else:
        proc = subprocess.run([sys.executable, *argv_of(case, tmp_path)], cwd=ROOT,
                              env=environment(case), capture_output=True, text=True,
                              timeout=case.timeout)
        returncode, output = proc.returncode, proc.stdout + proc.stderr
    assert returncode == 0, f"exit status {returncode}\n{output[-4000:]}"
    for pattern in case.expect:
        assert re.search(pattern, output), f"{pattern!r} not in the output:\n{output[-4000:]}"
