"""Point-to-point messages on the timeline: ``send``/``recv`` on the communicator's track and
``isend``/``irecv`` on asynchronous lanes, each with its peer, tag, bytes, dtype, shape and
outcome (a receive that times out says so); nothing while nothing records, nor for the clock
exchange; and the summary counts them. On thread ranks and on MPI ranks under ``mpiexec``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_timeline import MPIEXEC, needs_mpi

import collectives
from collectives import timeline as tl
from collectives.timeline import trace_files as traces
from collectives.timeline.record_calls import LANES
from collectives.timeline.summary import account, summarize
from collectives.tools.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent
LATE = 0.25  # seconds rank 0 is late to its blocking send (at 0.05 s, rank 1 had 40 ms to
# reach its receive for its wait to count: a loaded machine left it 24 ms to spare)


def _messages(events: list[dict], pid: int) -> list[traces.Span]:
    return [s for s in traces.spans(events)
            if s.pid == pid and s.cat == "call" and s.name in ("send", "recv")]


def _late_send_then_async_pair(comm):
    """Rank 0 is late to a blocking send; then both ranks exchange by isend/irecv."""
    peer = 1 - comm.rank
    if comm.rank == 0:
        time.sleep(LATE)
        comm.send(np.arange(12, dtype=np.float32).reshape(3, 4), 1, tag=5)
    else:
        comm.recv(np.empty((3, 4), np.float32), 0, tag=5)
    sent = comm.isend(np.full(6, comm.rank, np.float64), peer, tag=2)
    received = comm.irecv(np.empty(6), peer, tag=2)
    assert (received.wait() == peer).all() and sent.wait() is None
    return sent._op.trace is not None


def _check_messages(events: list[dict], least_wait: float) -> None:
    """What both backends' traces must show of ``_late_send_then_async_pair``; rank 1's wait
    for the late rank 0 lasts at least ``least_wait`` microseconds."""
    assert traces.problems(events) == []
    for rank in (0, 1):
        found = [s for s in _messages(events, rank) if s.args["tag"] in (2, 5)]
        blocking = [s for s in found if s.args["tag"] == 5]
        pair = sorted((s for s in found if s.args["tag"] == 2), key=lambda s: s.name)
        assert [s.name for s in blocking] == ["send" if rank == 0 else "recv"]
        assert [s.name for s in pair] == ["recv", "send"]
        (first,) = blocking
        assert first.args["peer"] == 1 - rank and first.args["bytes"] == 48
        assert first.args["dtype"] == "float32" and first.args["shape"] == [3, 4]
        assert first.args["outcome"] == "ok" and "async" not in first.args
        assert first.tid % LANES == 0  # the communicator's own track
        for span in pair:  # asynchronous lanes of that communicator, one each
            assert span.args["peer"] == 1 - rank and span.args["bytes"] == 48
            assert span.args["dtype"] == "float64" and span.args["shape"] == [6]
            assert span.args["async"] is True and span.args["outcome"] == "ok"
            assert span.tid // LANES == first.tid // LANES and span.tid % LANES != 0
        if pair[0].start < pair[1].end and pair[1].start < pair[0].end:
            assert pair[0].tid != pair[1].tid  # in flight together: lanes apart
        assert len({s.args["message"] for s in found}) == len(found)
    (late_wait,) = [s for s in traces.spans(events) if s.pid == 1 and s.cat == "wait"
                    and s.args.get("message") == 1]  # the receiver waited for rank 0
    assert late_wait.args["for"] == [0] and late_wait.duration > least_wait


def test_messages_on_thread_ranks(record):
    assert collectives.run(_late_send_then_async_pair, 2) == [True, True]
    tl.stop()
    # (thread ranks start together: rank 1 is at its receive well before rank 0's send)
    _check_messages(traces.merge(record)["traceEvents"], 0.2 * LATE * 1e6)


def test_a_receive_that_times_out_or_fails_says_so(record):
    def body(comm):
        if comm.rank == 1:
            with pytest.raises(collectives.CollectiveTimeoutError):
                comm.recv(np.empty(2), 0, tag=9, timeout=0.05)  # nothing comes with tag 9
            with pytest.raises(collectives.CollectiveMismatchError):
                comm.recv(np.empty(2), 0, tag=3)  # 4 elements come
        else:
            comm.send(np.ones(4), 1, tag=3)
        comm.barrier()

    collectives.run(body, 2)
    tl.stop()
    (timed_out, failed) = _messages(traces.merge(record)["traceEvents"], 1)
    assert timed_out.args["outcome"] == "timed out" and timed_out.args["tag"] == 9
    assert "CollectiveTimeoutError" in timed_out.args["error"]
    assert timed_out.duration >= 0.04e6
    assert failed.args["outcome"] == "CollectiveMismatchError" and failed.args["bytes"] == 16


def test_nothing_recorded_while_off():
    assert not tl.enabled()
    assert collectives.run(_late_send_then_async_pair, 2) == [False, False]  # no traces
    assert tl.current_file() is None


def test_the_summary_counts_messages(record, capsys):
    collectives.run(_late_send_then_async_pair, 2)
    tl.stop()
    events = traces.merge(record)["traceEvents"]
    groups = account(events).groups
    assert len(groups[("send", 48, 2, False)]) == 3  # rank 0's send, both isends
    assert len(groups[("recv", 48, 2, False)]) == 3
    assert account(events).rank_for[1].most_common(1)[0][0] == 0  # it waited for rank 0
    text = summarize(events)
    assert "send" in text and "recv" in text and "straggler: rank 0" in text
    merged = record.parent / "trace.json"
    assert cli(["timeline", "merge", str(record), "-o", str(merged)]) == 0
    assert cli(["timeline", "summary", str(merged)]) == 0
    assert "recv" in capsys.readouterr().out


@needs_mpi
def test_messages_on_mpi_ranks(tmp_path):
    folder = tmp_path / "timeline"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop(tl.ENV, None)
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable,
                           str(ROOT / "tests" / "mpi_scenarios" / "timeline_p2p.py"),
                           str(folder)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(traces.trace_files(folder)) == 2  # one per process
    events = traces.merge(folder)["traceEvents"]
    _check_messages(events, 0.0)  # (a loaded machine may hold rank 1 back as long as rank 0)
    (timed_out,) = [s for s in _messages(events, 1) if s.args["tag"] == 9]
    assert timed_out.args["outcome"] == "timed out" and timed_out.duration >= 0.09e6
    # neither the messages sent while off (tag 7) nor the clock exchange's (tag TAG) are there
    assert {s.args["tag"] for r in (0, 1) for s in _messages(events, r)} == {2, 5, 9}
    assert any(e.get("name") == "collectives_clock" for e in events)  # it did measure
