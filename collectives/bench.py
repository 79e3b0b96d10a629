"""``collectives bench``: time a collective over a sweep of sizes, in the style of nccl-tests.

For every size and algorithm the inputs and outputs are allocated once, the call is warmed
up, then timed ``repeats`` times over ``iters`` back-to-back calls; the reported time is the
median over repeats of the time per call. Bandwidths follow nccl-tests' PERFORMANCE.md:
``algbw = S / t`` with ``S`` the per-participant buffer size (the larger of input and output:
for all_gather the gathered output, for reduce_scatter the full input), and
``busbw = algbw * factor`` with factor 2(n-1)/n for all_reduce, (n-1)/n for all_gather and
reduce_scatter and 1 for broadcast and reduce.

``#wrong`` counts the output elements, over every participant, that differ from a float64
NumPy reference. Inputs are small integers (0..4), so every sum of up to 64 participants is
exact even in bfloat16 and the comparison can be exact.

Two ways of running: ``devices`` drives the multi-device API from one thread
(``bench_devices``); ``spmd`` runs ``bench_spmd(comm, config)`` on every rank of a
``Communicator`` (``collectives.run`` launches thread ranks; an MPI launcher can call the
same function under ``mpiexec`` and print from rank 0 only).
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import re
import statistics
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

import collectives

from . import algorithms
from .ops import BFLOAT16, ReduceOp, check_dtype, result_dtype
from .schedule import Collective

COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
MODES = ("devices", "spmd", "mpi")
TARGET_SECONDS = 0.02  # each timed repeat lasts at least this long when iters adapt
MAX_ITERS = 1000
PERIOD = 77  # the input pattern repeats every PERIOD elements (see make_input)

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)

Row = dict


# --- configuration ----------------------------------------------------------------------------

def parse_size(text: str | int) -> int:
    """Bytes from ``"8"``, ``"4K"``, ``"64M"``, ``"1G"`` (powers of 1024; "KB"/"KiB" also work)."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"size {text!r} is not a byte count such as 8, 4K, 64M or 1G")
    value = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if value != int(value):
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def parse_dtype(name: str | np.dtype) -> np.dtype:
    """A NumPy dtype from its name; ``bfloat16`` (or ``bf16``) comes from ml_dtypes."""
    if isinstance(name, np.dtype):
        return name
    key = str(name).strip().lower()
    if key in ("bfloat16", "bf16"):
        if BFLOAT16 is None:
            raise ValueError("dtype bfloat16 needs the ml_dtypes package (pip install ml_dtypes)")
        return BFLOAT16
    aliases = {"float": "float32", "half": "float16", "double": "float64", "int": "int32"}
    try:
        return np.dtype(aliases.get(key, key))
    except TypeError as exc:
        raise ValueError(f"dtype {name!r} is not a NumPy dtype name (e.g. float32, float16, "
                         "bfloat16, int32)") from exc


@dataclass
class BenchConfig:
    """What to measure: one collective, some algorithms, a sweep of sizes."""

    collective: str = "all_reduce"
    algorithms: tuple[str, ...] = ("auto",)
    participants: int = 4
    mode: str = "devices"
    minbytes: int = 8
    maxbytes: int = 64 << 20
    stepfactor: int = 2
    dtype: str = "float32"
    op: str = "sum"
    warmup: int = 2
    iters: int | None = None
    repeats: int = 5
    check: bool = True
    root: int = 0
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ValueError (naming the bad setting) before anything runs."""
        if self.collective not in COLLECTIVES:
            raise ValueError(f"collective {self.collective!r} is not one of {', '.join(COLLECTIVES)}")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.participants < 1:
            raise ValueError(f"participants={self.participants} must be at least 1")
        if not 0 <= self.root < self.participants:
            raise ValueError(f"root={self.root} is not one of the {self.participants} participants")
        if self.minbytes < 1 or self.maxbytes < self.minbytes:
            raise ValueError(f"sizes {self.minbytes}..{self.maxbytes}: need 1 <= minbytes <= maxbytes")
        if self.stepfactor < 2:
            raise ValueError(f"stepfactor={self.stepfactor} must be at least 2")
        if self.warmup < 0 or self.repeats < 1 or (self.iters is not None and self.iters < 1):
            raise ValueError("need warmup >= 0, repeats >= 1 and iters >= 1")
        if not self.algorithms:
            raise ValueError("no algorithm given")
        dtype = parse_dtype(self.dtype)
        collective = Collective(self.collective)
        # Under MPI the transport adds names of its own ("native", "shm").
        canonical = (collectives.load_backend("mpi").canonical if self.mode == "mpi"
                     else algorithms.canonical)
        for name in self.algorithms:
            base = canonical(name)
            schedule_based = base in algorithms.MODULES or "/" in base
            if schedule_based and not algorithms.supports(collective, base):
                raise ValueError(f"algorithm {name!r} has no {self.collective}")
        if self.collective in REDUCING:
            check_dtype(ReduceOp.parse(self.op), dtype, "inputs")

    @property
    def np_dtype(self) -> np.dtype:
        return parse_dtype(self.dtype)

    @property
    def redop(self) -> str:
        return ReduceOp.parse(self.op).value if self.collective in REDUCING else "none"


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``n`` participants."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class Case:
    """One size of the sweep: ``count`` is the per-call count argument, ``total`` the
    per-participant buffer (count for all_reduce, reduce and broadcast; n x count for
    all_gather's output and reduce_scatter's input)."""

    collective: str
    n: int
    dtype: np.dtype
    op: ReduceOp
    root: int
    count: int

    @property
    def total(self) -> int:
        return self.count * self.n if self.collective in ("all_gather", "reduce_scatter") else self.count

    @property
    def nbytes(self) -> int:
        return self.total * self.dtype.itemsize


def sweep(config: BenchConfig) -> list[Case]:
    """The sizes minbytes, minbytes*f, ... <= maxbytes as cases, rounded to whole elements
    (and to whole blocks of n for all_gather and reduce_scatter); duplicates dropped."""
    dtype, n = config.np_dtype, config.participants
    op = ReduceOp.parse(config.op) if config.collective in REDUCING else ReduceOp.SUM
    cases, seen, size = [], set(), config.minbytes
    while size <= config.maxbytes:
        count = max(1, size // dtype.itemsize)
        if config.collective in ("all_gather", "reduce_scatter"):
            count = max(1, count // n)
        if count not in seen:
            seen.add(count)
            cases.append(Case(config.collective, n, dtype, op, config.root, count))
        size *= config.stepfactor
    return cases


# --- data and checking ------------------------------------------------------------------------

def _pattern(count: int, participant: int) -> np.ndarray:
    k = np.arange(count, dtype=np.int64)
    return (k % 7 + (k // 7) % 11 + participant) % 5  # period 77, values 0..4


def make_input(count: int, participant: int, dtype: np.dtype) -> np.ndarray:
    """Participant ``participant``'s input: small integers, exact in every floating dtype."""
    return _pattern(count, participant).astype(dtype)


def _accumulator(dtype: np.dtype) -> np.dtype:
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return np.dtype(np.float64)
    return np.dtype({"f": np.float64, "c": np.complex128, "i": np.int64, "u": np.uint64,
                     "b": np.bool_}[dtype.kind])


def reference(inputs: Sequence[np.ndarray], op: ReduceOp | str) -> np.ndarray:
    """``op`` over ``inputs`` computed in float64 (int64/complex128 for those kinds), then
    cast to the result's dtype: what a correct reduction returns."""
    op = ReduceOp.parse(op)
    dtype = np.dtype(inputs[0].dtype)
    acc = inputs[0].astype(_accumulator(dtype))
    kernel = {ReduceOp.SUM: np.add, ReduceOp.MEAN: np.add, ReduceOp.PROD: np.multiply,
              ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}[op]
    for x in inputs[1:]:
        kernel(acc, x.astype(acc.dtype), out=acc)
    if op is ReduceOp.MEAN:
        acc = acc / len(inputs)
    return acc.astype(result_dtype(op, dtype))


def _tile(period: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Elements lo..hi of the infinite repetition of ``period``."""
    return np.resize(np.roll(period, -(lo % len(period))), hi - lo)


def expected_output(case: Case, participant: int, _cache: dict | None = None) -> np.ndarray | None:
    """What ``participant`` must hold after the call (None: it receives nothing)."""
    c, n, dt = case.count, case.n, case.dtype
    if case.collective == "broadcast":
        return make_input(c, case.root, dt)
    if case.collective == "all_gather":
        return np.concatenate([make_input(c, p, dt) for p in range(n)])
    if case.collective == "reduce" and participant != case.root:
        return None
    # Inputs repeat every PERIOD elements, so the reduction does too: reduce one period.
    key = ("period", case)
    if _cache is not None and key in _cache:
        period = _cache[key]
    else:
        period = reference([make_input(PERIOD, p, dt) for p in range(n)], case.op)
        if _cache is not None:
            _cache[key] = period
    if case.collective == "reduce_scatter":
        return _tile(period, participant * c, (participant + 1) * c)
    full_key = ("full", case)
    if _cache is not None and full_key in _cache:
        return _cache[full_key]
    full = _tile(period, 0, c)
    if _cache is not None:
        _cache[full_key] = full
    return full


def expected_outputs(case: Case) -> list[np.ndarray | None]:
    """``expected_output`` of every participant (arrays shared where they are equal)."""
    cache: dict = {}
    return [expected_output(case, p, cache) for p in range(case.n)]


def count_wrong(outputs: Sequence, expected: Sequence) -> int:
    """Elements of ``outputs`` that differ from ``expected`` (participant by participant).

    A participant whose output is missing or of the wrong size counts all its expected
    elements as wrong; NaN never equals anything, so it counts too.
    """
    wrong = 0
    for out, exp in zip(outputs, expected, strict=True):
        if exp is None:
            continue
        if out is None or np.size(out) != exp.size:
            wrong += exp.size
            continue
        wrong += int(np.count_nonzero(np.asarray(out).reshape(-1) != exp.reshape(-1)))
    return wrong


# --- timing -----------------------------------------------------------------------------------

@dataclass
class Measurement:
    seconds: float  # median over repeats of seconds per call
    iters: int
    repeats: list[float]


def _same(values: list[float]) -> list[float]:
    return values


def measure(call: Callable[[], object], *, warmup: int = 2, iters: int | None = None,
            repeats: int = 5, sync: Callable[[], None] | None = None,
            agree: Callable[[list[float]], list[float]] = _same,
            target: float = TARGET_SECONDS) -> Measurement:
    """Median over ``repeats`` of the time per call of ``iters`` back-to-back calls.

    ``iters=None`` adapts: enough calls that a repeat lasts ``target`` seconds, at most
    MAX_ITERS. Under SPMD, ``sync`` is a barrier and ``agree`` takes the maximum over ranks,
    so every rank uses the same iteration count and a repeat lasts as long as its slowest rank.
    """
    sync = sync or (lambda: None)
    for _ in range(warmup):
        call()
    if iters is None:
        probe = 1
        for _ in range(2):
            sync()
            start = time.perf_counter()
            for _ in range(probe):
                call()
            per_call = agree([(time.perf_counter() - start) / probe])[0]
            if per_call * probe >= target / 4 or probe >= MAX_ITERS:
                break
            probe = min(MAX_ITERS, math.ceil(target / 4 / max(per_call, 1e-9)))
        iters = max(1, min(MAX_ITERS, math.ceil(target / max(per_call, 1e-9))))
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        times.append((time.perf_counter() - start) / iters)
    times = agree(times)
    return Measurement(statistics.median(times), iters, list(times))


# --- rows -------------------------------------------------------------------------------------

def make_row(config: BenchConfig, case: Case, algorithm: str, resolved: str,
             m: Measurement, wrong: int) -> Row:
    """One result as a dict (the table row plus what JSON readers need)."""
    algbw = case.nbytes / m.seconds / 1e9 if m.seconds > 0 else 0.0
    return {
        "collective": config.collective, "mode": config.mode, "participants": case.n,
        "size": case.nbytes, "count": case.count, "type": str(case.dtype), "redop": config.redop,
        "algorithm": algorithm, "resolved": resolved, "time_us": m.seconds * 1e6,
        "algbw": algbw, "busbw": algbw * bus_factor(config.collective, case.n),
        "wrong": wrong if config.check else None, "iters": m.iters,
        "repeats_us": [t * 1e6 for t in m.repeats],
    }


HEADER = (f"#{'size(B)':>11} {'count':>11} {'type':>9} {'redop':>6} {'algorithm':>12} "
          f"{'time(us)':>11} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7}")


def format_row(row: Row) -> str:
    """One table line, columns as in HEADER."""
    wrong = "N/A" if row["wrong"] is None else str(row["wrong"])
    return (f"{row['size']:>12} {row['count']:>11} {row['type']:>9} {row['redop']:>6} "
            f"{row['algorithm']:>12} {row['time_us']:>11.2f} {row['algbw']:>12.3f} "
            f"{row['busbw']:>12.3f} {wrong:>7}")


def resolve_algorithm(case: Case, algorithm: str, cost_model) -> str:
    """The algorithm ``algorithm`` stands for in this case (what "auto" picks)."""
    from .api import pick_algorithm

    try:
        return pick_algorithm(Collective(case.collective), algorithm, case.n, case.nbytes, cost_model)
    except Exception:  # noqa: BLE001 - only a label; the call itself reports real errors
        return algorithm


# --- multi-device ----------------------------------------------------------------------------

def _device_call(case: Case, algorithm: str, inputs: list, outs: list) -> Callable[[], list]:
    """A closure running the collective into the preallocated ``outs``; returns the outputs."""
    op, n, root = case.op.value, case.n, case.root
    if case.collective == "all_reduce":
        return lambda: collectives.all_reduce(inputs, op, algorithm, out=outs)
    if case.collective == "reduce":
        return lambda: [collectives.reduce(inputs, op, root, algorithm, out=outs[0])]
    if case.collective == "broadcast":
        return lambda: collectives.broadcast(inputs[root], n, algorithm, out=outs)
    if case.collective == "all_gather":
        return lambda: collectives.all_gather(inputs, 0, algorithm, out=outs)
    return lambda: collectives.reduce_scatter(inputs, op, algorithm, out=outs)


def _device_buffers(case: Case) -> tuple[list, list]:
    n, c, dt = case.n, case.count, case.dtype
    final = result_dtype(case.op, dt)
    inputs = [make_input(case.total if case.collective == "reduce_scatter" else c, p, dt)
              for p in range(n)]
    if case.collective == "all_gather":
        outs = [np.empty(n * c, dt) for _ in range(n)]
    elif case.collective == "reduce":
        outs = [np.empty(c, final)]
    elif case.collective == "broadcast":
        outs = [np.empty(c, dt) for _ in range(n)]
    else:
        outs = [np.empty(c, final) for _ in range(n)]
    return inputs, outs


def bench_devices(config: BenchConfig, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Run the sweep through the multi-device API (one process holds every participant)."""
    from .registry import backend_for_arrays

    rows = []
    for case in sweep(config):
        inputs, outs = _device_buffers(case)
        expected = expected_outputs(case) if config.check else None
        if case.collective == "reduce" and expected is not None:
            expected = [expected[case.root]]
        model = backend_for_arrays(inputs).cost_model
        for algorithm in config.algorithms:
            for o in outs:
                o.fill(0)
            call = _device_call(case, algorithm, inputs, outs)
            last: list = []

            def timed(call=call, last=last):
                last[:] = call()

            m = measure(timed, warmup=config.warmup, iters=config.iters, repeats=config.repeats)
            wrong = count_wrong(last, expected) if expected is not None else 0
            row = make_row(config, case, algorithm, resolve_algorithm(case, algorithm, model), m, wrong)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


# --- SPMD -------------------------------------------------------------------------------------

def _spmd_call(comm, case: Case, algorithm: str, x, out) -> Callable[[], object]:
    op, root = case.op.value, case.root
    if case.collective == "all_reduce":
        return lambda: comm.all_reduce(x, op, algorithm, out=out)
    if case.collective == "reduce":
        return lambda: comm.reduce(x, op, root, algorithm)
    if case.collective == "broadcast":
        return lambda: comm.broadcast(x, root, algorithm, out=out)
    if case.collective == "all_gather":
        return lambda: comm.all_gather(x, 0, algorithm)
    return lambda: comm.reduce_scatter(x, op, algorithm)


def bench_spmd(comm, config: BenchConfig, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Run the sweep as one rank of ``comm``; every rank returns the same rows.

    Call it on every rank (thread ranks via ``collectives.run``, or processes under an MPI
    launcher). Times are the maximum over ranks of each repeat; #wrong is summed over
    ranks. ``on_row`` is called on rank 0 only, as each row is ready.
    """
    n, rank = comm.size, comm.rank
    if n != config.participants:
        config = replace(config, participants=n)

    def agree(values: list[float]) -> list[float]:
        return [float(v) for v in comm.all_reduce(np.asarray(values, np.float64), "max")]

    rows = []
    for case in sweep(config):
        final = result_dtype(case.op, case.dtype)
        if case.collective == "broadcast":
            x = make_input(case.count, rank, case.dtype) if rank == case.root else None
            out = np.empty(case.count, case.dtype)
        else:
            x = make_input(case.total if case.collective == "reduce_scatter" else case.count,
                           rank, case.dtype)
            out = np.empty(case.count, final) if case.collective == "all_reduce" else None
        expected = expected_output(case, rank) if config.check else None
        for algorithm in config.algorithms:
            if out is not None:
                out.fill(0)
            call = _spmd_call(comm, case, algorithm, x, out)
            last: list = [None]

            def timed(call=call, last=last):
                last[0] = call()

            m = measure(timed, warmup=config.warmup, iters=config.iters, repeats=config.repeats,
                        sync=comm.barrier, agree=agree)
            mine = count_wrong(last, [expected]) if config.check else 0
            wrong = int(comm.all_reduce(np.asarray([mine], np.int64), "sum")[0])
            row = make_row(config, case, algorithm,
                           resolve_algorithm(case, algorithm, comm.cost_model), m, wrong)
            rows.append(row)
            if on_row is not None and rank == 0:
                on_row(row)
    return rows


def run_bench(config: BenchConfig, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Validate ``config`` and run its sweep in its mode (spmd: on embedded thread ranks)."""
    config.validate()
    if config.mode == "devices":
        return bench_devices(config, on_row)
    if config.mode == "mpi":  # one rank of an mpiexec launch; the launch decides the ranks
        comm = collectives.load_backend("mpi").init()
        return bench_spmd(comm, config, on_row)
    return collectives.run(bench_spmd, config.participants, args=(config, on_row), timeout=600.0)[0]


# --- reporting --------------------------------------------------------------------------------

def machine_info() -> dict:
    """Where the numbers came from."""
    return {"node": platform.node(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version()}


def metadata(command: str, config: BenchConfig | None = None) -> dict:
    """Command, machine, versions and date, for JSON files."""
    meta = {"command": command, "machine": machine_info(), "numpy": np.__version__,
            "collectives": collectives.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if config is not None:
        meta["config"] = {k: v for k, v in asdict(config).items() if k != "extra"}
    return meta


def write_json(path: str, rows: Sequence[Row], meta: dict) -> None:
    """``meta`` plus ``rows`` (a list of row dicts) as one JSON object."""
    import json

    with open(path, "w") as f:
        json.dump({**meta, "rows": list(rows)}, f, indent=1, default=str)
        f.write("\n")


def write_plot(path: str, rows: Sequence[Row], command: str) -> None:
    """PNG of busbw against size, one line per algorithm, log2 size axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == algorithm]
        ax.plot([r["size"] for r in mine], [r["busbw"] for r in mine], marker="o", ms=3,
                label=algorithm)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size per participant (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="algorithm")
    machine = machine_info()
    what = f"{rows[0]['collective']}, {rows[0]['mode']}, n={rows[0]['participants']}, " if rows else ""
    title = f"{what}on {machine['node']} ({machine['cpu_count']} CPUs): {command}"
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def progress_context(total: int):
    """A rich progress bar on stderr when it is a terminal, else None."""
    if not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True,
                    redirect_stdout=sys.stdout.isatty(), redirect_stderr=False)
