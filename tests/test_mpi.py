"""The MPI transport: real ranks under ``mpiexec`` (no mocks), plus its pure parts.

Each scenario script in ``tests/mpi_scenarios/`` runs under ``mpiexec -n N`` and checks itself
(rank 0 prints a ``SUMMARY`` line; a failure exits non-zero). Skipped, with the reason, where
mpi4py or an ``mpiexec`` is missing. The correctness matrix's body (``body.py``) also runs
here on thread ranks, so both transports answer to the same checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from collectives.backends import mpi
from collectives.backends.mpi import rider, tags, tuning
from conftest import find_mpiexec

import collectives
from collectives import timeline as tl
from collectives.algorithms.schedule import Collective
from collectives.ops import ReduceOp
from collectives.runtime import hang_guard

SCENARIOS = Path(__file__).parent / "mpi_scenarios"
ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(SCENARIOS))
import body  # noqa: E402

pytestmark = pytest.mark.slow  # MPI launches: left out of the quick subset


MPIEXEC = find_mpiexec()
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None
needs_mpi = pytest.mark.skipif(
    not HAVE_MPI4PY or MPIEXEC is None,
    reason="needs mpi4py and an mpiexec (pip install -e '.[mpi]' installs both)"
    if not HAVE_MPI4PY else "no mpiexec next to sys.executable or on PATH")


def launch(script: str, n: int, *args: str, env: dict | None = None, flags: tuple = (),
           timeout: float = 240) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != mpi.ENV_RANKS_PER_NODE}
    full_env.update({"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})})
    cmd = [MPIEXEC, *flags, "-n", str(n), sys.executable, str(SCENARIOS / script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=ROOT)


def assert_passed(proc: subprocess.CompletedProcess, name: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-6000:]}"
    assert f"SUMMARY {name} PASS" in out, out[-6000:]
    return out


# --- scenarios that share a job ------------------------------------------------------------------
# Each launch pays for a job of its own on every rank (Python with NumPy, mpi4py and the library
# imported, MPI started: about 0.7 s of CPU per rank, more where ranks outnumber the cores), so
# the scenarios that need nothing of a fresh process run one after another in one job per rank
# count (``several.py``); each test still judges its own scenario's output (its own SUMMARY, the
# lines it prints). Left in jobs of their own: those that end their job (killed ranks, the hang
# guard), pin cores before MPI starts, or switch off the compiled hot path on some rank (that
# would change what the scenarios after them run).


@dataclass(frozen=True)
class Scenario:
    test: str  # the test that judges it (pytest's name, with its parameters)
    script: str
    args: tuple[str, ...] = ()
    ranks_per_node: int | None = None
    cache_dir: bool = False  # a fresh COLLECTIVES_CACHE_DIR of its own


JOBS: dict[str, tuple[int, tuple[Scenario, ...]]] = {
    # (hot.py first: it checks which hot path its ranks found before any other scenario ran)
    "two": (2, (
        Scenario("test_hot_path_compiled_and_in_python[2-none]", "hot.py", ("none",)),
        Scenario("test_matrix[2-None]", "matrix.py"),
        Scenario("test_natives[2]", "natives.py"),
        Scenario("test_async_prepared_and_new_communicators[2]", "async_calls.py"),
        Scenario("test_freed_communicators_leave_nothing_behind[2]", "freeing.py"),
        Scenario("test_calibration_times_mpi_and_auto_weighs_it[2-None]", "calibrated.py",
                 cache_dir=True),
        Scenario("test_mismatch_same_error_everywhere[2]", "mismatch.py"),
        Scenario("test_oversubscribed_node_waits_without_spinning[2-False]", "oversubscribed.py"),
        Scenario("test_timeouts_and_failure_notices[2]", "timeouts.py"),  # (breaks communicators)
    )),
    "three": (3, (
        Scenario("test_matrix[3-None]", "matrix.py"),
        Scenario("test_natives[3]", "natives.py"),
        Scenario("test_freed_communicators_leave_nothing_behind[3]", "freeing.py"),
        Scenario("test_calibration_times_mpi_and_auto_weighs_it[3-None]", "calibrated.py",
                 cache_dir=True),
        Scenario("test_mismatch_same_error_everywhere[3]", "mismatch.py"),
        Scenario("test_oversubscribed_node_waits_without_spinning[3-False]", "oversubscribed.py"),
        Scenario("test_timeouts_and_failure_notices[3]", "timeouts.py"),
    )),
    "four": (4, (
        Scenario("test_matrix[4-None]", "matrix.py"),
        Scenario("test_matrix[4-2]", "matrix.py", ranks_per_node=2),
        Scenario("test_async_prepared_and_new_communicators[4]", "async_calls.py"),
    )),
    # (alone: after the scenarios above in one job, its ranks disagreed on the calibration's
    # host set, a process-wide state of theirs)
    "four, calibrated": (4, (
        Scenario("test_calibration_times_mpi_and_auto_weighs_it[4-2]", "calibrated.py",
                 ranks_per_node=2, cache_dir=True),)),
    "one": (1, (Scenario("test_matrix[1-None]", "matrix.py"),)),
    "hot three, rank 1 in Python": (3, (
        Scenario("test_hot_path_compiled_and_in_python[3-1]", "hot.py", ("1",)),)),
    # (alone: it stops a rank and leaves communicators broken)
    "late peer": (3, (
        Scenario("test_a_late_peers_data_never_lands_in_memory_handed_out_again[3]",
                 "late_peer.py"),)),
    "hot two in Python": (2, (
        Scenario("test_hot_path_compiled_and_in_python[2-all]", "hot.py", ("all",)),)),
}
SHARED_TIMEOUT = 600  # a job runs up to 8 scenarios; the first test to need it waits for all


@dataclass
class Job:
    returncode: int | None
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def section(self, label: str) -> tuple[int | None, str]:
        """The exit code and rank 0's output of one scenario (None: it never finished)."""
        found = re.search(rf"^BEGIN {re.escape(label)}\n(.*?)^END {re.escape(label)} "
                          r"exit=(-?\d+)$", self.stdout, re.S | re.M)
        return (int(found[2]), found[1]) if found else (None, "")


class SharedJobs:
    """The jobs of ``JOBS``, each launched once, when the first of its tests asks, with the
    scenarios whose tests this session runs."""

    def __init__(self, selected: set[str], tmp_path_factory):
        self.selected, self.tmp = selected, tmp_path_factory
        self.done: dict[str, Job] = {}

    def passed(self, test: str, summary: str) -> tuple[str, str]:
        """Run (or look up) the job of ``test``'s scenario; assert it passed; return its own
        output (rank 0's, between its markers) and the whole job's."""
        name = next(k for k, (_, items) in JOBS.items() if any(s.test == test for s in items))
        if name not in self.done:
            self.done[name] = self.launch(*JOBS[name], also=test)
        job = self.done[name]
        code, mine = job.section(test)
        tail = job.output[-6000:]
        assert code is not None, f"never finished (job exit {job.returncode})\n{tail}"
        assert code == 0, f"exit {code}\n{mine[-6000:]}\n--- the job's end ---\n{tail}"
        assert f"SUMMARY {summary} PASS" in mine, f"{mine[-6000:]}\n--- the job's end ---\n{tail}"
        return mine, job.output

    def launch(self, n: int, scenarios: tuple[Scenario, ...], also: str) -> Job:
        plan = []
        for s in scenarios:
            if s.test not in self.selected and s.test != also:
                continue
            env: dict[str, str | None] = {mpi.ENV_RANKS_PER_NODE: None if s.ranks_per_node is None
                                          else str(s.ranks_per_node)}
            if s.cache_dir:
                env["COLLECTIVES_CACHE_DIR"] = str(self.tmp.mktemp("calibration"))
            plan.append({"label": s.test, "script": s.script, "args": list(s.args), "env": env})
        try:
            proc = launch("several.py", n, json.dumps(plan), timeout=SHARED_TIMEOUT - 60)
        except subprocess.TimeoutExpired as exc:
            text = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                    for x in (exc.stdout, exc.stderr)]
            return Job(None, text[0], text[1] + f"\n(killed after {exc.timeout:.0f} s)")
        return Job(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def jobs(request, tmp_path_factory) -> SharedJobs:
    return SharedJobs({item.name for item in request.session.items}, tmp_path_factory)


shared = pytest.mark.timeout(SHARED_TIMEOUT)


# --- real ranks ----------------------------------------------------------------------------------

@needs_mpi
@shared
@pytest.mark.parametrize("n, ranks_per_node", [(1, None), (2, None), (3, None), (4, None), (4, 2)])
def test_matrix(n, ranks_per_node, jobs, request):
    out, _ = jobs.passed(request.node.name, "matrix")
    if ranks_per_node:  # the two-level schedules really crossed the simulated nodes
        assert "groups=((0, 1), (2, 3))" in out, out[-2000:]


@needs_mpi
@shared
@pytest.mark.parametrize("n", [2, 3])
def test_natives(n, jobs, request):
    jobs.passed(request.node.name, "natives")


@needs_mpi
@shared
@pytest.mark.parametrize("n, pure", [(2, "none"), (3, "1"), (2, "all")])
def test_hot_path_compiled_and_in_python(n, pure, jobs, request):
    """The compiled hot path, Python's, and the two mixed across ranks (``pure``: the ranks
    that set COLLECTIVES_PURE_PYTHON=1) give the oracle's result, the same bits everywhere."""
    out, _ = jobs.passed(request.node.name, "hot")
    assert f"pure={pure} " in out, out[-3000:]


def test_compiled_hot_path_is_built_here():
    """The package builds it wherever a C compiler is present (as on this machine)."""
    import sysconfig

    from collectives.backends.mpi import compiled

    if not shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]):
        pytest.skip("no C compiler here: the compiled hot path is optional and Python runs it")
    assert compiled._hot is not None, "collectives.backends.mpi._hot is not built: reinstall"


@needs_mpi
@shared
@pytest.mark.parametrize("n, ranks_per_node", [(2, None), (3, None), (4, 2)])
def test_calibration_times_mpi_and_auto_weighs_it(n, ranks_per_node, jobs, request):
    # 3 ranks on a machine of 2 cores: oversubscribed; 4 in 2 simulated hosts: the net class
    # (each run with a fresh COLLECTIVES_CACHE_DIR of its own)
    jobs.passed(request.node.name, "calibrated")


@needs_mpi
@shared
@pytest.mark.parametrize("n", [2, 4])
def test_async_prepared_and_new_communicators(n, jobs, request):
    jobs.passed(request.node.name, "async")


@needs_mpi
@shared
@pytest.mark.parametrize("n", [2, 3])
def test_freed_communicators_leave_nothing_behind(n, jobs, request):
    # (a question nobody read reached the next communicator's agreement: "rank 0 sent 17
    # bytes where 168 were expected"; a message no receive took, its receive)
    jobs.passed(request.node.name, "freeing")


@needs_mpi
def test_a_free_pending_at_the_end_keeps_its_buffers_until_mpi_finalizes():
    # (the interpreter's teardown freed them before MPI_Finalize, which wrote the peer's counts
    # into freed memory: glibc aborted one launch in three or so; a job of its own, as it
    # judges the process's end)
    out = assert_passed(launch("exit_after_free.py", 2), "exit_after_free")
    assert "FREED" not in out, out[-3000:]


@needs_mpi
@shared
@pytest.mark.parametrize("n", [3])
def test_a_late_peers_data_never_lands_in_memory_handed_out_again(n, jobs, request):
    """A peer stopped with MPI's all-reduce in flight: its peers' failed call keeps the memory
    MPI may still write (``tests/mpi_scenarios/late_peer.py``)."""
    jobs.passed(request.node.name, "late_peer")


@needs_mpi
@shared
@pytest.mark.parametrize("n", [2, 3])
def test_timeouts_and_failure_notices(n, jobs, request):
    out, _ = jobs.passed(request.node.name, "timeouts")
    assert re.search(r"EXAMPLE rank 0: all_reduce\(float32\[1000\], op=sum\) \(call \d+\) timed "
                     rf"out after 0.5 s waiting for rank\(s\) {n - 1}, which never arrived", out), out


@needs_mpi
@shared
@pytest.mark.parametrize("n", [2, 3])
def test_mismatch_same_error_everywhere(n, jobs, request):
    out, _ = jobs.passed(request.node.name, "mismatch")
    assert "ranks called all_reduce with different dtype" in out


@needs_mpi
def test_killed_rank_tears_down_the_job(tmp_path):
    # hydra's default: a rank killed by a signal ends the whole job at once, with a report.
    start = time.monotonic()
    proc = launch("killed.py", 3, "auto", str(tmp_path), timeout=60)
    out = proc.stdout + proc.stderr
    assert time.monotonic() - start < 30, "the job hung after a rank was killed"
    assert proc.returncode != 0
    assert "signal 9" in out, out


@needs_mpi
def test_init_settings_one_rank_gives_otherwise_raise_on_every_rank():
    # (COLLECTIVES_CALIBRATE=0 on one rank alone calibrated, and waited forever there; a bad
    # COLLECTIVES_DEBUG, COLLECTIVES_HANG_GUARD or COLLECTIVES_PURE_PYTHON raised on that rank
    # alone, or not at all)
    assert_passed(launch("init_settings.py", 2, timeout=60), "init_settings")


@needs_mpi
@pytest.mark.parametrize("algorithm", ["native", "ring"])
def test_killed_rank_survivors_raise(algorithm, tmp_path):
    # -disable-auto-cleanup keeps the survivors alive where the dead rank ended without a
    # signal (hydra's proxy kills every rank once it reaps one killed by a signal, whatever
    # the flag says: killed so, the test skipped on most launches): each raises an error
    # naming the dead rank.
    start = time.monotonic()
    proc = launch("killed.py", 3, algorithm, str(tmp_path), "exit",
                  flags=("-disable-auto-cleanup",), timeout=60)
    assert time.monotonic() - start < 30, "the job hung after a rank died"
    # (the ranks' lines can run into each other in mpiexec's output: each ends where the next
    # begins)
    found = re.findall(r"SURVIVOR rank (\d) after ([\d.]+) s: (.*?)(?=SURVIVOR rank |\n|$)",
                       proc.stdout)
    assert sorted(int(rank) for rank, *_ in found) == [0, 1], proc.stdout + proc.stderr[-3000:]
    for _, took, line in found:
        assert line.startswith(("CollectiveTimeoutError", "PeerFailedError")), line
        assert "rank(s) 2" in line or "rank 2" in line, line
        assert float(took) < 8.0, took  # (its 1 s timeout, and the asking: not the 30 s one)


@needs_mpi
@pytest.mark.parametrize("case, call", [("stuck", r"call \d+, all_reduce\(.*\)"),
                                        ("stuck-entering", r"call \d+"),
                                        ("stuck-progress", r"the progress thread .*")])
def test_rank_stuck_inside_the_transport_is_ended_by_the_hang_guard(case, call, tmp_path):
    # rank 0's transport stops returning (as MPICH's MPI_Test may after a peer died) while it
    # waits, or as the call starts; no deadline of the engine can run, so the hang guard ends
    # it 1 s past its 1 s deadline (and says so on the timeline it records)
    start = time.monotonic()
    proc = launch("stuck.py", 2, case, env={hang_guard.ENV: "1", tl.ENV: str(tmp_path)},
                  timeout=60)
    took = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert took < 30, f"the job hung ({took:.0f} s)\n{out[-3000:]}"
    assert proc.returncode != 0, out[-3000:]
    assert "came back" not in out, out[-3000:]
    report = re.search(r"collectives: rank 0 \(pid \d+ on .+\): hang guard: " + call +
                       r" is still running ([\d.]+) s past its 1 s deadline", out)
    assert report, out[-3000:]
    assert 1.0 + hang_guard.CONFIRM <= float(report[1]) < 15.0, report[0]
    assert f"exit code {hang_guard.EXIT_CODE}" in out, out[-3000:]
    events = [json.loads(line.rstrip(",\n")) for path in tmp_path.glob("*.json")
              for line in path.open() if '"hang guard"' in line]
    assert [e["args"]["call"] for e in events] == [report[0].split("hang guard: ")[1]
                                                   .split(" is still")[0]], events
    # the stack dump's innermost frame is the call that never returned
    assert re.search(r'File ".*stuck\.py", line \d+,? in never_returns', out), out[-3000:]


@needs_mpi
def test_hang_guard_lets_a_rank_stopped_past_its_deadline_raise_its_timeout():
    # rank 0 is stopped (SIGSTOP) in a wait for 4 s, past its deadline and the grace: resumed,
    # it raises CollectiveTimeoutError itself; the guard must not end it first
    proc = launch("stuck.py", 2, "stopped", env={hang_guard.ENV: "1"}, timeout=90)
    out = assert_passed(proc, "stuck")
    assert "hang guard" not in out, out[-3000:]
    assert "rank 0 raised CollectiveTimeoutError" in out, out[-3000:]


@needs_mpi
def test_hang_guard_leaves_a_long_wait_within_its_own_timeout_alone():
    # the call's own timeout (10 s) outlasts the communicator's (1 s) plus the grace (1 s)
    proc = launch("stuck.py", 2, "slow", env={hang_guard.ENV: "1"}, timeout=90)
    out = assert_passed(proc, "stuck")
    assert "hang guard" not in out, out[-3000:]


@needs_mpi
@shared
@pytest.mark.parametrize("n, one_core", [(2, False), (3, False), (2, True)])
def test_oversubscribed_node_waits_without_spinning(n, one_core, jobs, request):
    # more ranks than the cores they may run on (here: all of this machine's, or one): every
    # wait yields at once; otherwise the hot path spins first
    cores = sorted(os.sched_getaffinity(0))
    expected = n > (1 if one_core else len(cores))
    if one_core:  # a job of its own: its ranks start on one core
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        full_env.pop(mpi.ENV_RANKS_PER_NODE, None)
        proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable,
                               str(SCENARIOS / "oversubscribed.py")], capture_output=True,
                              text=True, timeout=120, env=full_env, cwd=ROOT,
                              preexec_fn=lambda: os.sched_setaffinity(0, cores[:1]))
        out = assert_passed(proc, "oversubscribed")
    else:  # every rank prints its line: the whole job's output (one such scenario in it)
        _, out = jobs.passed(request.node.name, "oversubscribed")
    found = re.findall(r"OVERSUBSCRIBED rank \d+ (\w+) hot_spin=(\S+) dup=(\w+)", out)
    assert len(found) == n, out[-3000:]
    for flag, hot_spin, inherited in found:
        assert flag == inherited == str(expected), found
        assert (float(hot_spin) == 0) == expected, found


@needs_mpi
def test_messages_of_a_rank_that_left_still_arrive():
    """A job of its own (its rank 2 ends): see ``mpi_scenarios/left.py``."""
    assert_passed(launch("left.py", 3, timeout=120), "left")


@needs_mpi
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to bind ranks to")
def test_oversubscription_is_each_ranks_own():
    # ranks 0 and 1 bound to one core, rank 2 to another: the first two share theirs, rank 2
    # has its own core
    out = assert_passed(launch("oversubscribed.py", 3, "0,0,1"), "oversubscribed")
    found = dict(re.findall(r"OVERSUBSCRIBED rank (\d+) (\w+) ", out))
    assert found == {"0": "True", "1": "True", "2": "False"}, out[-3000:]


@needs_mpi
def test_bench_under_mpiexec_prints_once_from_rank_0():
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "collectives.tools.cli", "bench", "--mode", "mpi",
           "-b", "4K", "-e", "16K", "-f", "4", "-a", "auto,native,ring,shm", "-w", "1", "-r",
           "1", "-i", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("#    size(B)") for line in lines) == 1  # one table, rank 0's
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    assert [(r[0], r[4]) for r in rows] == [(size, alg) for size in ("4096", "16384")
                                            for alg in ("auto", "native", "ring", "shm")]
    assert all(r[-1] == "0" for r in rows)  # #wrong
    # what ran: the shared window says so (it was labelled "native", MPI's own)
    assert [r[5] for r in rows if r[4] == "shm"] == ["shm", "shm"]
    # (and MPI's own after it, the hot path included: it kept the shared window's label)
    assert [r[5] for r in rows if r[4] == "native"] == ["native", "native"], rows


# --- the matrix's body on thread ranks ------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 3])
def test_matrix_body_on_thread_ranks(n):
    per_rank = collectives.run(lambda comm: body.Matrix(comm).run(sizes=(0, 7)), n, timeout=120)
    problems = [f for m in per_rank for f in m.failures]
    problems += body.identical([m.digests for m in per_rank])
    assert not problems, "\n".join(problems[:20])
    assert per_rank[0].cases > 100


# --- pure parts (no launch) -----------------------------------------------------------------------

def test_a_long_wait_gives_the_core_back():
    """A wait older than the engine's slow mark sleeps between polls instead of yielding (a
    yield still counts as running and takes a busy machine's cores from processes with work),
    each sleep a small share of the wait so far."""
    from collectives.backends.mpi import waiting

    from collectives.runtime import progress_thread

    waited = 2 * progress_thread.SLOW_WAIT
    polls = 40
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(polls):
        waiting.idle(waited)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    assert wall >= polls * min(waiting.SLEEP_SECONDS, waited * waiting.SLEEP_SHARE), wall
    # asleep, not polling (a poll's yield counts as running: cpu near wall; on a loaded
    # machine each sleep's wake-up took 0.1 ms of CPU, 30% of the wall time)
    assert cpu < wall / 2, (cpu, wall)


def test_a_stalled_native_call_looks_at_the_clock_often_enough():
    """A native run looks at the clock every STALL_POLLS polls to tell a stall to its peers
    after STALL_SECONDS; polls of a slow wait are up to SLEEP_SECONDS apart, so the looks must
    come a few times within STALL_SECONDS (at 64 polls a disagreement after agreement was
    found after about 0.1 s instead of 20 ms, and after 2.35 s on a loaded machine)."""
    from collectives.backends.mpi import channel, runs, waiting

    assert runs.STALL_POLLS * waiting.SLEEP_SECONDS <= tuning.STALL_SECONDS / 4
    # likewise a slow receive's look for a message of another call (PROBE_AFTER: 2 ms)
    assert channel.PROBE_EVERY * waiting.SLEEP_SECONDS <= 2 * channel.PROBE_AFTER


def test_chunks_cover_large_counts():
    count = 3 * 2**31 + 5  # more than 2**31 elements: several MPI calls, none too large
    pieces = mpi.chunks(count, tuning.MAX_COUNT)
    assert all(0 < hi - lo <= 2**31 - 1 for lo, hi in pieces)
    assert pieces[0][0] == 0 and pieces[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    assert len(pieces) == 4
    assert mpi.chunks(0, 10) == ((0, 0),)  # the call still runs: every rank issues it
    assert mpi.chunks(10, 3) == ((0, 3), (3, 6), (6, 9), (9, 10))
    with pytest.raises(ValueError):
        mpi.chunks(10, 0)


@pytest.mark.parametrize("tag_ub", [2**29 - 1, 32767, 2**31 - 1])
def test_tags_stay_in_range_and_apart(tag_ub):
    data, control = tags.data_tags(tag_ub), tags.control_tags(tag_ub)
    for space in (data, control):
        for seq, check in [(0, 0), (2**40, 2**30 - 1), (2047, 12345), (5, 2**29)]:
            assert 0 <= space.tag(seq, check) <= tag_ub
    # every call that may be outstanding at once has its own tag
    assert len({data.tag(seq, 7) for seq in range(1000, 1000 + 2**tags.SEQ_BITS)}) == 2**tags.SEQ_BITS
    assert data.tag(1, 5) != data.tag(1, 6)  # another call's check never matches...
    assert data.same_call(data.tag(1, 5), data.tag(1, 6))  # ...but the probe sees it is call 1
    assert not data.same_call(data.tag(1, 5), data.tag(2, 5))
    assert control.tag(3, 0) != control.tag(3, 1)


def test_groups_from_env():
    assert mpi.groups_from_env(4, {}) is None
    assert mpi.groups_from_env(4, {mpi.ENV_RANKS_PER_NODE: "2"}) == ((0, 1), (2, 3))
    assert mpi.groups_from_env(5, {mpi.ENV_RANKS_PER_NODE: "2"}) == ((0, 1), (2, 3), (4,))
    for bad in ("0", "two", "-1"):
        with pytest.raises(ValueError, match=mpi.ENV_RANKS_PER_NODE):
            mpi.groups_from_env(4, {mpi.ENV_RANKS_PER_NODE: bad})


def test_what_auto_runs():
    big, small = 64 << 20, 4096
    assert tuning.prefer_native(Collective.ALL_REDUCE, 2, small)
    assert not tuning.prefer_native(Collective.ALL_REDUCE, 2, big)  # a schedule: the ring
    assert not tuning.prefer_native(Collective.ALL_REDUCE, 2, 1 << 20)  # not MPICH's Iallreduce
    assert not tuning.prefer_native(Collective.ALL_REDUCE, 3, 1 << 20)
    assert tuning.prefer_native(Collective.ALL_REDUCE, 4, 512 << 10)
    assert not tuning.prefer_native(Collective.ALL_REDUCE, 4, 4 << 20)
    assert tuning.prefer_native(Collective.BROADCAST, 4, big)
    assert tuning.prefer_native(Collective.ALL_REDUCE, 4, big, single_node=False)  # across hosts
    assert tuning.use_shm("shm", Collective.ALL_REDUCE, small, True)
    assert not tuning.use_shm("shm", Collective.ALL_REDUCE, small, False)
    assert not tuning.use_shm("auto", Collective.ALL_REDUCE, big, True)  # no rank count: never
    assert tuning.persistent(Collective.ALL_REDUCE, 4096)
    assert not tuning.persistent(Collective.ALL_REDUCE, big)


def test_canonical_names():
    assert mpi.canonical("MPI") == "native"
    assert mpi.canonical(" native ") == "native"
    assert mpi.canonical("shared_memory") == "shm"
    assert mpi.canonical("xring") == "ring"
    with pytest.raises(ValueError, match="unknown algorithm"):
        mpi.canonical("bogus")


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint8", "int64", "uint64",
                                   "bool", "complex64"])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN])
@pytest.mark.parametrize("size", [2, 3, 4, 100])
def test_rider_tells_agreement_from_disagreement(dtype, op, size):
    dtype = np.dtype(dtype)
    ride = rider.Rider.make(dtype, op, size, 0x2345678)
    other = rider.Rider.make(dtype, op, size, 0x2345678 ^ (1 << 17))
    if ride is None:
        assert (dtype.kind == "b" and op is ReduceOp.SUM) or (dtype.kind == "c" and op is not
                                                              ReduceOp.SUM) or size > 64
        return
    kernel = {ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}[op]

    def reduced(riders):
        trailers = []
        for r in riders:
            t = np.zeros(r.length, dtype)
            r.fill(t, False)
            trailers.append(t)
        if dtype.kind == "b":
            kernel_ = np.logical_or if op is ReduceOp.MAX else np.logical_and
            return kernel_.reduce(trailers)
        return kernel.reduce(trailers, dtype=dtype)  # in the dtype, as MPI reduces

    assert ride.agrees(reduced([ride] * size))
    mixed = reduced([ride] * (size - 1) + [other])
    assert not ride.agrees(mixed) and not other.agrees(mixed)
