"""The bench's sweep: its configuration, its cases, and running them in each mode.

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
of ``collectives.tools.reference``: ``algbw = S / t`` with ``S`` the larger of the input and output
buffer of one participant, ``busbw = algbw * factor``. ``#wrong`` counts the output elements,
over every participant, that differ from ``collectives.tools.reference``'s float64 reference for
its exact inputs, so the comparison is exact (``check``): an element is wrong where it is in
what the call returns or in the buffer it was given as ``out=``; a result of the wrong dtype
or shape is wrong throughout.

Modes: ``devices`` drives the multi-device API from one thread (``bench_devices``); ``spmd``
runs ``bench_spmd(comm, config)`` on every rank of a ``Communicator`` (``collectives.run``
launches thread ranks; under ``mpiexec`` the ``mpi`` mode passes the MPI communicator).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

import collectives

from ...api.multi_device import pick_algorithm
from ...ops import ReduceOp, result_dtype
from .. import reference
from ..reference import REDUCING
from . import (
    all_gather,
    all_reduce,
    all_to_all,
    batch_all_reduce,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from .check import count_wrong
from .common import NUMPY_KIT, ArrayKit, Runner
from .config import COPIES, BenchConfig, kind
from .report import Row, half, make_row
from .timing import Measurement, measure, same

# One record per collective (nccl-tests' testColl): what each participant must hold after
# the call, and how each mode calls it on preallocated buffers.
RECORDS = {"all_reduce": all_reduce, "reduce": reduce, "broadcast": broadcast,
           "all_gather": all_gather, "reduce_scatter": reduce_scatter, "gather": gather,
           "scatter": scatter, "all_to_all": all_to_all, "batch_all_reduce": batch_all_reduce}


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``n`` participants (see ``collectives.tools.reference``)."""
    return reference.record(collective).bus_factor(n)


# collectives whose count argument is a block: a participant's buffer holds n of them
_BLOCKED = ("all_gather", "reduce_scatter", "gather", "scatter", "all_to_all")


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
        return self.count * self.n if self.collective in _BLOCKED else self.count

    @property
    def nbytes(self) -> int:
        return reference.record(self.collective).nbytes(self.total, self.n, self.dtype.itemsize)

    @property
    def input_count(self) -> int:
        """Elements of one participant's input (reduce_scatter's, scatter's and all_to_all's
        is the whole buffer of ``n`` blocks)."""
        return self.total if self.collective in ("reduce_scatter", "scatter", "all_to_all") else self.count

    def input(self, participant: int) -> np.ndarray:
        """Participant ``participant``'s exact input (``collectives.tools.reference.exact_input``)."""
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

def expected_output(case: Case, participant: int, _cache: dict | None = None) -> np.ndarray | None:
    """What ``participant`` must hold after the call (None: it receives nothing)."""
    return RECORDS[case.collective].expected(case, participant, {} if _cache is None else _cache)


def expected_outputs(case: Case) -> list[np.ndarray | None]:
    """``expected_output`` of every participant (arrays shared where they are equal)."""
    cache: dict = {}
    return [expected_output(case, p, cache) for p in range(case.n)]


def resolve_algorithm(case: Case, algorithm: str, cost_model) -> str:
    """The algorithm ``algorithm`` stands for in this case (what "auto" picks)."""
    try:
        return pick_algorithm(kind(case.collective), algorithm, case.n, case.nbytes,
                              cost_model)[0]
    except Exception:  # noqa: BLE001 - only a label; the call itself reports real errors
        return algorithm


def _measure_and_check(runner: Runner, expected: list | None, config: BenchConfig, *,
                       sync=None, agree=same, total_wrong=lambda w: w,
                       kit: ArrayKit | None = None) -> tuple[Measurement, int]:
    kit = kit or NUMPY_KIT
    m = measure(runner.call, warmup=config.warmup, iters=config.iters, repeats=config.repeats,
                sync=sync, agree=agree, fence=kit.fence)
    if expected is None:
        return m, 0
    runner.reset()
    outputs = [[kit.host(t) for t in o] if isinstance(o, list) else kit.host(o)
               for o in runner.call()]
    buffers = None if runner.out is None else [kit.host(o) for o in runner.out]
    return m, total_wrong(count_wrong(outputs, expected, buffers))


# --- multi-device ----------------------------------------------------------------------------

def _device_runner(case: Case, algorithm: str, inputs: list, kit: ArrayKit = NUMPY_KIT
                   ) -> Runner:
    """Out of place: results go to preallocated outputs; the inputs stay untouched."""
    return RECORDS[case.collective].devices(case, algorithm, inputs, kit)


def _device_inplace_runner(case: Case, algorithm: str, inputs: list,
                           kit: ArrayKit = NUMPY_KIT) -> Runner | None:
    """In place: ``out`` is each device's input buffer (for all_gather and reduce_scatter,
    the input is that device's block of the whole buffer, as in nccl-tests). None where the
    result's dtype differs from the input's (integer MEAN). Zero-filled for the timed calls
    (see the module's docstring); ``reset()`` puts the inputs in."""
    if result_dtype(case.op, case.dtype) != case.dtype:
        return None
    return RECORDS[case.collective].devices_in_place(case, algorithm, inputs, kit)


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
        if case.collective in ("reduce", "gather") and expected is not None:
            expected = [expected[case.root]]
        model = backend_for_arrays(inputs).cost_model
        ceiling = None
        if kit.ceiling is not None:  # the time to copy every input into an output of its own
            ceiling = measure(kit.ceiling(case, inputs), warmup=config.warmup, iters=config.iters,
                              repeats=config.repeats, fence=kit.fence)
        for algorithm in config.algorithms:
            m, wrong = _measure_and_check(_device_runner(case, algorithm, inputs, kit), expected,
                                          config, kit=kit)
            runner = _device_inplace_runner(case, algorithm, inputs, kit)
            inplace = None if runner is None else _measure_and_check(runner, expected, config,
                                                                     kit=kit)
            resolved = "copies" if case.collective in COPIES else (
                (kit.resolve(case, algorithm) if hasattr(kit, "resolve") else None)
                or resolve_algorithm(case, algorithm, model))
            row = make_row(config, case, algorithm, resolved, m, wrong, inplace)
            if ceiling is not None:
                row["ceiling"] = half(case, ceiling, None)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


# --- SPMD -------------------------------------------------------------------------------------

def _spmd_runners(comm, case: Case, algorithm: str) -> tuple[Runner, Runner | None]:
    """This rank's out-of-place and in-place runners (None: the call has no ``out=``)."""
    return RECORDS[case.collective].spmd(comm, case, algorithm)


def _recording(call: Callable[[], list], comm, ran: list) -> Callable[[], list]:
    """``call``, noting in ``ran[0]`` what the communicator says it ran (right after the call:
    the bench's own all-reduces of times and counts would overwrite it)."""
    def run() -> list:
        outputs = call()
        ran[0] = getattr(comm, "last_algorithm", None) or ran[0]
        native = comm.transport.native
        if ran[0] == "native" and native is not None and native.last == "shm":
            ran[0] = "shm"  # (the transport's own shared-window method, not MPI's)
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
