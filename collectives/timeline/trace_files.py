"""Reading timeline files, merging the ranks' files into one trace, and the spans in a trace.

A process's file is the Chrome trace-event JSON array form, one event a line, perhaps without
its closing bracket and with a torn last line (a process that died while writing):
``read_events`` reads every such file, and also the object form (``{"traceEvents":
[...]}``) that ``merge`` writes. Merging subtracts each file's clock offset (measured
against rank 0 at ``init``), gives participants that two files both call by one number (the
devices of two processes) numbers of their own, ends the spans a dead process left open at its
last event (``"unfinished": true``) and drops ends that lost their beginning.

``spans`` turns a trace into ``Span`` objects (the tools' view), and
``problems`` lists how a trace breaks the format's rules: a begin without its end, spans
of one track that overlap without nesting, timestamps that go back on a track.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .record_calls import LANES
from .recorder import DEVICE_PID

TOLERANCE = 0.002  # microseconds: timestamps and durations are written to the nanosecond


def read_events(path: str | Path) -> list[dict]:
    """The events of one file, in either JSON form, tolerating a missing ``]`` and a torn
    last line."""
    text = Path(path).read_text(encoding="utf-8").strip()
    if not text:
        return []
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc}); a timeline file holds trace events"
                             ) from None
        if not isinstance(data, dict) or "traceEvents" not in data:
            raise ValueError(f"{path}: a JSON object without traceEvents, not a timeline file")
        return _checked(path, data["traceEvents"])
    for attempt in (text, text.rstrip(",") + "]"):
        try:
            return _checked(path, json.loads(attempt))
        except json.JSONDecodeError:
            pass
    lines = [line.strip().rstrip(",") for line in text.splitlines()]
    lines = [line for line in lines if line not in ("", "[", "]")]
    events = []
    for k, line in enumerate(lines):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if k == len(lines) - 1 and events:  # torn by a process that died while writing
                break
            raise ValueError(f"{path}: line {k + 2} is not a trace event: {line[:80]!r}") from None
    return _checked(path, events)


def _checked(path: str | Path, events: object) -> list[dict]:
    """``events`` as a list of trace events, or ValueError saying where the file is not one:
    each an object, and a span's (B, E, X) with a number ``ts`` (an X's ``dur`` too)."""
    if not isinstance(events, list):
        raise ValueError(f"{path}: its traceEvents ({str(events)[:40]}) are not a list of "
                         "trace events")
    for k, event in enumerate(events):
        if not isinstance(event, dict):
            raise ValueError(f"{path}: event {k} is {event!r:.60}, not a trace event (an object)")
        if event.get("ph") in ("B", "E", "X") and not (
                isinstance(event.get("ts"), (int, float))
                and isinstance(event.get("dur", 0), (int, float))):
            raise ValueError(f"{path}: event {k} ({str(event)[:80]}) is a span without a "
                             "number ts (or dur)")
    return events


def trace_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    if folder.is_file():
        return [folder]
    if not folder.exists():
        raise FileNotFoundError(f"{folder} does not exist; pass the folder COLLECTIVES_TIMELINE "
                                "named (or one .trace.json file)")
    found = sorted(folder.glob("*.trace.json")) or sorted(folder.glob("*.json"))
    if not found:
        raise FileNotFoundError(f"{folder} holds no timeline files (*.trace.json); record some "
                                "with COLLECTIVES_TIMELINE=PATH or collectives.timeline.start()")
    return found


def _merged(path: Path) -> bool:
    """Whether ``path`` holds a merged trace: the object form ``write`` writes, which opens
    with its events (told from its first bytes: a merged trace is read once, if at all)."""
    with open(path, encoding="utf-8") as f:
        return f.read(64).lstrip().startswith('{"traceEvents"')


def _runs(folder: str | Path, leave_out: str | Path | None) -> tuple[list, list[str]]:
    """The files of ``folder``'s newest run, each with its events, and notes on what was
    left out: merged traces (``merge``'s own output, ``leave_out`` among them) and the files
    of other runs (a folder used again: a file says its run, ``recorder.set_run``). Runs
    whose files were written while the newest run's were count as the newest (a job whose
    parts each began on a communicator of their own, each taking its own rank 0's token):
    an older run ended before the newest began."""
    runs: dict[str, list[tuple[Path, list[dict]]]] = defaultdict(list)
    began: dict[str, float] = {}  # a run's earliest process start (wall clock)
    notes = []
    out = Path(leave_out).resolve() if leave_out is not None else None
    for path in trace_files(folder):
        if path.resolve() == out or _merged(path):
            notes.append(f"{path}: a merged trace, left out")
            continue
        mine = read_events(path)
        said = [e.get("args", {}) for e in mine
                if e.get("ph") == "M" and e.get("name") == "collectives_run"]
        run = said[-1].get("run", "") if said else ""  # (the last: init names the job's)
        runs[run].append((path, mine))
        started = said[-1].get("started") if said else None
        began[run] = min(began.get(run, float("inf")),
                         started if isinstance(started, (int, float)) else path.stat().st_mtime)
    if not runs:
        raise ValueError(f"{folder} holds no timeline files of a run (only merged traces)")
    ended = {r: max(p.stat().st_mtime for p, _ in files) for r, files in runs.items()}
    newest = max(runs, key=lambda r: ended[r])
    kept = [r for r in runs if r == newest or ended[r] > began[newest]]
    for run, files in runs.items():
        if run not in kept:
            notes.append(f"{len(files)} file(s) of an older run, left out: "
                         f"{', '.join(p.name for p, _ in files)}")
    return [f for r in kept for f in runs[r]], notes


def merge(folder: str | Path, leave_out: str | Path | None = None) -> dict:
    """The newest run's files of ``folder`` as one trace (the object form), clocks lined up;
    what was left out is in ``otherData["left_out"]`` (see ``_runs``)."""
    events: list[dict] = []
    offsets: dict[str, float] = {}
    taken: set[int] = set()
    spare = iter(range(2 * DEVICE_PID, 1 << 30))
    files, notes = _runs(folder, leave_out)
    for path, mine in files:
        offset = next((e["args"].get("offset_us", 0.0) for e in mine
                       if e.get("ph") == "M" and e.get("name") == "collectives_clock"), 0.0)
        offsets[path.name] = offset
        mine = [e for e in mine if e.get("name") != "collectives_run"]  # (read above)
        renamed: dict[int, int] = {}
        for pid in sorted({e.get("pid", 0) for e in mine}):
            # devices of two processes, or ranks of two communicators each process began on
            # (two halves of a job, each its own ranks 0..): numbered apart
            if pid in taken:
                renamed[pid] = next(p for p in spare if p not in taken)
        taken.update(renamed.get(e.get("pid", 0), e.get("pid", 0)) for e in mine)
        for event in mine:
            event = dict(event)
            if "ts" in event:
                event["ts"] = round(event["ts"] - offset, 3)
            pid = event.get("pid", 0)
            if pid in renamed:
                event["pid"] = renamed[pid]
                if event.get("name") == "process_name":
                    event["args"] = {**event["args"],
                                     "name": f"{event['args'].get('name', pid)} ({path.stem})"}
            events.append(event)
    if not any(e.get("ph") != "M" for e in events):
        raise ValueError(f"{folder} holds no timeline events (its files are empty or hold "
                         "names only)")
    events = _repaired(events)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"clock_offsets_us": offsets, "left_out": notes}}


def _repaired(events: list[dict]) -> list[dict]:
    """Metadata first, then by time (stable, so a track keeps its order); ends without a
    beginning dropped, beginnings without an end ended at their participant's last event."""
    meta = [e for e in events if e.get("ph") == "M"]
    timed = sorted((e for e in events if e.get("ph") != "M"), key=lambda e: e.get("ts", 0))
    last: dict[int, float] = defaultdict(float)
    for event in timed:
        end = event.get("ts", 0) + event.get("dur", 0)
        last[event.get("pid", 0)] = max(last[event.get("pid", 0)], end)
    stacks: dict[tuple, list[dict]] = defaultdict(list)
    kept = []
    for event in timed:
        key = (event.get("pid", 0), event.get("tid", 0))
        if event.get("ph") == "B":
            stacks[key].append(event)
        elif event.get("ph") == "E":
            if not stacks[key]:
                continue
            stacks[key].pop()
        kept.append(event)
    for (pid, tid), open_ in stacks.items():
        for _ in open_:
            kept.append({"ph": "E", "pid": pid, "tid": tid, "ts": last[pid],
                         "args": {"unfinished": True}})
    return meta + kept


@dataclass
class Span:
    """A span of a trace: a B/E pair or an X event, in microseconds."""

    pid: int
    tid: int
    name: str
    cat: str
    start: float
    end: float
    args: dict = field(default_factory=dict)
    depth: int = 0

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def comm(self) -> int:
        return self.tid // LANES


def load(path: str | Path) -> list[dict]:
    """A trace's events: a merged file, one process's file, or a folder (merged here)."""
    path = Path(path)
    if path.is_dir():
        return merge(path)["traceEvents"]
    events = read_events(path)
    if not events:  # (an empty file read as a trace without calls, and a summary said so)
        raise ValueError(f"{path} is empty: a timeline file holds trace events")
    return events


def spans(events: list[dict]) -> list[Span]:
    """Every span, ordered by start; B/E pairs matched per track (an E's args merge into its
    span's), depth counted in B/E nesting."""
    out: list[Span] = []
    stacks: dict[tuple, list[Span]] = defaultdict(list)
    for event in events:
        ph, key = event.get("ph"), (event.get("pid", 0), event.get("tid", 0))
        if ph == "B":
            span = Span(key[0], key[1], event.get("name", ""), event.get("cat", ""),
                        event["ts"], event["ts"], dict(event.get("args") or {}),
                        len(stacks[key]))
            stacks[key].append(span)
        elif ph == "E" and stacks[key]:
            span = stacks[key].pop()
            span.end = event["ts"]
            span.args.update(event.get("args") or {})
            out.append(span)
        elif ph == "X":
            out.append(Span(key[0], key[1], event.get("name", ""), event.get("cat", ""),
                            event["ts"], event["ts"] + event.get("dur", 0),
                            dict(event.get("args") or {}), len(stacks[key])))
    out.sort(key=lambda s: (s.start, -s.end))
    return out


def names(events: list[dict]) -> dict[int, str]:
    """Participants' names (``rank 3``, ``device 0``), by pid."""
    return {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name"}


def problems(events: list[dict]) -> list[str]:
    """How ``events`` (in file order) break the trace format's rules; empty when they keep
    them: every B has its E on its track, in order; timestamps never go back on a track; the
    spans of a track (B/E pairs and X events) nest."""
    found: list[str] = []
    stacks: dict[tuple, list[dict]] = defaultdict(list)
    latest: dict[tuple, float] = {}
    intervals: dict[tuple, list[tuple]] = defaultdict(list)
    for n, event in enumerate(events):
        ph, key = event.get("ph"), (event.get("pid", 0), event.get("tid", 0))
        if ph == "M":
            continue
        ts = event.get("ts")
        if ts is None:
            found.append(f"event {n} ({ph}) has no timestamp")
            continue
        if ts < latest.get(key, float("-inf")) - TOLERANCE:
            found.append(f"event {n} ({ph} {event.get('name', '')}) on {key} goes back in "
                         f"time: {ts} after {latest[key]}")
        latest[key] = max(ts, latest.get(key, ts))
        if ph == "B":
            stacks[key].append(event)
        elif ph == "E":
            if not stacks[key]:
                found.append(f"event {n}: an end on {key} at {ts} without a beginning")
                continue
            begun = stacks[key].pop()
            intervals[key].append((begun["ts"], ts, begun.get("name", "")))
        elif ph == "X":
            if event.get("dur", 0) < 0:
                found.append(f"event {n} ({event.get('name')}) has a negative duration")
            intervals[key].append((ts, ts + event.get("dur", 0), event.get("name", "")))
    for key, open_ in stacks.items():
        for event in open_:
            found.append(f"{event.get('name')} on {key} at {event['ts']} never ends")
    for key, spans_ in intervals.items():
        stack: list[tuple] = []
        for start, end, name in sorted(spans_, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start + TOLERANCE:
                stack.pop()
            if stack and end > stack[-1][1] + TOLERANCE:
                found.append(f"{name} [{start}, {end}] on {key} overlaps {stack[-1][2]} "
                             f"[{stack[-1][0]}, {stack[-1][1]}] without nesting in it")
            stack.append((start, end, name))
    return found


def write(trace: dict, path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f, separators=(",", ":"))
