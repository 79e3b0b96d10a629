"""The pytest side of the fault suite: launch batches of cases, collect and judge each case.

One launch runs many cases (an MPI launch costs about a second; one runs at most
``MPI_CASES_PER_LAUNCH``, for MPI's communicator contexts); ``faults.worker`` writes each
rank's records. A case whose records are missing hung or crashed its batch: it fails with the
batch's output, and a new batch starts after it. Each (transport, size) batch runs once per
session, two at a time in the background (most of a batch is ranks waiting out timeouts), and
each case is then its own pytest item at no extra cost.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from faults.kit import Case
from faults.table import cases_for

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
WORKER = Path(__file__).resolve().parent / "worker.py"


def find_mpiexec() -> str | None:
    """``mpiexec`` next to this Python (a venv's MPICH wheel), else on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


MPIEXEC = find_mpiexec()
HAVE_MPI = importlib.util.find_spec("mpi4py") is not None and MPIEXEC is not None


@dataclass
class Report:
    """What came back for one case: each rank's step records, or why nothing did."""

    records: dict[int, list] = field(default_factory=dict)
    seconds: float = 0.0
    lost: str | None = None  # the batch hung or crashed in this case


# The environment as the suite started, read once here: batches launch from threads, and
# reading os.environ there races pytest, which sets PYTEST_CURRENT_TEST for every test
_STARTED_WITH = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def environment(transport: str) -> dict:
    env = {k: v for k, v in _STARTED_WITH.items() if k != "COLLECTIVES_RANKS_PER_NODE"}
    env.update({"PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), "OMP_NUM_THREADS": "1"})
    if transport == "mpi-nodes":
        env["COLLECTIVES_RANKS_PER_NODE"] = "2"
    return env


_LIVE: set[subprocess.Popen] = set()  # launches in progress, ended by ``stop``
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


def launch(transport: str, size: int, cases: list[Case], outdir: Path):
    command = [sys.executable, str(WORKER), transport, str(size), str(outdir),
               *[c.name for c in cases]]
    if transport.startswith("mpi"):
        command = [MPIEXEC, "-n", str(size), *command]
    budget = sum(c.limit for c in cases) + 60
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environment(transport), cwd=ROOT)
    with _LIVE_LOCK:
        _LIVE.add(proc)
    try:
        out, err = proc.communicate(timeout=budget)
    except subprocess.TimeoutExpired:  # the watchdogs failed too: report what came
        _end(proc)
        out, err = proc.communicate()
        err += f"\nthe whole batch ran past {budget:.0f} s"
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM first: mpiexec passes it on to its ranks and cleans up; then SIGKILL."""
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()


def stop() -> None:
    """Start no more batches, and end the launches still running (the session is over, e.g.
    after ``-x`` or Ctrl-C)."""
    _STOPPING.set()
    _POOL.shutdown(wait=False, cancel_futures=True)
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        _end(proc)


def read(outdir: Path) -> tuple[dict, dict]:
    """(records by case and rank, ranks that began each case) from every rank's file."""
    records: dict[str, dict[int, dict]] = {}
    begun: dict[str, set[int]] = {}
    for path in outdir.glob("rank*.jsonl"):
        rank = int(path.stem[4:])
        for line in path.read_text().splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:  # the last line of a process killed while writing
                continue
            if "begin" in item:
                begun.setdefault(item["begin"], set()).add(rank)
            else:
                records.setdefault(item["case"], {})[item["rank"]] = item
    return records, begun


# cases per MPI launch: a case whose call failed keeps its transport's communicators (messages
# of the failed call may still arrive), and a process has 2048 communicator contexts in all
# (MPICH: "Too many communicators" once a batch of 338 cases had run out of them)
MPI_CASES_PER_LAUNCH = 120


def run_batch(transport: str, size: int, cases: list[Case]) -> dict[str, Report]:
    ranks = 1 if transport == "multi" else size
    reports: dict[str, Report] = {}
    pending = list(cases)
    while pending and not _STOPPING.is_set():
        chunk = pending[:MPI_CASES_PER_LAUNCH] if transport.startswith("mpi") else pending
        with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
            proc = launch(transport, size, chunk, Path(tmp))
            records, begun = read(Path(tmp))
        output = (proc.stdout + proc.stderr)[-5000:]
        for i, case in enumerate(chunk):
            got = records.get(case.name, {})
            if len(got) == ranks:
                reports[case.name] = Report({r: got[r]["steps"] for r in got},
                                            max(item["seconds"] for item in got.values()))
                continue
            if case.name not in begun:  # the launch died before this case: the rest of its
                for rest in chunk[i:]:    # chunk is lost; a later chunk launches anew
                    reports[rest.name] = Report(lost=f"the batch ended (exit {proc.returncode}) "
                                                     f"before this case began:\n{output}")
                pending = pending[len(chunk):]
                break
            silent = sorted(set(range(ranks)) - set(got))
            reports[case.name] = Report(lost=f"rank(s) {silent} never finished: a hang past the "
                                             f"{case.limit:g} s limit or a crash (exit "
                                             f"{proc.returncode}):\n{output}")
            pending = pending[i + 1:]
            break
        else:
            pending = pending[len(chunk):]
    return reports


_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fault-batch")
_BATCHES: dict[tuple[str, int], Future] = {}
_SELECTED: dict[tuple[str, int], list[str]] = {}


def start(selected: dict[tuple[str, int], list[str]]) -> None:
    """Launch a batch per (transport, size) in the background, in order, with only the named
    cases (the ones pytest selected)."""
    for key, names in selected.items():
        if key not in _BATCHES:
            cases = [c for c in cases_for(*key) if c.name in set(names)]
            _BATCHES[key] = _POOL.submit(run_batch, *key, cases)


def report(transport: str, size: int, name: str) -> Report:
    """The case's report, waiting for its batch. The first report a process asks for starts
    every batch selected (``select``); a batch nobody selected is launched now, whole."""
    start(_SELECTED)
    start({(transport, size): [c.name for c in cases_for(transport, size)]})
    return _BATCHES[(transport, size)].result()[name]


def select(selected: dict[tuple[str, int], list[str]]) -> None:
    """The cases pytest selected, by batch: started at the first report, in the one process
    that runs them (under pytest-xdist every worker collects them all, and only one of them
    runs a module's tests)."""
    _SELECTED.update(selected)


def judge(case: Case, rep: Report) -> list[str]:
    """Everything wrong with a case: each rank's own verdicts, missing steps, and results
    that differ between ranks."""
    if rep.lost:
        return [rep.lost]
    problems = []
    failed: set[int] = set()
    for k in range(len(case.steps)):
        digests = {}
        for rank, steps in sorted(rep.records.items()):
            if steps is None:
                problems.append(f"rank {rank} reported nothing")
                failed.add(rank)
                continue
            rec = steps[k]
            if rank in failed or rec["kind"] == "absent":
                continue
            if rec["kind"] == "skipped":
                problems.append(f"step {k}, rank {rank}: never ran (an earlier error ended it)")
                failed.add(rank)
                continue
            for p in rec["problems"]:
                problems.append(f"step {k}, rank {rank}: {p}")
                failed.add(rank)
            if rec["kind"] == "result" and rec["same"]:
                digests[rank] = rec["digest"]
        if len(set(digests.values())) > 1:
            problems.append(f"step {k}: ranks returned different bits: {digests}")
    return problems
