"""``collectives bench``: time a collective over a sweep of sizes, in the style of nccl-tests.

For every size and algorithm the buffers are allocated once, the call is warmed up, then
timed ``repeats`` times over ``iters`` back-to-back calls; the reported time is the median
over repeats of the time per call. Each row has nccl-tests' two halves:

* out-of-place: the inputs stay untouched, results go to separate buffers;
* in-place: the output is the input buffer (``out=`` names it, as nccl-tests passes
  ``recvbuff == sendbuff``), where the API takes an ``out`` that can alias the input; the
  other cases print N/A. Each call reduces the previous call's result again, so in-place
  calls are timed on zero-filled buffers (repeated sums of real data grow until they
  overflow; zeros cost the same arithmetic), and the checked call runs on the exact inputs.

Sizes, algbw and busbw follow nccl-tests' PERFORMANCE.md, through the per-collective records
of ``collectives.reference``: ``algbw = S / t`` with ``S`` the larger of the input and output
buffer of one participant, ``busbw = algbw * factor``. ``#wrong`` counts the output elements,
over every participant, that differ from ``collectives.reference``'s float64 reference for
its exact inputs, so the comparison is exact.

Modes: ``devices`` drives the multi-device API from one thread (``bench_devices``); ``spmd``
runs ``bench_spmd(comm, config)`` on every rank of a ``Communicator`` (``collectives.run``
launches thread ranks; under ``mpiexec`` the ``mpi`` mode passes the MPI communicator).
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

import collectives

from ...algorithms.select import CostModel
from ...api.multi_device import pick_algorithm
from ...ops import BFLOAT16, ReduceOp, check_dtype, result_dtype
from .. import reference
from ..reference import COLLECTIVES, REDUCING

MODES = ("devices", "spmd", "mpi")
TARGET_SECONDS = 0.02  # each timed repeat lasts at least this long when iters adapt
MAX_ITERS = 1000

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
            raise ValueError("dtype bfloat16 needs the ml_dtypes package: pip install -e '.[bench]'")
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
    backend: str = "local"  # the multi-device backend whose arrays the devices mode uses
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
        if self.backend != "local" and self.mode != "devices":
            raise ValueError(f"backend {self.backend!r} runs in the devices mode only")
        dtype = parse_dtype(self.dtype)
        collective = collectives.Collective(self.collective)
        for name in self.algorithms:
            if self.mode == "mpi":  # the MPI transport adds names of its own ("native", "shm")
                if collectives.load_backend("mpi").canonical(name) in ("native", "shm"):
                    continue
            # names an algorithm and one that has this collective, or raises saying which do
            pick_algorithm(collective, name, self.participants, 1, CostModel())
        if self.collective in REDUCING:
            check_dtype(ReduceOp.parse(self.op), dtype, "inputs")

    @property
    def np_dtype(self) -> np.dtype:
        return parse_dtype(self.dtype)

    @property
    def redop(self) -> str:
        return ReduceOp.parse(self.op).value if self.collective in REDUCING else "none"


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``n`` participants (see ``collectives.reference``)."""
    return reference.record(collective).bus_factor(n)


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
        return reference.record(self.collective).nbytes(self.total, self.n, self.dtype.itemsize)

    @property
    def input_count(self) -> int:
        """Elements of one participant's input (reduce_scatter's is the whole buffer)."""
        return self.total if self.collective == "reduce_scatter" else self.count

    def input(self, participant: int) -> np.ndarray:
        """Participant ``participant``'s exact input (``collectives.reference.exact_input``)."""
        return reference.exact_input(self.n, participant, self.input_count, self.dtype, self.op)

    def inputs(self) -> list[np.ndarray]:
        """Every participant's input."""
        return [self.input(p) for p in range(self.n)]


def sweep(config: BenchConfig) -> list[Case]:
    """The sizes minbytes, minbytes*f, ... <= maxbytes as cases, rounded to whole elements
    (and to whole blocks of n for all_gather and reduce_scatter); duplicates dropped."""
    dtype, n = config.np_dtype, config.participants
    op = ReduceOp.parse(config.op) if config.collective in REDUCING else ReduceOp.SUM
    record = reference.record(config.collective)
    cases, seen, size = [], set(), config.minbytes
    while size <= config.maxbytes:
        count = record.counts(max(1, size // dtype.itemsize), n).param
        if count not in seen:
            seen.add(count)
            cases.append(Case(config.collective, n, dtype, op, config.root, count))
        size *= config.stepfactor
    return cases


# --- checking ---------------------------------------------------------------------------------

def _tile(period: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Elements lo..hi of the infinite repetition of ``period``."""
    return np.resize(np.roll(period, -(lo % len(period))), hi - lo)


def expected_output(case: Case, participant: int, _cache: dict | None = None) -> np.ndarray | None:
    """What ``participant`` must hold after the call (None: it receives nothing)."""
    c, n = case.count, case.n
    if case.collective in ("broadcast", "all_gather"):  # the same on every participant
        key = ("moved", case)
        if _cache is not None and key in _cache:
            return _cache[key]
        moved = (case.input(case.root) if case.collective == "broadcast"
                 else np.concatenate(case.inputs()))
        if _cache is not None:
            _cache[key] = moved
        return moved
    if case.collective == "reduce" and participant != case.root:
        return None
    # Exact inputs repeat every input_period elements, so their reduction does too:
    # reduce one period and tile it.
    key = ("period", case)
    if _cache is not None and key in _cache:
        period = _cache[key]
    else:
        length = reference.input_period(n, case.op)
        period = reference.reference(
            [reference.exact_input(n, p, length, case.dtype, case.op) for p in range(n)], case.op)
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
            target: float = TARGET_SECONDS,
            fence: Callable[[], None] | None = None) -> Measurement:
    """Median over ``repeats`` of the time per call of ``iters`` back-to-back calls.

    ``iters=None`` adapts: enough calls that a repeat lasts ``target`` seconds, at most
    MAX_ITERS. Under SPMD, ``sync`` is a barrier and ``agree`` takes the maximum over ranks,
    so every rank uses the same iteration count and a repeat lasts as long as its slowest rank.
    ``fence`` runs before the clock stops (a GPU backend waits for its devices there: its
    calls return once enqueued).
    """
    sync = sync or (lambda: None)
    fence = fence or (lambda: None)
    for _ in range(warmup):
        call()
    if iters is None:
        probe = 1
        for _ in range(2):
            sync()
            start = time.perf_counter()
            for _ in range(probe):
                call()
            fence()
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
        fence()
        times.append((time.perf_counter() - start) / iters)
    times = agree(times)
    return Measurement(statistics.median(times), iters, list(times))


@dataclass
class Runner:
    """One way of calling the collective on preallocated buffers: ``call()`` runs it once and
    returns this side's outputs (one per participant it holds); ``reset()`` restores what the
    timed calls overwrote, so that the checked call starts from the original inputs."""

    call: Callable[[], list]
    reset: Callable[[], None]


# --- rows -------------------------------------------------------------------------------------

def _half(case: Case, m: Measurement, wrong: int | None) -> dict:
    algbw, busbw = reference.record(case.collective).bandwidth(case.nbytes, m.seconds, case.n)
    return {"time_us": m.seconds * 1e6, "algbw": algbw, "busbw": busbw, "wrong": wrong,
            "iters": m.iters, "repeats_us": [t * 1e6 for t in m.repeats]}


def make_row(config: BenchConfig, case: Case, algorithm: str, resolved: str,
             m: Measurement, wrong: int,
             inplace: tuple[Measurement, int] | None = None) -> Row:
    """One result as a dict: the out-of-place measurement at the top level (time_us, algbw,
    busbw, wrong, iters, repeats_us), the in-place one under ``"inplace"`` (None: N/A)."""
    row = {"collective": config.collective, "mode": config.mode, "participants": case.n,
           "size": case.nbytes, "count": case.count, "type": str(case.dtype),
           "redop": config.redop, "algorithm": algorithm, "resolved": resolved,
           **_half(case, m, wrong if config.check else None), "inplace": None}
    if inplace is not None:
        row["inplace"] = _half(case, inplace[0], inplace[1] if config.check else None)
    return row


_LABELS = (f"#{'size(B)':>11} {'count':>11} {'type':>9} {'redop':>6} {'request':>9} "
           f"{'algorithm':>11} ")
_MEASURED = f"{'time(us)':>11} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7}"
# nccl-tests' two header lines: which half is which, then the columns.
TITLE = f"#{'':<{len(_LABELS) - 1}}{'out-of-place':^{len(_MEASURED)}}  {'in-place':^{len(_MEASURED)}}"
HEADER = f"{_LABELS}{_MEASURED}  {_MEASURED}"


def _format_half(half: dict | None) -> str:
    if half is None:
        return f"{'N/A':>11} {'N/A':>12} {'N/A':>12} {'N/A':>7}"
    wrong = "N/A" if half["wrong"] is None else str(half["wrong"])
    return (f"{half['time_us']:>11.2f} {half['algbw']:>12.3f} {half['busbw']:>12.3f} "
            f"{wrong:>7}")


def format_row(row: Row) -> str:
    """One table line, columns as in HEADER: ``request`` is the algorithm asked for,
    ``algorithm`` what ran."""
    return (f"{row['size']:>12} {row['count']:>11} {row['type']:>9} {row['redop']:>6} "
            f"{row['algorithm']:>9} {row['resolved']:>11} {_format_half(row)}  "
            f"{_format_half(row['inplace'])}")


def resolve_algorithm(case: Case, algorithm: str, cost_model) -> str:
    """The algorithm ``algorithm`` stands for in this case (what "auto" picks)."""
    try:
        return pick_algorithm(collectives.Collective(case.collective), algorithm, case.n,
                              case.nbytes, cost_model)[0]
    except Exception:  # noqa: BLE001 - only a label; the call itself reports real errors
        return algorithm


def _measure_and_check(runner: Runner, expected: list | None, config: BenchConfig, *,
                       sync=None, agree=_same, total_wrong=lambda w: w,
                       kit: ArrayKit | None = None) -> tuple[Measurement, int]:
    kit = kit or NUMPY_KIT
    m = measure(runner.call, warmup=config.warmup, iters=config.iters, repeats=config.repeats,
                sync=sync, agree=agree, fence=kit.fence)
    if expected is None:
        return m, 0
    runner.reset()
    return m, total_wrong(count_wrong([kit.host(o) for o in runner.call()], expected))


# --- multi-device ----------------------------------------------------------------------------

class ArrayKit:
    """How the devices mode makes and reads the arrays of a backend: NumPy here; a GPU
    backend's ``bench_kit(n)`` returns one for its arrays (with ``api``, the module whose
    collectives take them, and ``ceiling``, the time to copy n inputs into n outputs)."""

    api = collectives

    def inputs(self, values: list) -> list:
        return values

    def zeros(self, shape, dtype, participant: int):
        return np.zeros(shape, dtype)

    def copyto(self, dst, src) -> None:
        np.copyto(dst, src)

    def host(self, x):
        return x

    def fence(self) -> None:
        """Nothing to wait for: NumPy calls finish before they return."""

    ceiling = None


NUMPY_KIT = ArrayKit()


def _zero(buffers: list) -> Callable[[], None]:
    return lambda: [b.fill(0) for b in buffers]


def _device_runner(case: Case, algorithm: str, inputs: list, kit: ArrayKit = NUMPY_KIT
                   ) -> Runner:
    """Out of place: results go to preallocated outputs; the inputs stay untouched."""
    op, n, root, c, dt = case.op.value, case.n, case.root, case.count, case.dtype
    final = result_dtype(case.op, dt)
    if case.collective == "all_reduce":
        outs = [kit.zeros(c, final, p) for p in range(n)]
        return Runner(lambda: kit.api.all_reduce(inputs, op, algorithm, out=outs), _zero(outs))
    if case.collective == "reduce":
        out = kit.zeros(c, final, root)
        return Runner(lambda: [kit.api.reduce(inputs, op, root, algorithm, out=out)],
                      _zero([out]))
    if case.collective == "broadcast":
        outs = [kit.zeros(c, dt, p) for p in range(n)]
        return Runner(lambda: kit.api.broadcast(inputs[root], n, algorithm, out=outs),
                      _zero(outs))
    if case.collective == "all_gather":
        outs = [kit.zeros(n * c, dt, p) for p in range(n)]
        return Runner(lambda: kit.api.all_gather(inputs, 0, algorithm, out=outs), _zero(outs))
    outs = [kit.zeros(c, final, p) for p in range(n)]
    return Runner(lambda: kit.api.reduce_scatter(inputs, op, algorithm, out=outs), _zero(outs))


def _device_inplace_runner(case: Case, algorithm: str, inputs: list,
                           kit: ArrayKit = NUMPY_KIT) -> Runner | None:
    """In place: ``out`` is each device's input buffer (for all_gather and reduce_scatter,
    the input is that device's block of the whole buffer, as in nccl-tests). None where the
    result's dtype differs from the input's (integer MEAN)."""
    op, n, root, c = case.op.value, case.n, case.root, case.count
    if result_dtype(case.op, case.dtype) != case.dtype:
        return None
    # zero-filled for the timed calls (see the module's docstring); reset() puts the inputs in
    if case.collective == "all_gather":
        bufs = [kit.zeros(n * c, case.dtype, p) for p in range(n)]
        own = [b[p * c:(p + 1) * c] for p, b in enumerate(bufs)]

        def reset() -> None:
            for o, x in zip(own, inputs):
                kit.copyto(o, x)

        return Runner(lambda: kit.api.all_gather(own, 0, algorithm, out=bufs), reset)
    bufs = [kit.zeros(x.shape, x.dtype, p) for p, x in enumerate(inputs)]

    def restore() -> None:
        for b, x in zip(bufs, inputs):
            kit.copyto(b, x)

    if case.collective == "all_reduce":
        return Runner(lambda: kit.api.all_reduce(bufs, op, algorithm, out=bufs), restore)
    if case.collective == "reduce":
        return Runner(lambda: [kit.api.reduce(bufs, op, root, algorithm, out=bufs[root])],
                      restore)
    if case.collective == "broadcast":
        return Runner(lambda: kit.api.broadcast(bufs[root], n, algorithm, out=bufs), restore)
    blocks = [b[p * c:(p + 1) * c] for p, b in enumerate(bufs)]
    return Runner(lambda: kit.api.reduce_scatter(bufs, op, algorithm, out=blocks), restore)


def bench_devices(config: BenchConfig, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Run the sweep through the multi-device API (one process holds every participant), on
    the arrays of ``config.backend``."""
    from ...registry import backend_for_arrays

    kit = (NUMPY_KIT if config.backend == "local"
           else collectives.load_backend(config.backend).bench_kit(config.participants))
    rows = []
    for case in sweep(config):
        inputs = kit.inputs(case.inputs())
        expected = expected_outputs(case) if config.check else None
        if case.collective == "reduce" and expected is not None:
            expected = [expected[case.root]]
        model = backend_for_arrays(inputs).cost_model
        ceiling = kit.ceiling(case, inputs, config) if kit.ceiling is not None else None
        for algorithm in config.algorithms:
            m, wrong = _measure_and_check(_device_runner(case, algorithm, inputs, kit), expected,
                                          config, kit=kit)
            runner = _device_inplace_runner(case, algorithm, inputs, kit)
            inplace = None if runner is None else _measure_and_check(runner, expected, config,
                                                                     kit=kit)
            resolved = (kit.resolve(case, algorithm) if hasattr(kit, "resolve")
                        else resolve_algorithm(case, algorithm, model))
            row = make_row(config, case, algorithm, resolved, m, wrong, inplace)
            if ceiling is not None:
                row["ceiling"] = _half(case, ceiling, None)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


# --- SPMD -------------------------------------------------------------------------------------

def _spmd_runners(comm, case: Case, algorithm: str) -> tuple[Runner, Runner | None]:
    """This rank's out-of-place and in-place runners (None: the call has no ``out=``)."""
    op, root, rank = case.op.value, case.root, comm.rank
    final = result_dtype(case.op, case.dtype)
    if case.collective == "broadcast":
        x = case.input(root) if rank == root else None
        out = np.zeros(case.count, case.dtype)
        mine = np.zeros(case.count, case.dtype)  # zeros while timed, like the devices' buffers

        def restore() -> None:
            if x is not None:
                np.copyto(mine, x)

        oop = Runner(lambda: [comm.broadcast(x, root, algorithm, out=out)], _zero([out]))
        return oop, Runner(lambda: [comm.broadcast(mine if x is not None else None, root,
                                                   algorithm, out=mine)], restore)
    x = case.input(rank)
    if case.collective == "all_reduce":
        out = np.zeros(case.count, final)
        oop = Runner(lambda: [comm.all_reduce(x, op, algorithm, out=out)], _zero([out]))
        if final != case.dtype:
            return oop, None
        mine = np.zeros_like(x)  # zeros while timed; the checked call gets x
        return oop, Runner(lambda: [comm.all_reduce(mine, op, algorithm, out=mine)],
                           lambda: np.copyto(mine, x))
    if case.collective == "reduce":
        return Runner(lambda: [comm.reduce(x, op, root, algorithm)], lambda: None), None
    if case.collective == "all_gather":
        return Runner(lambda: [comm.all_gather(x, 0, algorithm)], lambda: None), None
    return Runner(lambda: [comm.reduce_scatter(x, op, algorithm)], lambda: None), None


def _recording(call: Callable[[], list], comm, ran: list) -> Callable[[], list]:
    """``call``, noting in ``ran[0]`` what the communicator says it ran (right after the call:
    the bench's own all-reduces of times and counts would overwrite it)."""
    def run() -> list:
        outputs = call()
        ran[0] = getattr(comm, "last_algorithm", None) or ran[0]
        return outputs

    return run


def bench_spmd(comm, config: BenchConfig, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Run the sweep as one rank of ``comm``; every rank returns the same rows.

    Call it on every rank (thread ranks via ``collectives.run``, or processes under an MPI
    launcher). Times are the maximum over ranks of each repeat; #wrong is summed over
    ranks. ``on_row`` is called on rank 0 only, as each row is ready. The algorithm that ran
    is ``comm.last_algorithm`` where the communicator records it, else the name asked for.
    """
    n, rank = comm.size, comm.rank
    if n != config.participants:
        config = replace(config, participants=n)

    def agree(values: list[float]) -> list[float]:
        return [float(v) for v in comm.all_reduce(np.asarray(values, np.float64), "max")]

    def total_wrong(mine: int) -> int:
        return int(comm.all_reduce(np.asarray([mine], np.int64), "sum")[0])

    rows = []
    for case in sweep(config):
        expected = [expected_output(case, rank)] if config.check else None
        for algorithm in config.algorithms:
            oop, ip = _spmd_runners(comm, case, algorithm)
            ran = [algorithm]
            oop.call = _recording(oop.call, comm, ran)
            m, wrong = _measure_and_check(oop, expected, config, sync=comm.barrier, agree=agree,
                                          total_wrong=total_wrong)
            inplace = None if ip is None else _measure_and_check(
                ip, expected, config, sync=comm.barrier, agree=agree, total_wrong=total_wrong)
            row = make_row(config, case, algorithm, ran[0], m, wrong, inplace)
            rows.append(row)
            if on_row is not None and rank == 0:
                on_row(row)
    return rows


def run_bench(config: BenchConfig, on_row: Callable[[Row], None] | None = None, *,
              comm=None) -> list[Row]:
    """Validate ``config`` and run its sweep in its mode: ``devices`` in this thread, ``spmd``
    on embedded thread ranks, ``mpi`` as one rank of ``comm`` (default: the MPI backend's
    ``init()`` over every rank of the launch)."""
    if config.mode == "mpi":
        comm = comm if comm is not None else collectives.load_backend("mpi").init()
        config = replace(config, participants=comm.size)
    config.validate()
    if config.mode == "devices":
        return bench_devices(config, on_row)
    if config.mode == "mpi":
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
