"""``collectives bench``: the CLI end to end (as a subprocess), the checker it relies on, and
``collectives.tools.reference`` (exact inputs, the float64 reference, the per-collective records)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest

import collectives
from collectives.ops import ReduceOp, check_dtype, supported_dtypes
from collectives.tools import bench, cli, reference

CLI = [sys.executable, "-m", "collectives.tools.cli", "bench"]
FAST = ["-w", "1", "-i", "2", "-r", "2"]
FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
           "reduce": lambda n: 1.0, "gather": lambda n: (n - 1) / n,
           "scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
           "batch_all_reduce": lambda n: 2 * (n - 1) / n}
COLUMNS = ("size", "count", "type", "redop", "request", "algorithm", "time", "algbw", "busbw",
           "wrong", "ip_time", "ip_algbw", "ip_busbw", "ip_wrong")
INPLACE = ({("devices", c) for c in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter")}
           | {("spmd", "all_reduce"), ("spmd", "broadcast"), ("spmd", "scatter")})
BLOCKED = ("all_gather", "reduce_scatter", "gather", "scatter", "all_to_all")


@pytest.fixture
def run_cli(python):
    """``collectives bench ARGS`` (``python -m``, forked: conftest's ``python``)."""
    def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return python(*CLI[1:], *args, timeout=timeout)
    return run


def parse_table(stdout: str) -> list[dict]:
    """The data rows: every line not starting with '#'."""
    rows = []
    for line in stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        assert len(fields) == len(COLUMNS), line
        row = dict(zip(COLUMNS, fields))
        for key in ("size", "count", "wrong", "ip_wrong"):
            row[key] = None if row[key] == "N/A" else int(row[key])
        for key in ("time", "algbw", "busbw", "ip_time", "ip_algbw", "ip_busbw"):
            row[key] = None if row[key] == "N/A" else float(row[key])
        rows.append(row)
    return rows


def expected_sizes(collective: str, n: int, lo: int, hi: int, itemsize: int = 4) -> list[int]:
    """Bytes per participant of each row: whole elements, whole blocks of n for the
    all_gather/reduce_scatter (nccl-tests' S = n x per-rank count), duplicates dropped."""
    sizes, size = [], lo
    while size <= hi:
        count = max(1, size // itemsize)
        if collective in BLOCKED:
            count = max(1, count // n) * n
        if count * itemsize not in sizes:
            sizes.append(count * itemsize)
        size *= 2
    return sizes


SLOW = pytest.mark.slow  # one per collective and mode stays in the quick subset


@pytest.mark.parametrize("collective, mode, n, lo", [
    ("all_reduce", "devices", 3, 8),
    ("all_reduce", "spmd", 3, 8),
    ("reduce_scatter", "devices", 4, 64),
    pytest.param("reduce_scatter", "spmd", 3, 8, marks=SLOW),
    ("all_gather", "spmd", 4, 64),
    pytest.param("all_gather", "devices", 3, 8, marks=SLOW),
    ("broadcast", "spmd", 3, 8),
    ("reduce", "devices", 3, 8),
    pytest.param("gather", "spmd", 3, 8, marks=SLOW),
    ("scatter", "spmd", 4, 64),
    pytest.param("all_to_all", "spmd", 3, 8, marks=SLOW),
    pytest.param("batch_all_reduce", "devices", 3, 8, marks=SLOW),
    ("batch_all_reduce", "spmd", 3, 64),
])
def test_sweep_table_and_json(tmp_path, collective, mode, n, lo, run_cli):
    out = tmp_path / "rows.json"
    names = {"gather": ("tree", "shuffle"), "scatter": ("tree", "shuffle"),
             "all_to_all": ("ring", "shuffle")}.get(collective, ("ring", "tree"))
    proc = run_cli("-c", collective, "--mode", mode, "-n", str(n), "-b", str(lo), "-e", "4K",
                   "-a", names[0], "-a", names[1], "--json", str(out), *FAST)
    assert proc.returncode == 0, proc.stderr
    rows = parse_table(proc.stdout)
    header = [line for line in proc.stdout.splitlines() if "busbw" in line]
    assert len(header) == 1 and header[0].startswith("#")
    title = [line for line in proc.stdout.splitlines() if "out-of-place" in line]
    assert len(title) == 1 and title[0].startswith("#") and "in-place" in title[0]

    sizes = expected_sizes(collective, n, lo, 4096)
    assert len(rows) == 2 * len(sizes)
    for algorithm in names:
        mine = [r for r in rows if r["request"] == algorithm]
        assert [r["size"] for r in mine] == sizes
        assert {r["algorithm"] for r in mine} == {algorithm}  # what ran
    if n == 4 or collective not in BLOCKED:
        assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))  # sizes double
    factor = FACTORS[collective](n)
    per_rank = collective in BLOCKED
    inplace = (mode, collective) in INPLACE
    for r in rows:
        assert r["wrong"] == 0
        assert r["type"] == "float32"
        assert r["redop"] == ("sum" if collective in bench.REDUCING else "none")
        assert r["size"] == r["count"] * 4 * (n if per_rank else 1)
        assert r["time"] > 0
        assert abs(r["busbw"] - r["algbw"] * factor) <= 0.0015  # printed to 3 decimals
        if inplace:
            assert r["ip_wrong"] == 0 and r["ip_time"] > 0
            assert abs(r["ip_busbw"] - r["ip_algbw"] * factor) <= 0.0015
        else:  # that call takes no out=: nothing to run in place
            assert (r["ip_time"], r["ip_wrong"]) == (None, None)

    data = json.loads(out.read_text())
    assert {"command", "machine", "numpy", "date", "rows"} <= set(data)
    assert data["command"].startswith("collectives bench -c " + collective)
    assert data["numpy"] == np.__version__
    assert len(data["rows"]) == len(rows)
    for jr, tr in zip(data["rows"], rows):
        assert (jr["size"], jr["algorithm"], jr["resolved"], jr["wrong"]) == (
            tr["size"], tr["request"], tr["algorithm"], 0)
        halves = [jr, jr["inplace"]] if inplace else [jr]
        assert (jr["inplace"] is None) == (not inplace)
        for half in halves:
            assert half["busbw"] == pytest.approx(half["algbw"] * factor, rel=1e-12)
            assert half["algbw"] == pytest.approx(jr["size"] / (half["time_us"] * 1e-6) / 1e9,
                                                  rel=1e-12)
            assert half["time_us"] == pytest.approx(float(np.median(half["repeats_us"])), rel=1e-12)


def test_defaults_adapt_iterations_and_plot(tmp_path, run_cli):
    png = tmp_path / "busbw.png"
    proc = run_cli("-b", "1K", "-e", "4K", "-a", "auto,one_device", "--plot", str(png),
                   "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    rows = parse_table(proc.stdout)
    assert [(r["size"], r["request"]) for r in rows] == [
        (s, a) for s in (1024, 2048, 4096) for a in ("auto", "one_device")]
    data = json.loads((tmp_path / "r.json").read_text())
    for r, printed in zip(data["rows"], rows):
        for half in (r, r["inplace"]):
            assert len(half["repeats_us"]) == 5
            assert 1 <= half["iters"] <= bench.MAX_ITERS  # adapted (see test_measure_adapts_...)
        assert r["resolved"] in ("one_device", "ring", "rechd", "tree", "shuffle")
        assert printed["algorithm"] == r["resolved"]  # the table says what auto ran
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_auto_prints_what_the_cost_model_picks(run_cli):
    """The algorithm column of an auto row is what collectives.api.multi_device.pick_algorithm resolves."""
    from collectives.api.multi_device import pick_algorithm
    from collectives.registry import backend_for_arrays

    proc = run_cli("-n", "5", "-b", "8", "-e", "8M", "-f", "32", "-a", "auto", "-w", "0", "-i", "1",
                   "-r", "1", "--no-check")
    assert proc.returncode == 0, proc.stderr
    model = backend_for_arrays([np.zeros(1)]).cost_model
    rows = parse_table(proc.stdout)
    assert len(rows) == 5
    for r in rows:
        assert r["algorithm"] == pick_algorithm(collectives.Collective.ALL_REDUCE, "auto", 5,
                                                r["size"], model)[0]
        assert r["wrong"] is None and r["ip_wrong"] is None  # --no-check


def test_other_dtype_and_op(run_cli):
    proc = run_cli("-d", "bfloat16", "-o", "max", "-n", "5", "-b", "64", "-e", "256",
                   "-a", "rechd,pscpu", *FAST)
    assert proc.returncode == 0, proc.stderr
    rows = parse_table(proc.stdout)
    assert len(rows) == 6
    assert {(r["type"], r["redop"], r["wrong"], r["ip_wrong"]) for r in rows} == {
        ("bfloat16", "max", 0, 0)}


@pytest.mark.parametrize("mode", ["devices", "spmd"])
def test_in_place_timing_does_not_overflow(mode, run_cli):
    """Repeated in-place sums of real data would overflow float16 within a few calls (and warn);
    the timed in-place calls run on zeros, the checked one on the exact inputs."""
    proc = run_cli("--mode", mode, "-d", "float16", "-n", "4", "-b", "64", "-e", "64", "-w", "2",
                   "-i", "20", "-r", "2")
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
    (row,) = parse_table(proc.stdout)
    assert (row["wrong"], row["ip_wrong"]) == (0, 0)


def test_bad_algorithm_exits_nonzero_naming_it(run_cli):
    proc = run_cli("-a", "ring,warp_drive", "-e", "1K")
    assert proc.returncode != 0
    assert "warp_drive" in proc.stderr
    assert not parse_table(proc.stdout)


def test_algorithm_without_that_collective_is_refused(run_cli):
    proc = run_cli("-c", "broadcast", "-a", "rechd", "-e", "1K")
    assert proc.returncode != 0 and "rechd" in proc.stderr and "broadcast" in proc.stderr


def test_measure_adapts_iterations_to_the_target(monkeypatch):
    """With a clock that advances 2**-14 s (61 us) per call, a 20 ms repeat needs 328 calls."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def call():
        clock[0] += 2**-14  # exact in binary: no rounding in the clock's sums

    m = bench.measure(call, warmup=1, repeats=3)
    assert m.iters == math.ceil(bench.TARGET_SECONDS / 2**-14) == 328 and len(m.repeats) == 3
    assert m.seconds == 2**-14
    slow = bench.measure(lambda: clock.__setitem__(0, clock[0] + 1.0), warmup=0, repeats=1)
    assert slow.iters == 1  # one call already outlasts the target
    fast = bench.measure(lambda: clock.__setitem__(0, clock[0] + 1e-9), warmup=0, repeats=1)
    assert fast.iters == bench.MAX_ITERS  # capped


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
    # the right values in the wrong dtype or shape: likewise (they counted as right)
    outputs[2] = expected[2].astype(np.float64)
    assert bench.count_wrong(outputs, expected) == 4 + 1000
    outputs[2] = expected[2].reshape(10, 100)
    assert bench.count_wrong(outputs, expected) == 4 + 1000
    outputs[2] = [expected[2][:500], expected[2][500:].astype(np.float64)]  # a batch's
    assert bench.count_wrong(outputs, expected) == 4 + 1000
    outputs[2] = [expected[2][:500], expected[2][500:]]
    assert bench.count_wrong(outputs, expected) == 4
    # out= buffers beside what was returned: an element wrong in either counts once
    buffers = [e.copy() for e in expected]
    buffers[1][[3, 7]] += 1  # 3 is wrong in both, 7 in the buffer alone
    assert bench.count_wrong(outputs, expected, buffers) == 4 + 1
    buffers[0] = expected[0][:10]  # a buffer of the wrong size: all of it wrong
    assert bench.count_wrong(outputs, expected, buffers) == 4 + 1 + 1000


@pytest.mark.parametrize("lie", ["out= left unwritten", "float64 results"])
def test_the_check_reads_the_out_buffers_and_the_dtype(lie, monkeypatch):
    # (a call returning right values but leaving out= unwritten, or returning float64 for
    # float32, was reported "0 wrong" in both halves)
    def all_reduce(xs, op, algorithm, out=None):
        results = collectives.all_reduce(xs, op, algorithm)  # (out= not passed on)
        return results if lie == "out= left unwritten" else [r.astype(np.float64) for r in results]

    config = bench.BenchConfig(participants=4, minbytes=64, maxbytes=64, algorithms=("ring",),
                               warmup=0, iters=1, repeats=1)
    (honest,) = bench.bench_devices(config)
    assert honest["wrong"] == honest["inplace"]["wrong"] == 0
    monkeypatch.setattr(bench.NUMPY_KIT, "api", type("Api", (), {"all_reduce": all_reduce}))
    (row,) = bench.bench_devices(config)
    assert row["wrong"] > 0 and row["inplace"]["wrong"] > 0


@pytest.mark.parametrize("collective", bench.COLLECTIVES)
@pytest.mark.parametrize("dtype, op", [("float32", "sum"), ("float16", "mean"), ("int8", "prod"),
                                       ("bfloat16", "min"), ("int16", "mean")])
def test_expected_outputs_match_a_direct_reduction(collective, dtype, op):
    """The periodic shortcut gives what reducing the full inputs in float64 gives, and what
    collectives.tools.reference.expected_outputs gives."""
    n, count = 3, 200
    dt = bench.parse_dtype(dtype)
    op = ReduceOp.parse(op) if collective in bench.REDUCING else ReduceOp.SUM
    case = bench.Case(collective, n, dt, op, 1, count)
    inputs = case.inputs()
    whole = collective in ("reduce_scatter", "scatter", "all_to_all")  # n blocks per input
    assert [x.size for x in inputs] == [count * n if whole else count] * n
    wide = [x.astype(np.float64) for x in inputs]
    full = {ReduceOp.SUM: sum(wide), ReduceOp.MEAN: sum(wide),
            ReduceOp.PROD: wide[0] * wide[1] * wide[2],
            ReduceOp.MIN: np.minimum.reduce(wide)}[op].astype(dt)
    if op is ReduceOp.MEAN:  # the library's MEAN: the exact sum, then one division
        full = np.true_divide(full, n)
        assert full.dtype == (dt if dt.kind == "f" else np.float64)
    blocks = [[x[p * count:(p + 1) * count] for p in range(n)] for x in inputs]
    if collective in ("all_reduce", "batch_all_reduce"):
        want = [full] * n
    elif collective == "reduce":
        want = [None, full, None]
    elif collective == "broadcast":
        want = [inputs[1]] * n
    elif collective == "all_gather":
        want = [np.concatenate(inputs)] * n
    elif collective == "gather":
        want = [None, np.stack(inputs), None]  # (one row per participant, as it returns)
    elif collective == "scatter":
        want = blocks[1]
    elif collective == "all_to_all":
        want = [np.concatenate([blocks[i][j] for i in range(n)]) for j in range(n)]
    else:
        want = [full[p * count:(p + 1) * count] for p in range(n)]
    if collective == "batch_all_reduce":  # the values of one all-reduce of them all
        direct = reference.expected_outputs("all_reduce", inputs, op)
    elif collective == "scatter":  # the root's input as one row per participant
        direct = reference.expected_outputs(collective, [x.reshape(n, count) for x in inputs],
                                            op, root=1)
    else:
        direct = reference.expected_outputs(collective, inputs, op, root=1)
    for g, d, w in zip(bench.expected_outputs(case), direct, want):
        if w is None:
            assert g is None and d is None
        else:
            assert g.dtype == d.dtype == w.dtype
            assert np.array_equal(g, w) and np.array_equal(d.reshape(w.shape), w)


def test_bench_reports_wrong_results_and_fails(monkeypatch, capsys):
    """A collective that corrupts one element of one device shows #wrong 1, out of place and
    in place, and exit status 1."""
    real = collectives.all_reduce

    def broken(values, op="sum", algorithm="auto", **kw):
        out = real(values, op, algorithm, **kw)
        out[2][5] += 1
        return out

    monkeypatch.setattr(collectives, "all_reduce", broken)
    status = cli.main(["bench", "-n", "3", "-b", "64", "-e", "128", "-a", "ring", *FAST])
    rows = parse_table(capsys.readouterr().out)
    assert status == 1
    assert [(r["wrong"], r["ip_wrong"]) for r in rows] == [(1, 1), (1, 1)]


@pytest.mark.parametrize("mode", ["devices", "spmd"])
def test_in_place_passes_the_input_as_out(monkeypatch, mode):
    """In place means out= is the input buffer, as nccl-tests' recvbuff == sendbuff."""
    calls = []
    if mode == "devices":
        real = collectives.all_reduce

        def spy(values, op="sum", algorithm="auto", **kw):
            calls.append(kw.get("out") is values)
            return real(values, op, algorithm, **kw)

        monkeypatch.setattr(collectives, "all_reduce", spy)
    else:
        real_method = collectives.Communicator.all_reduce

        def spy(self, x, *args, **kw):
            if x.dtype == np.float32:  # not the bench's own float64/int64 agreements
                calls.append(kw.get("out") is x)
            return real_method(self, x, *args, **kw)

        monkeypatch.setattr(collectives.Communicator, "all_reduce", spy)
    config = bench.BenchConfig(algorithms=("ring",), participants=3, mode=mode, minbytes=64,
                               maxbytes=64, warmup=1, iters=3, repeats=2)
    rows = bench.run_bench(config)
    # out of place, then in place: warmup + 3 x 2 timed + 1 checked call each (per rank)
    per_rank = 1 if mode == "devices" else 3
    assert (calls.count(False), calls.count(True)) == (8 * per_rank, 8 * per_rank)
    if mode == "devices":
        assert calls == [False] * 8 + [True] * 8
    # the timed in-place calls overwrote the input 7 times; the checked call started afresh
    assert (rows[0]["wrong"], rows[0]["inplace"]["wrong"]) == (0, 0)


# --- collectives.tools.reference ------------------------------------------------------------------------

def _in_dtype(values: list[np.ndarray], op: ReduceOp, order: list[int]) -> np.ndarray:
    """Reduce in the inputs' own dtype, in the given order of participants."""
    kernel = {ReduceOp.SUM: np.add, ReduceOp.MEAN: np.add, ReduceOp.PROD: np.multiply,
              ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}[op]
    acc = values[order[0]].copy()
    for p in order[1:]:
        kernel(acc, values[p], out=acc)
    return np.true_divide(acc, len(values)) if op is ReduceOp.MEAN else acc


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 64])
def test_exact_inputs_reduce_exactly_in_every_dtype_and_order(n):
    rng = np.random.default_rng(n)
    for dtype in supported_dtypes():
        for op in ReduceOp:
            try:
                check_dtype(op, dtype)
            except TypeError:
                continue
            values = reference.exact_inputs(n, 231, dtype, op)
            want = reference.reference(values, op)
            assert want.dtype == collectives.ops.result_dtype(op, dtype)
            for order in (list(range(n)), list(rng.permutation(n))):
                got = _in_dtype(values, op, order)
                assert got.dtype == want.dtype
                # bit for bit: every partial result is exact, so the order cannot matter
                assert got.tobytes() == want.tobytes(), (dtype, op, n, order)
            if n > 1:  # the inputs vary, so a wrong element has something to differ from
                assert len(np.unique(want)) > 1, (dtype, op, n)


def test_exact_inputs_repeat_with_their_period():
    for n in (1, 4, 9):
        for op in ReduceOp:
            period = reference.input_period(n, op)
            for p in range(n):
                x = reference.exact_input(n, p, 3 * period + 5, np.float32, op)
                assert np.array_equal(x[period:2 * period], x[:period])
                assert np.array_equal(x[3 * period:], x[:5])
    x = reference.exact_input(4, 1, 12, np.int32, shape=(3, 4))
    assert x.shape == (3, 4) and np.array_equal(x.reshape(-1), reference.exact_input(4, 1, 12, np.int32))
    with pytest.raises(ValueError, match="participant=4"):
        reference.exact_input(4, 4, 10, np.float32)


def test_reference_by_hand():
    a, b = np.array([1, 2, 7], np.int16), np.array([3, 4, 0], np.int16)
    assert reference.reference([a, b], "sum").tolist() == [4, 6, 7]
    mean = reference.reference([a, b], "mean")  # integer MEAN: float64, NumPy's true division
    assert mean.dtype == np.float64 and mean.tolist() == [2.0, 3.0, 3.5]
    assert reference.reference([a, b], "prod").tolist() == [3, 8, 0]
    assert reference.reference([a, b], "max").tolist() == [3, 4, 7]
    t, f = np.array([True, True, False]), np.array([True, False, False])
    assert reference.reference([t, f], "max").tolist() == [True, True, False]
    assert reference.reference([t, f], "min").tolist() == [True, False, False]
    c = reference.reference([np.array([1 + 2j], np.complex64), np.array([3 - 1j], np.complex64)], "sum")
    assert c.dtype == np.complex64 and c.tolist() == [4 + 1j]
    # float16 MEAN: one division of the exact sum, rounded once to float16
    h = reference.reference([np.array([1.0], np.float16)] * 2 + [np.array([0.0], np.float16)], "mean")
    assert h.dtype == np.float16 and h[0] == np.float16(2.0 / 3)


def test_expected_outputs_per_collective():
    x = [np.arange(6, dtype=np.float32).reshape(3, 2) + 10 * p for p in range(3)]
    total = x[0] + x[1] + x[2]
    assert all(np.array_equal(o, total) for o in reference.expected_outputs("all_reduce", x))
    outs = reference.expected_outputs("reduce", x, "max", root=2)
    assert outs[:2] == [None, None] and np.array_equal(outs[2], x[2])
    assert all(np.array_equal(o, x[1]) for o in reference.expected_outputs("broadcast", x, root=1))
    assert all(np.array_equal(o, np.concatenate(x)) for o in reference.expected_outputs("all_gather", x))
    blocks = reference.expected_outputs("reduce_scatter", x)
    assert [b.tolist() for b in blocks] == [total[0:1].tolist(), total[1:2].tolist(), total[2:3].tolist()]
    stacked = reference.expected_outputs("gather", x, root=1)
    assert stacked[0] is None and stacked[2] is None and np.array_equal(stacked[1], np.stack(x))
    rows = reference.expected_outputs("scatter", x, root=2)
    assert [r.tolist() for r in rows] == [x[2][0].tolist(), x[2][1].tolist(), x[2][2].tolist()]
    exchanged = reference.expected_outputs("all_to_all", x)  # block j of each, to j
    assert [e.tolist() for e in exchanged] == [[x[i][j].tolist() for i in range(3)]
                                               for j in range(3)]
    with pytest.raises(ValueError, match="batch_all_reduce"):
        reference.expected_outputs("batch_all_reduce", x)


@pytest.mark.parametrize("collective", bench.COPIES)
def test_multi_device_copies_are_timed_and_checked(collective, run_cli):
    proc = run_cli("-c", collective, "-n", "3", "-b", "64", "-e", "1K", *FAST)
    assert proc.returncode == 0, proc.stderr
    rows = parse_table(proc.stdout)
    assert len(rows) == 5 and all(r["wrong"] == 0 and r["ip_wrong"] is None for r in rows)
    assert {(r["request"], r["algorithm"]) for r in rows} == {("auto", "copies")}


def test_records_follow_nccl_tests():
    """Counts as nccl-tests' getCollByteCount gives them (blocks not rounded to 4 here) and the
    bus factors of its PERFORMANCE.md."""
    ag, rs, ar = (reference.record(c) for c in ("all_gather", "reduce_scatter", "all_reduce"))
    assert ag.counts(1000, 4, rank=2) == reference.Counts(250, 1000, 250, 500, 0)
    assert rs.counts(1000, 4, rank=3) == reference.Counts(1000, 250, 250, 0, 750)
    assert ar.counts(1000, 4, rank=3) == reference.Counts(1000, 1000, 1000, 0, 0)
    assert ag.nbytes(1000, 4, 4) == rs.nbytes(1000, 4, 4) == ar.nbytes(1000, 4, 4) == 4000
    factors = {c: reference.record(c).bus_factor(4) for c in reference.COLLECTIVES}
    assert factors == {"all_reduce": 1.5, "reduce": 1.0, "broadcast": 1.0, "all_gather": 0.75,
                       "reduce_scatter": 0.75, "gather": 0.75, "scatter": 0.75,
                       "all_to_all": 0.75, "batch_all_reduce": 1.5}
    assert reference.record("all_to_all").counts(1000, 4) == reference.Counts(1000, 1000, 250, 0, 0)
    assert ar.bandwidth(2_000_000_000, 2.0, 4) == (1.0, 1.5)
    assert [c for c in reference.COLLECTIVES if reference.record(c).reduces] == list(bench.REDUCING)
    with pytest.raises(ValueError, match="gather_all"):
        reference.record("gather_all")


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
