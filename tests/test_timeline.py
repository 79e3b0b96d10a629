"""The timeline: traces that keep the trace-event format's rules, rounds that are the plans'
rounds, and a late rank shown as the one everybody waited for; on thread ranks, on MPI ranks
under ``mpiexec``, and for multi-device calls. Plus the command (merge, plot, summary), the
environment variable, a bounded buffer, and a process that dies mid-call.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import collectives
from collectives import algorithms
from collectives import timeline as tl
from collectives.algorithms.base import Layout
from collectives.algorithms.schedule import Collective
from collectives.runtime.execute import run_multi_device
from collectives.timeline import recorder
from collectives.timeline import trace_files as traces
from collectives.timeline.summary import account, straggler, summarize
from collectives.tools.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent


def _events(folder: Path) -> list[dict]:
    tl.stop()
    return traces.merge(folder)["traceEvents"]


def _calls(every: list[traces.Span], pid: int) -> dict[int, traces.Span]:
    return {s.args["call"]: s for s in every
            if s.pid == pid and s.cat == "call" and "call" in s.args}


def _inside(every, call: traces.Span, cat: str) -> list[traces.Span]:
    return [s for s in every if s.pid == call.pid and s.tid == call.tid and s.cat == cat
            and call.start <= s.start and s.end <= call.end]


def test_off_by_default_and_nothing_recorded():
    assert not tl.enabled() and tl.current_file() is None

    def body(comm):
        run = comm.all_reduce(np.ones(4), async_op=True)
        return run._op.trace, comm.all_reduce(np.ones(4))

    for trace, result in collectives.run(body, 2):
        assert trace is None and (result == 2).all()


def test_thread_ranks_trace_keeps_the_format(record):
    def body(comm):
        x = np.arange(12, dtype=np.float32).reshape(4, 3)
        comm.all_reduce(x, "sum", "ring")
        comm.reduce(x, "max", 1, "tree")
        comm.broadcast(x if comm.rank == 0 else None, 0)
        comm.all_gather(x, algorithm="rechd")
        comm.reduce_scatter(x, "sum", "ring")
        comm.gather(x, 0)
        comm.barrier()
        if comm.rank == 2:  # (late: its peers' first call is in flight as they issue the
            time.sleep(0.3)  # second, whatever the load; rank 2's may finish first)
        first = comm.all_reduce(x, async_op=True)
        second = comm.all_gather(x, async_op=True)
        first.wait(), second.wait()
        prepared = comm.all_reduce_init(x, out=np.empty_like(x))
        for _ in range(2):
            prepared.start().wait()
        return comm.calls.engine.seq

    calls = collectives.run(body, 3)[0]
    tl.flush()
    raw = traces.read_events(tl.current_file())
    assert traces.problems(raw) == []  # the process's own file, as written
    events = _events(record)
    assert traces.problems(events) == []
    every = traces.spans(events)
    for rank in range(3):
        mine = _calls(every, rank)
        assert sorted(mine) == list(range(1, calls + 1))
        signature = mine[1].args
        assert signature["collective"] == "all_reduce" and signature["shape"] == [4, 3]
        assert signature["dtype"] == "float32" and signature["op"] == "sum"
        assert signature["algorithm"] == "ring" and signature["bytes"] == 48
        assert mine[2].args["root"] == 1 and mine[2].args["op"] == "max"
        assert mine[3].args["shape"] == [4, 3]  # a non-root learns it during the call
        assert [s.name for s in _inside(every, mine[1], "stage")] == ["agreement", "ring plan"]
        # asynchronous calls in flight together: lanes of their own, never the blocking track
        lanes = {mine[k].tid for k in (8, 9)}
        assert (len(lanes) == 2 or rank == 2) and mine[1].tid not in lanes
        # (call 10: the prepared call's making, a step every rank takes; 11 and 12 its runs)
        assert all(mine[k].args.get("async") for k in (8, 9, 11, 12))
        assert not mine[10].args.get("async")


def _expected_rounds(collective, name, size, rank, shape, root=0, layout=None):
    count = int(np.prod(shape))
    plan = algorithms.rank_plan(collective, name, size, rank, root=root, layout=layout)
    if collective in (Collective.ALL_GATHER, Collective.GATHER):
        units, granule = size, count
    elif collective is Collective.REDUCE_SCATTER:
        units, granule = shape[0], count // shape[0]
    else:
        units, granule = count, 1
    out = []
    for index, sends, recvs in plan.offsets(units, granule):
        out.append((index, sorted((dst, (b - a) * 4) for dst, a, b, _ in sends),
                    sorted((tuple(srcs), (b - a) * 4, "reduce" if reduce else "copy")
                           for srcs, a, b, reduce, _ in recvs)))
    return out


CASES = [(c, name) for c in (Collective.ALL_REDUCE, Collective.REDUCE, Collective.BROADCAST,
                             Collective.ALL_GATHER, Collective.REDUCE_SCATTER,
                             Collective.GATHER) for name in algorithms.names_for(c)]
CASES += [(Collective.ALL_REDUCE, "ring/rechd"), (Collective.REDUCE_SCATTER, "tree/ring")]


@pytest.mark.parametrize("size", [4, 5])
def test_rounds_are_the_plans_rounds_for_every_algorithm(record, size):
    shape = (10, 3)
    groups = [[0, 1], list(range(2, size))]

    def body(comm):
        x = np.ones(shape, np.float32)
        seqs = []
        for collective, name in CASES:
            kwargs = {"groups": groups} if "/" in name else {}
            if collective is Collective.ALL_REDUCE:
                comm.all_reduce(x, "sum", name, **kwargs)
            elif collective is Collective.REDUCE:
                comm.reduce(x, "sum", 1, name)
            elif collective is Collective.BROADCAST:
                comm.broadcast(x, 1, name)
            elif collective is Collective.ALL_GATHER:
                comm.all_gather(x, algorithm=name)
            elif collective is Collective.GATHER:
                comm.gather(x, 1, name)
            else:
                comm.reduce_scatter(x, "sum", name)
            seqs.append(comm.calls.engine.seq)
        return seqs

    seqs = collectives.run(body, size)[0]
    every = traces.spans(_events(record))
    for rank in range(size):
        mine = _calls(every, rank)
        for (collective, name), seq in zip(CASES, seqs):
            grouped = "/" in name and collective is Collective.ALL_REDUCE  # (groups= given)
            layout = Layout(tuple(tuple(g) for g in groups)) if grouped else None
            want = _expected_rounds(collective, name, size, rank, shape, root=1, layout=layout)
            got = [(s.args["round"], sorted(tuple(x) for x in s.args["sends"]),
                    sorted((tuple(srcs), n, kind) for srcs, n, kind in s.args["recvs"]))
                   for s in _inside(every, mine[seq], "round")]
            assert got == want, f"rank {rank}: {collective.value} {name}"


def _first_calls(size: int, algorithms=("ring",)) -> None:
    """Thread ranks' first calls, made before a recording starts: a first call's one-time
    costs (in a fresh environment, compiling the modules it imports) fall on the rank that
    gets there first, which a loaded machine can make look like the straggler (rank 0 once
    kept the others waiting 0.42 s; rank 1, 0.84 s)."""
    for algorithm in algorithms:
        collectives.run(lambda comm, name=algorithm: comm.all_reduce(
            np.ones(256, np.float32), algorithm=name), size)


@pytest.fixture
def warm_four_ranks():
    _first_calls(4, ("ring", "rechd", "one_device"))


@pytest.mark.parametrize("algorithm", ["ring", "rechd", "one_device"])
def test_a_late_rank_is_the_one_everybody_waited_for(warm_four_ranks, record, algorithm):
    late = 2

    def body(comm):
        x = np.ones(4096, np.float32)
        for _ in range(3):
            if comm.rank == late:  # (well above what a loaded machine delays a thread rank:
                time.sleep(0.3)    # at 30 ms, a descheduled rank 3 once outweighed it; at
                # 100 ms, rank 0, by 0.56 s in three calls, in a run of the whole suite)
            comm.all_reduce(x, algorithm=algorithm)

    collectives.run(body, 4)
    events = _events(record)
    assert traces.problems(events) == []
    worst, share = straggler(events)
    assert worst == late and share > 0.5, (worst, share)
    assert "straggler: rank 2" in summarize(events)
    accounts = account(events)
    for rank in (0, 1, 3):  # each rank waited above all for the late one, at a chain's end
        assert accounts.rank_for[rank].most_common(1)[0][0] == late, accounts.rank_for[rank]


MPIEXEC = (str(Path(sys.executable).parent / "mpiexec")
           if (Path(sys.executable).parent / "mpiexec").exists() else shutil.which("mpiexec"))
needs_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
    reason="needs mpi4py and an mpiexec (pip install -e '.[mpi]' installs both)")


@needs_mpi
def test_fast_path_and_clock_on_mpi_ranks(tmp_path):
    folder = tmp_path / "timeline"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "COLLECTIVES_TIMELINE": str(folder)}
    # (rank 1 late by 0.15 s in each of 3 calls: 0.05 s was lost in a loaded machine's waits)
    proc = subprocess.run([MPIEXEC, "-n", "4", sys.executable,
                           str(ROOT / "tests" / "mpi_scenarios" / "timeline.py"), "1", "0.15"],
                          capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = traces.trace_files(folder)
    assert len(files) == 4  # one per process
    for path in files:
        raw = traces.read_events(path)
        assert traces.problems(raw) == [], path
        assert any(e.get("name") == "collectives_clock" for e in raw)  # lined up at init
    events = traces.merge(folder)["traceEvents"]
    assert traces.problems(events) == []
    worst, share = straggler(events)
    assert worst == 1 and share > 0.5, (worst, share)
    every = traces.spans(events)
    for rank in range(4):
        fast = [s for s in every if s.pid == rank and s.args.get("path") == "fast"]
        assert len(fast) >= 15 and all(s.args["bytes"] == 4096 for s in fast)
        lanes = [s for s in every if s.pid == rank and s.cat == "call" and s.args.get("async")]
        assert len(lanes) == 1 and lanes[0].tid != fast[0].tid


def test_multi_device_calls_show_per_device_rounds(record):
    values = [np.full(1000, d, np.float64) for d in range(4)]
    collectives.all_reduce(values, "sum", "ring")  # tiles: the plan as one span
    schedule = algorithms.schedule(Collective.ALL_REDUCE, "rechd", 4)
    work = [v.copy() for v in values]
    backend = collectives.load_backend("local").devices()
    run_multi_device(schedule, [None] * 4, work, collectives.ReduceOp.SUM, backend,
                     strategy="rounds")
    assert all((w == 6).all() for w in work)
    events = _events(record)
    assert traces.problems(events) == []
    every = traces.spans(events)
    for d in range(4):
        pid = recorder.DEVICE_PID + d
        call = next(s for s in every if s.pid == pid and s.cat == "call")
        assert call.args["collective"] == "all_reduce" and call.args["devices"] == 4
        rounds = [s for s in every if s.pid == pid and s.cat == "round"]
        assert [r.args["round"] for r in rounds] == [0, 1, 2, 3]  # rechd on 4: 2 + 2 rounds
        for r in rounds:
            step = schedule.rounds[r.args["round"]]
            mine = sorted((tuple(srcs), (hi - lo) * 8000 // schedule.den)
                          for dst, srcs, lo, hi, _ in step if dst == d)
            assert sorted((tuple(s), n) for s, n, _ in r.args["recvs"]) == mine


def test_a_multi_device_call_is_on_every_devices_row_however_its_arguments_came(record):
    # (broadcast(x, devices=4), the README's form, was recorded on device 0 alone; no call
    # carried its op or algorithm)
    x = np.ones(8)
    collectives.broadcast(x, devices=4)
    collectives.scatter(np.ones((2, 8)), np.int64(2))  # (a NumPy count raised TypeError)
    collectives.all_reduce([x] * 3, op="max", algorithm="ring")
    every = traces.spans(_events(record))
    calls = {}
    for s in every:
        if s.cat == "call" and s.pid >= recorder.DEVICE_PID:
            calls.setdefault(s.args["collective"], set()).add(s.pid - recorder.DEVICE_PID)
            if s.args["collective"] == "all_reduce":
                assert (s.args["op"], s.args["algorithm"]) == ("max", "ring")
            else:
                assert s.args["devices"] == {"broadcast": 4, "scatter": 2}[s.args["collective"]]
    assert calls == {"broadcast": {0, 1, 2, 3}, "scatter": {0, 1}, "all_reduce": {0, 1, 2}}


@pytest.fixture
def warm_ranks():
    _first_calls(3)


def test_the_command_merges_draws_and_summarises(warm_ranks, record, tmp_path, capsys):
    def body(comm):
        for _ in range(2):
            if comm.rank == 1:  # (late by well above what a loaded machine delays a rank:
                time.sleep(0.3)  # 0.1 s once fell short of rank 0's delays, on 2 cores)
            comm.all_reduce(np.ones(256, np.float32), algorithm="ring")

    collectives.run(body, 3)
    tl.stop()
    merged, picture = tmp_path / "trace.json", tmp_path / "timeline.png"
    assert cli(["timeline", "merge", str(record), "-o", str(merged)]) == 0
    assert json.loads(merged.read_text())["traceEvents"]
    assert cli(["timeline", "plot", str(merged), "-o", str(picture)]) == 0
    assert picture.read_bytes()[:4] == b"\x89PNG"
    assert cli(["timeline", "summary", str(merged)]) == 0
    out = capsys.readouterr().out
    assert "all_reduce" in out and "1 KiB" in out and "straggler: rank 1" in out
    assert cli(["timeline", "summary", str(tmp_path / "nothing")]) == 2
    capsys.readouterr()
    # (a folder that does not exist was said to "hold no timeline files")
    assert cli(["timeline", "merge", str(tmp_path / "nothing"), "-o", str(merged)]) == 2
    assert "nothing does not exist" in capsys.readouterr().err


def test_environment_variable_records_and_closes_the_file(tmp_path):
    code = ("import numpy as np, collectives\n"
            "collectives.run(lambda c: c.all_reduce(np.ones(3)), 2)\n")
    env = {**os.environ, "COLLECTIVES_TIMELINE": str(tmp_path / "t")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    (path,) = (tmp_path / "t").iterdir()
    events = json.loads(path.read_text())  # closed at exit: plain JSON
    assert traces.problems(events) == [] and any(e.get("cat") == "call" for e in events)


def test_a_folder_used_again_merges_its_newest_run_and_names_what_it_left_out(tmp_path, capsys):
    # (two runs' files were merged as one: the summary blamed a rank of the other run; a
    # merged trace saved in the folder was read back in, doubling every call)
    folder = tmp_path / "t"
    for size in (4, 2):  # two runs, the second of two ranks
        code = ("import numpy as np, collectives\n"
                f"collectives.run(lambda c: c.all_reduce(np.ones(3)), {size})\n")
        env = {**os.environ, "COLLECTIVES_TIMELINE": str(folder)}
        subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    merged = folder / "all.trace.json"
    for _ in range(2):  # (the second merge finds the first's output in the folder)
        assert cli(["timeline", "merge", str(folder), "-o", str(merged)]) == 0
    captured = capsys.readouterr()
    assert "2 participants" in captured.out and "4 participants" not in captured.out
    assert "1 file(s) of an older run, left out" in captured.err
    assert "all.trace.json: a merged trace, left out" in captured.err
    calls = [s for s in traces.spans(traces.load(folder)) if s.cat == "call"]
    assert len(calls) == 2  # one all-reduce on each of the newest run's two ranks


def test_a_second_recording_of_one_process_keeps_the_first(tmp_path):
    # (it reopened the same file: the first recording was lost)
    first = tl.start(tmp_path)
    collectives.run(lambda c: c.all_reduce(np.ones(3)), 2)
    tl.stop()
    second = tl.start(tmp_path)
    collectives.run(lambda c: c.broadcast(np.ones(3), 0), 2)
    tl.stop()
    assert first != second and first.exists() and second.exists()
    names = {s.args.get("collective") for path in (first, second)
             for s in traces.spans(traces.read_events(path)) if s.cat == "call"}
    assert {"all_reduce", "broadcast"} <= names


def test_making_communicators_is_one_row_per_kind_of_call(record, capsys):
    # (a dup's, a split's and a shared array's rows were named by the Python object behind
    # them: one row per rank and call, which the summary could not line up across ranks)
    def body(comm):
        comm.dup().free()
        comm.split(0).free()
        comm.shared_empty(4)

    collectives.run(body, 2)
    names = [s.args.get("collective") for s in traces.spans(_events(record)) if s.cat == "call"]
    assert sorted(names) == ["dup", "dup", "shared_empty", "shared_empty", "split", "split"]


@pytest.mark.parametrize("name, contents, says", [
    ("r.json", '{"a": 1}', "without traceEvents, not a timeline file"),
    ("x.trace.json", "just a line\n", "line 2 is not a trace event"),
    ("x.trace.json", None, "Is a directory"),
])
def test_what_is_no_timeline_file_is_said_in_one_line(name, contents, says, tmp_path, capsys):
    # (a JSON object of other keys, or a line of text, read as an empty trace, exit 0; a
    # folder named like a trace file gave a traceback)
    if contents is None:
        (tmp_path / name).mkdir()
    else:
        (tmp_path / name).write_text(contents)
    assert cli(["timeline", "summary", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_a_plot_range_outside_the_trace_is_named_with_the_traces_length(record, tmp_path):
    # ("no spans between 100000.0 and None ms"; a reversed or empty range reached matplotlib)
    pytest.importorskip("matplotlib")
    from collectives.timeline.plot import plot

    collectives.run(lambda c: c.all_reduce(np.ones(3)), 2)
    events = _events(record)
    with pytest.raises(ValueError, match=r"no spans from 100000 ms to its end: it runs .* ms"):
        plot(events, tmp_path / "x.png", start_ms=100000)
    for start, end in ((50, 10), (5, 5)):
        with pytest.raises(ValueError, match=rf"--end {end} is not after --start {start}"):
            plot(events, tmp_path / "x.png", start_ms=start, end_ms=end)


def test_a_full_buffer_drops_and_says_so(record, monkeypatch):
    monkeypatch.setattr(recorder, "CAPACITY", 40)
    monkeypatch.setattr(recorder, "FLUSH_SECONDS", 10.0)  # nothing drains while the calls run

    def body(comm):
        for _ in range(10):
            comm.all_reduce(np.ones(8), algorithm="ring")

    collectives.run(body, 3)
    events = _events(record)
    dropped = [e for e in events if e.get("name") == "timeline dropped events"]
    assert dropped and dropped[0]["args"]["dropped"] > 0
    assert traces.problems(events) == []  # the merge repairs what the drops cut


def test_a_process_killed_mid_call_leaves_a_readable_file(tmp_path):
    code = f"""
import os, signal, time, threading, numpy as np, collectives, collectives.timeline as tl
tl.start({str(tmp_path / 't')!r})
def body(comm):
    if comm.rank == 1:
        time.sleep(30)  # never arrives
    comm.all_reduce(np.ones(8), algorithm="ring")
threading.Thread(target=collectives.run, args=(body, 2), daemon=True).start()
time.sleep(0.5)
tl.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    (path,) = (tmp_path / "t").iterdir()
    assert not path.read_text().rstrip().endswith("]")  # never closed
    raw = traces.read_events(path)
    opened = [e for e in raw if e.get("ph") == "B" and e.get("pid") == 0]
    assert [e["name"] for e in opened][:2] == ["all_reduce", "agreement"]
    events = traces.merge(tmp_path / "t")["traceEvents"]
    assert traces.problems(events) == []
    every = traces.spans(events)
    call = next(s for s in every if s.pid == 0 and s.cat == "call")
    assert call.args.get("unfinished") is True


@pytest.mark.slow  # a real MirroredStrategy: left out of the quick subset
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="tensorflow is not installed")
def test_tensorflow_marks_each_batch_reduce_with_its_tensors(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "timeline_marks.py", str(tmp_path / "t")],
                          cwd=ROOT / "tests" / "tf_scenarios", env=env, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    events = traces.merge(tmp_path / "t")["traceEvents"]
    assert traces.problems(events) == []
    every = traces.spans(events)
    marks = [s for s in every if s.cat == "batch"]
    assert [m.args["path"] for m in marks] == ["host", "device"]
    host_mark = marks[0]
    assert [(t["shape"], t["dtype"], t["replicas"]) for t in host_mark.args["tensors"]] == [
        ([3], "float32", 2), ([2, 5], "float32", 2), ([7], "float32", 2)]
    assert host_mark.args["bytes"] == 4 * (3 + 10 + 7)
    inside = [s for s in every if s.cat == "call" and host_mark.start <= s.start
              and s.end <= host_mark.end]  # the multi-device calls it made, on the devices' rows
    assert inside and {s.pid for s in inside} == {recorder.DEVICE_PID, recorder.DEVICE_PID + 1}


def test_a_timeline_folder_that_cannot_be_made_is_named_and_spares_the_import(tmp_path):
    # COLLECTIVES_TIMELINE naming a file stopped ``import collectives`` (and every command,
    # --version included) with a FileExistsError traceback
    from collectives import timeline

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"timeline's folder .*a-file' cannot be made"):
        timeline.start(blocker)
    proc = subprocess.run([sys.executable, "-c", "import collectives; "
                           "print(collectives.timeline.enabled())"],
                          env={**os.environ, "COLLECTIVES_TIMELINE": str(blocker)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr
    assert "COLLECTIVES_TIMELINE: the timeline's folder" in proc.stderr


@pytest.mark.parametrize("action, contents, says", [
    ("summary", {"traceEvents": [{"ph": "X"}]}, "event 0 ({'ph': 'X'}) is a span without"),
    ("summary", {"traceEvents": 5}, "its traceEvents (5) are not a list"),
    ("summary", [1, 2, 3], "event 0 is 1, not a trace event"),
    ("summary", [], "t.trace.json is empty"),  # (it said: no collective calls, exit 0)
    ("merge-into-folder", [], "-o {tmp}: is a folder; name a file"),
    ("plot-without-format", [], "name a .png, .svg, .pdf file"),
])
def test_a_malformed_trace_or_output_is_one_line(action, contents, says, tmp_path, python):
    # (each was a traceback: KeyError, TypeError, AttributeError, IsADirectoryError; and plot
    # -o without a suffix printed a path matplotlib had not written, adding .png)
    trace = tmp_path / "t.trace.json"
    trace.write_text(json.dumps(contents))
    args = {"summary": ["summary", str(trace)],
            "merge-into-folder": ["merge", str(tmp_path), "-o", str(tmp_path)],
            "plot-without-format": ["plot", str(trace), "-o", str(tmp_path / "out")]}[action]
    proc = python("-m", "collectives.tools.cli", "timeline", *args, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says.replace("{tmp}", str(tmp_path)) in lines[0], proc.stderr


def test_runs_written_at_once_are_one_run_and_their_ranks_kept_apart(tmp_path):
    # (two halves of a job, each beginning on a communicator of its own, took each its own
    # rank 0's token: merge left one half out as "an older run"; both called their ranks 0
    # and 1, and the halves' rows were merged into one)
    import time as clock

    def record(token: str, name: str, ranks: range) -> None:
        events = [{"ph": "M", "pid": 999, "tid": 0, "name": "collectives_run",
                   "args": {"run": token, "started": clock.time() - 5}}]
        for r in ranks:
            events += [{"ph": "X", "pid": r, "tid": 0, "name": "all_reduce", "cat": "call",
                        "ts": 1.0, "dur": 2.0, "args": {"call": 1}}]
        (tmp_path / name).write_text(json.dumps(events))

    record("half-a", "h-1.trace.json", range(2))
    record("half-b", "h-2.trace.json", range(2))
    trace = traces.merge(tmp_path)
    assert trace["otherData"]["left_out"] == []
    assert len({e["pid"] for e in trace["traceEvents"] if e.get("cat") == "call"}) == 4
