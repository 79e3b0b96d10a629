"""The end of ``benchmarks/gpu_run.sh``: one ``results.json`` from the parts' JSON files and
the steps' statuses, and a ``summary.txt`` a person reads first (what ran, what passed, the
numbers the GPU targets are about).

    python benchmarks/gpu_summary.py WORK OUT
    python benchmarks/gpu_summary.py --junit-from-log TESTS_LOG JUNIT

``WORK`` holds ``steps.tsv`` (name, exit status, seconds, limit), ``junit.xml``, the parts'
``gpu_compare_*.json`` and ``probe.json``; ``OUT`` receives ``results.json`` and
``summary.txt``. Whatever is missing is said to be missing. ``--junit-from-log`` writes the
JUnit file of a pytest run stopped before it wrote its own, from the outcomes ``pytest -v``
printed as each test finished, and one error for the run that did not finish.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# pytest -v's line for a finished test, alone ("ID PASSED [ 4%]") or under xdist
# ("[gw3] [ 4%] PASSED ID")
OUTCOMES = "PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS"
_ALONE = re.compile(rf"^(\S+\.py::.+?) ({OUTCOMES})(?:\s+\[\s*\d+%\])?\s*$")
_XDIST = re.compile(rf"^\[gw\d+\] \[\s*\d+%\] ({OUTCOMES}) (\S+\.py::.+?)\s*$")

TIMED_OUT = (124, 137)
EARLIER_TARGETS = ("earlier targets: the best algorithm at >= 64 MiB reaches >= 80% of the "
                   "copy-rate bound for its bytes moved; the one-rank NCCL call adds <= 15 us "
                   "at 4 KiB and is within 5% of bare NCCL at >= 1 MiB")
# The peer benchmark's targets, like for like (gpu_peers.py): (part, the row's kind, ratio,
# mark, what it says). A target is met ("yes") where the ratio's interval lies at or below the
# mark, missed ("no") where it lies above, unresolved where it straddles the mark.
_STEP, _CALL = "gradient list, one step", "overhead, in place"
TARGETS = (
    ("resnet50", _STEP, "library_torch/torch_flat_views", 0.8, "gradient list, views, PyTorch"),
    ("resnet50", _STEP, "library_cupy/torch_flat_views", 0.8, "gradient list, views, CuPy"),
    ("resnet50", _STEP, "library_torch_copy_back/torch_flat_copy_back", 0.8,
     "gradient list, copied back, PyTorch"),
    ("resnet50", _STEP, "library_cupy_copy_back/torch_flat_copy_each", 0.8,
     "gradient list, copied back, CuPy"),
    ("per-call", _CALL, "library_cupy/torch_dist", 1.0, "per call, CuPy"),
    ("per-call", _CALL, "library_torch/torch_dist", 1.0, "per call, PyTorch"),
    ("per-call", _CALL, "library_cupy_async/torch_dist_async", 1.0, "per call, async, CuPy"),
    ("per-call", _CALL, "library_torch_async/torch_dist_async", 1.0, "per call, async, PyTorch"),
    ("multi-device", "gradient list", "library_batch/fused_per_tensor", 1.2,
     "multi-device list beside the fused-kernel loop"),
    ("multi-device", "one all-reduce", "library_auto/best_choice", 1.1,
     "auto beside the fastest algorithm or naive sum"),
    ("overlap", None, "step/longer", 1.1, "overlapped step beside the longer of the two"),
)


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def steps(work: Path) -> list[dict]:
    out = []
    path = work / "steps.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        name, rc, seconds, limit = line.split("\t")
        rc = int(rc)
        out.append({"step": name, "exit": rc, "seconds": int(seconds), "limit": int(limit),
                    "status": "ok" if rc == 0 else "timed out" if rc in TIMED_OUT else "failed"})
    return out


def junit(path: Path) -> dict | None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    totals = {k: sum(int(s.get(k, 0)) for s in suites)
              for k in ("tests", "failures", "errors", "skipped")}
    totals["failed"] = [f"{case.get('classname')}::{case.get('name')}"
                        for case in root.iter("testcase")
                        if case.find("failure") is not None or case.find("error") is not None]
    skips: dict[str, int] = {}
    for case in root.iter("testcase"):
        skip = case.find("skipped")
        if skip is not None:
            reason = (skip.get("message") or "").strip()
            skips[reason] = skips.get(reason, 0) + 1
    totals["skip_reasons"] = skips
    return totals


def junit_from_log(log: Path, out: Path) -> dict[str, str]:
    """Write ``out``, a JUnit file of the outcomes in ``log`` plus one error saying pytest did
    not finish; the outcomes by test id."""
    outcomes: dict[str, str] = {}
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        alone, xdist = _ALONE.match(line), _XDIST.match(line)
        if alone:
            outcomes[alone.group(1)] = alone.group(2)
        elif xdist:
            outcomes[xdist.group(2)] = xdist.group(1)
    suite = ET.Element("testsuite", name="pytest", tests=str(len(outcomes) + 1))
    counts = {"failures": 0, "errors": 1, "skipped": 0}
    for test, outcome in outcomes.items():
        path, _, name = test.partition("::")
        case = ET.SubElement(suite, "testcase", classname=path.removesuffix(".py")
                             .replace("/", "."), name=name)
        tag = {"FAILED": "failure", "ERROR": "error", "SKIPPED": "skipped"}.get(outcome)
        if tag is not None:
            ET.SubElement(case, tag, message=f"{outcome} (from the log: see logs/tests.log)")
            counts[{"failure": "failures", "error": "errors"}.get(tag, tag)] += 1
    stopped = ET.SubElement(suite, "testcase", classname="gpu_run", name="tests")
    ET.SubElement(stopped, "error", message="pytest did not finish within the step's time "
                  f"limit ({len(outcomes)} tests had finished); see logs/tests.log")
    suite.attrib.update({k: str(v) for k, v in counts.items()})
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
    return outcomes


def peer_ratios(parts: dict) -> list[str]:
    """The peer benchmark's ratios with their intervals (``gpu_peers.py``), one line a row."""
    lines = []
    for part in ("per-call", "resnet50", "multi-device", "overlap"):
        for r in (parts.get(part) or {}).get("rows", []):
            ratios = [f"{k} {v['ratio']:.2f} [{v['interval'][0]:.2f}, {v['interval'][1]:.2f}]"
                      for k, v in r.items() if isinstance(v, dict) and "interval" in v]
            if ratios:
                what = r.get("kind") or r.get("arrays", "")
                size = f" {r['size'] >> 10} KiB" if "size" in r else ""
                lines.append(f"{part} ({what}{size}): " + "; ".join(ratios))
    return lines


def verdict(lo: float, hi: float, mark: float) -> str:
    """``model_stats.verdict``'s rule (this script also runs on a bare ``python3``, without
    the NumPy that module needs): met where the interval lies at or below ``mark``."""
    return "yes" if hi <= mark else "no" if lo > mark else "unresolved"


def _where(r: dict) -> str:
    return (f" at {r['size'] >> 10} KiB" if "size" in r else "") + (
        f" ({r['arrays']})" if "arrays" in r else "")


def target_lines(parts: dict) -> list[str]:
    """Each target of the peer benchmark, row by row: met, missed or unresolved, with the
    ratio and its interval; "not measured" where its part or way did not run."""
    lines = []
    for part, kind, key, mark, text in TARGETS:
        rows = [r for r in (parts.get(part) or {}).get("rows", [])
                if kind is None or r.get("kind") == kind]
        judged = [(r, r[key]) for r in rows if isinstance(r.get(key), dict)]
        if not judged:
            lines.append(f"  {text} (<= {mark}): not measured")
        for r, got in judged:
            lo, hi = got["interval"]
            lines.append(f"  {text}{_where(r)} (<= {mark}): {verdict(lo, hi, mark)}, "
                         f"{got['ratio']:.2f} [{lo:.2f}, {hi:.2f}]")
    return ["targets (like for like; yes: the interval lies at or below the mark):", *lines]


def peer_notes(parts: dict) -> list[str]:
    """The per-call medians in µs, and every way that failed (its error)."""
    lines = []
    for r in (parts.get("per-call") or {}).get("rows", []):
        if r.get("kind") == "overhead, in place":
            lines.append(f"per call{_where(r)}, medians: " + ", ".join(
                f"{k[:-3]} {v:.1f} us" for k, v in r.items()
                if k.endswith("_us") and isinstance(v, float)))
    for part in ("per-call", "resnet50", "multi-device", "overlap"):
        for r in (parts.get(part) or {}).get("rows", []):
            lines += [f"{part} ({r.get('kind') or r.get('arrays', '')}{_where(r)}): "
                      f"{k[:-6]} FAILED: {v}" for k, v in r.items() if k.endswith("_error")]
    return lines


def headline(parts: dict) -> list[str]:
    """The numbers of the GPU targets, from the parts that ran."""
    lines = peer_ratios(parts) + peer_notes(parts)
    copy = parts.get("copy")
    if copy and copy.get("copy_GBps"):
        lines.append(f"copy rate (device to device): {copy['copy_GBps']:.1f} GB/s")
    devices = parts.get("devices")
    if devices and devices.get("rows"):
        big = [r for r in devices["rows"] if r["size"] >= 64 << 20]
        if big:
            best = max(big, key=lambda r: (r["size"], r["busbw"]))
            frac = best.get("copy_fraction")
            lines.append(f"devices: best at {best['size'] >> 20} MiB: {best['algorithm']} busbw "
                         f"{best['busbw']:.1f} GB/s"
                         + (f", {100 * frac:.0f}% of the copy-rate bound" if frac else ""))
        wrong = sum(r["wrong"] or 0 for r in devices["rows"]) + sum(
            (r["inplace"] or {}).get("wrong") or 0 for r in devices["rows"])
        lines.append(f"devices: {len(devices['rows'])} rows, {wrong} wrong elements")
    one = parts.get("one-rank")
    if one and one.get("rows"):
        small = next((r for r in one["rows"] if r["size"] == 4 << 10), None)
        if small:
            lines.append(f"one-rank NCCL at 4 KiB: library +{small['library_overhead_us']:.1f} "
                         f"us, nccl backend +{small['backend_overhead_us']:.1f} us over bare "
                         f"{small['bare_us']:.1f} us")
        large = [r for r in one["rows"] if r["size"] >= 1 << 20]
        if large:
            worst = max(r["library_ratio"] for r in large)
            worst_b = max(r["backend_ratio"] for r in large)
            lines.append(f"one-rank NCCL at >= 1 MiB: time / bare <= {worst:.3f} (library), "
                         f"<= {worst_b:.3f} (nccl backend)")
    two = parts.get("two-level")
    if two and two.get("rows"):
        last = two["rows"][-1]
        lines.append(f"two-level at {last['size'] >> 10} KiB: {last['two_level_us']:.0f} us vs "
                     f"MPI over host copies {last['staging_us']:.0f} us")
    torch = parts.get("torch")
    if torch:
        if torch.get("skipped"):
            lines.append(f"torch: skipped ({torch['skipped']})")
        elif torch.get("rows"):
            r = torch["rows"][0]
            lines.append(f"torch tensors at {r['size'] >> 10} KiB: +{r['dlpack_overhead_us']:.1f}"
                         " us over CuPy arrays")
    return lines


def main() -> None:
    if sys.argv[1] == "--junit-from-log":
        junit_from_log(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    work, out = Path(sys.argv[1]), Path(sys.argv[2])
    parts = {}
    for path in sorted([*work.glob("gpu_compare_*.json"), *work.glob("gpu_peers_*.json")]):
        data = _load(path)
        if data is not None:
            parts[data.get("part", path.stem)] = data
    meta = _load(work / "run.json") or {}
    result = {**meta, "steps": steps(work), "tests": junit(work / "junit.xml"),
              "probe": _load(work / "probe.json"), "parts": parts}
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    lines = [f"gpu_run ({meta.get('mode', '?')} mode) of checkout {meta.get('commit', '?')} on "
             f"{meta.get('device', '?')}, {meta.get('date', '?')}"]
    if meta.get("mode") == "cpu":
        lines.append("CPU dry run under a NumPy stand-in for CuPy: nothing here ran on a GPU")
    probe = result["probe"]
    lines.append(f"probe: {probe.get('summary') if probe else 'missing'}")
    for s in result["steps"]:
        lines.append(f"  {s['step']:<12} {s['status']:<10} {s['seconds']:>4} s (limit "
                     f"{s['limit']} s, exit {s['exit']})")
    tests = result["tests"]
    if tests is None:
        lines.append("tests: no JUnit file")
    else:
        lines.append(f"tests: {tests['tests']} run, {tests['failures']} failed, "
                     f"{tests['errors']} errors, {tests['skipped']} skipped")
        lines += [f"  FAILED {name}" for name in tests["failed"]]
        lines += [f"  skipped x{n}: {reason[:150]}" for reason, n in tests["skip_reasons"].items()]
    lines += headline(parts) or ["benchmarks: no numbers"]
    if any(part in parts for part, *_ in TARGETS):
        lines += target_lines(parts)
    lines.append(EARLIER_TARGETS)
    text = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
