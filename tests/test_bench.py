"""``collectives bench``: the CLI end to end (as a subprocess), and the checker it relies on."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import collectives
from collectives import bench, cli
from collectives.ops import ReduceOp

CLI = [sys.executable, "-m", "collectives.cli", "bench"]
FAST = ["-w", "1", "-i", "2", "-r", "2"]
FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
           "reduce": lambda n: 1.0}
COLUMNS = ("size", "count", "type", "redop", "algorithm", "time", "algbw", "busbw", "wrong")


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def parse_table(stdout: str) -> list[dict]:
    """The data rows: every line not starting with '#'."""
    rows = []
    for line in stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        assert len(fields) == len(COLUMNS), line
        row = dict(zip(COLUMNS, fields))
        for key in ("size", "count", "wrong"):
            row[key] = int(row[key])
        for key in ("time", "algbw", "busbw"):
            row[key] = float(row[key])
        rows.append(row)
    return rows


def expected_sizes(collective: str, n: int, lo: int, hi: int, itemsize: int = 4) -> list[int]:
    """Bytes per participant of each row: whole elements, whole blocks of n for the
    all_gather/reduce_scatter (nccl-tests' S = n x per-rank count), duplicates dropped."""
    sizes, size = [], lo
    while size <= hi:
        count = max(1, size // itemsize)
        if collective in ("all_gather", "reduce_scatter"):
            count = max(1, count // n) * n
        if count * itemsize not in sizes:
            sizes.append(count * itemsize)
        size *= 2
    return sizes


@pytest.mark.parametrize("collective, mode, n, lo", [
    ("all_reduce", "devices", 3, 8),
    ("all_reduce", "spmd", 3, 8),
    ("reduce_scatter", "devices", 4, 64),
    ("reduce_scatter", "spmd", 3, 8),
    ("all_gather", "spmd", 4, 64),
    ("all_gather", "devices", 3, 8),
    ("broadcast", "spmd", 3, 8),
    ("reduce", "devices", 3, 8),
])
def test_sweep_table_and_json(tmp_path, collective, mode, n, lo):
    out = tmp_path / "rows.json"
    proc = run_cli("-c", collective, "--mode", mode, "-n", str(n), "-b", str(lo), "-e", "4K",
                   "-a", "ring", "-a", "tree", "--json", str(out), *FAST)
    assert proc.returncode == 0, proc.stderr
    rows = parse_table(proc.stdout)
    header = [line for line in proc.stdout.splitlines() if "busbw" in line]
    assert len(header) == 1 and header[0].startswith("#")

    sizes = expected_sizes(collective, n, lo, 4096)
    assert len(rows) == 2 * len(sizes)
    for algorithm in ("ring", "tree"):
        mine = [r for r in rows if r["algorithm"] == algorithm]
        assert [r["size"] for r in mine] == sizes
    if n == 4 or collective not in ("all_gather", "reduce_scatter"):
        assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))  # sizes double
    factor = FACTORS[collective](n)
    per_rank = collective in ("all_gather", "reduce_scatter")
    for r in rows:
        assert r["wrong"] == 0
        assert r["type"] == "float32"
        assert r["redop"] == ("sum" if collective in bench.REDUCING else "none")
        assert r["size"] == r["count"] * 4 * (n if per_rank else 1)
        assert r["time"] > 0
        assert abs(r["busbw"] - r["algbw"] * factor) <= 0.0015  # printed to 3 decimals

    data = json.loads(out.read_text())
    assert {"command", "machine", "numpy", "date", "rows"} <= set(data)
    assert data["command"].startswith("collectives bench -c " + collective)
    assert data["numpy"] == np.__version__
    assert len(data["rows"]) == len(rows)
    for jr, tr in zip(data["rows"], rows):
        assert (jr["size"], jr["algorithm"], jr["wrong"]) == (tr["size"], tr["algorithm"], 0)
        assert jr["busbw"] == pytest.approx(jr["algbw"] * factor, rel=1e-12)
        assert jr["algbw"] == pytest.approx(jr["size"] / (jr["time_us"] * 1e-6) / 1e9, rel=1e-12)
        assert jr["time_us"] == pytest.approx(float(np.median(jr["repeats_us"])), rel=1e-12)


def test_defaults_adapt_iterations_and_plot(tmp_path):
    png = tmp_path / "busbw.png"
    proc = run_cli("-b", "1K", "-e", "4K", "-a", "auto,one_device", "--plot", str(png),
                   "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    rows = parse_table(proc.stdout)
    assert [(r["size"], r["algorithm"]) for r in rows] == [
        (s, a) for s in (1024, 2048, 4096) for a in ("auto", "one_device")]
    data = json.loads((tmp_path / "r.json").read_text())
    for r in data["rows"]:
        assert len(r["repeats_us"]) == 5
        assert 1 <= r["iters"] <= bench.MAX_ITERS
        # adapted so that a repeat lasts about 20 ms (unless capped at MAX_ITERS)
        assert r["iters"] == bench.MAX_ITERS or r["iters"] * r["time_us"] > 5e3
        assert r["resolved"] in ("one_device", "ring", "rechd", "tree", "shuffle")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_other_dtype_and_op():
    proc = run_cli("-d", "bfloat16", "-o", "max", "-n", "5", "-b", "64", "-e", "256",
                   "-a", "rechd,pscpu", *FAST)
    assert proc.returncode == 0, proc.stderr
    rows = parse_table(proc.stdout)
    assert len(rows) == 6
    assert {(r["type"], r["redop"], r["wrong"]) for r in rows} == {("bfloat16", "max", 0)}


def test_bad_algorithm_exits_nonzero_naming_it():
    proc = run_cli("-a", "ring,warp_drive", "-e", "1K")
    assert proc.returncode != 0
    assert "warp_drive" in proc.stderr
    assert not parse_table(proc.stdout)


def test_algorithm_without_that_collective_is_refused():
    proc = run_cli("-c", "broadcast", "-a", "rechd", "-e", "1K")
    assert proc.returncode != 0 and "rechd" in proc.stderr and "broadcast" in proc.stderr


def test_parse_size():
    assert bench.parse_size("8") == 8
    assert bench.parse_size("4K") == 4096
    assert bench.parse_size("64M") == 64 << 20
    assert bench.parse_size("1g") == 1 << 30
    assert bench.parse_size("2KiB") == 2048
    with pytest.raises(ValueError, match="12Q"):
        bench.parse_size("12Q")


# --- the checker --------------------------------------------------------------------------------

def test_count_wrong_counts_corrupted_elements():
    case = bench.Case("all_reduce", 4, np.dtype(np.float32), ReduceOp.SUM, 0, 1000)
    expected = bench.expected_outputs(case)
    outputs = [e.copy() for e in expected]
    assert bench.count_wrong(outputs, expected) == 0
    outputs[1][[3, 500, 999]] += 1
    outputs[3][0] = np.nan
    assert bench.count_wrong(outputs, expected) == 4
    outputs[2] = None  # a participant that produced nothing: all of it is wrong
    assert bench.count_wrong(outputs, expected) == 4 + 1000
    outputs[2] = expected[2][:10]  # the wrong size: likewise
    assert bench.count_wrong(outputs, expected) == 4 + 1000


@pytest.mark.parametrize("collective", bench.COLLECTIVES)
@pytest.mark.parametrize("dtype, op", [("float32", "sum"), ("float16", "mean"), ("int8", "prod"),
                                       ("bfloat16", "min")])
def test_expected_outputs_match_a_direct_reduction(collective, dtype, op):
    """The periodic shortcut gives what reducing the full inputs in float64 gives."""
    n, count = 3, 200
    dt = bench.parse_dtype(dtype)
    op = ReduceOp.parse(op) if collective in bench.REDUCING else ReduceOp.SUM
    case = bench.Case(collective, n, dt, op, 1, count)
    total = count * n if collective == "reduce_scatter" else count
    inputs = [bench.make_input(total, p, dt) for p in range(n)]
    wide = [x.astype(np.float64) for x in inputs]
    full = {ReduceOp.SUM: sum(wide), ReduceOp.MEAN: sum(wide) / n,
            ReduceOp.PROD: wide[0] * wide[1] * wide[2],
            ReduceOp.MIN: np.minimum.reduce(wide)}[op]
    full = full.astype(dt if op is not ReduceOp.MEAN or dt.kind == "f" else np.float64)
    got = bench.expected_outputs(case)
    if collective == "all_reduce":
        want = [full] * n
    elif collective == "reduce":
        want = [None, full, None]
    elif collective == "broadcast":
        want = [inputs[1]] * n
    elif collective == "all_gather":
        want = [np.concatenate(inputs)] * n
    else:
        want = [full[p * count:(p + 1) * count] for p in range(n)]
    for g, w in zip(got, want):
        if w is None:
            assert g is None
        else:
            assert g.dtype == w.dtype and np.array_equal(g, w)


def test_bench_reports_wrong_results_and_fails(monkeypatch, capsys):
    """A collective that corrupts one element of one device shows #wrong 1 and exit status 1."""
    real = collectives.all_reduce

    def broken(values, op="sum", algorithm="auto", **kw):
        out = real(values, op, algorithm, **kw)
        out[2][5] += 1
        return out

    monkeypatch.setattr(collectives, "all_reduce", broken)
    status = cli.main(["bench", "-n", "3", "-b", "64", "-e", "128", "-a", "ring", *FAST])
    rows = parse_table(capsys.readouterr().out)
    assert status == 1
    assert [r["wrong"] for r in rows] == [1, 1]


def test_spmd_bench_counts_wrong_over_ranks(monkeypatch):
    """bench_spmd takes any Communicator; wrong elements on any rank reach every rank's rows."""
    real = collectives.Communicator.reduce_scatter

    def broken(self, x, *args, **kw):
        out = real(self, x, *args, **kw)
        if self.rank == 1:
            out = out.copy()
            out[:2] = -1
        return out

    monkeypatch.setattr(collectives.Communicator, "reduce_scatter", broken)
    config = bench.BenchConfig(collective="reduce_scatter", algorithms=("ring",), participants=3,
                               mode="spmd", minbytes=96, maxbytes=192, warmup=0, iters=1,
                               repeats=1)
    per_rank = collectives.run(bench.bench_spmd, 3, args=(config,))
    assert [[r["wrong"] for r in rows] for rows in per_rank] == [[2, 2]] * 3
    assert [r["size"] for r in per_rank[0]] == [96, 192]
