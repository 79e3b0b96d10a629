"""The correctness matrix, as one function of a communicator: the same body runs on thread
ranks (``tests/test_mpi.py``, no MPI needed) and on MPI ranks (``matrix.py`` under ``mpiexec``).

Every case calls one collective with one algorithm, op, dtype and size on every rank, then
checks on that rank: the input is untouched; the result has the right dtype and shape and
equals the float64 reference (exact inputs: any order of operations gives the same bits);
where a schedule of the core ran, its bits equal the multi-device API's for the same
schedule (random floats make the order of additions visible). The caller then compares the
digests across ranks: every rank holding a result holds the same bits.
"""

from __future__ import annotations

import hashlib

import numpy as np

import collectives
from collectives import algorithms
from collectives.algorithms.schedule import Collective
from collectives.ops import BFLOAT16, ReduceOp, check_dtype, supported_dtypes
from collectives.tools.reference import exact_inputs, expected_outputs, random_inputs

SIZES = (0, 1, 7, 1000)
FIVE = (Collective.ALL_REDUCE, Collective.REDUCE, Collective.BROADCAST, Collective.ALL_GATHER,
        Collective.REDUCE_SCATTER)
EXCHANGES = (Collective.GATHER, Collective.SCATTER, Collective.ALL_TO_ALL)  # moves, no arithmetic
SCHEDULES = ("one_device", "ring", "rechd", "tree", "shuffle", "ring/ring", "tree/rechd")
REDUCING = (Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER)
# what the schedules run on (the natives and auto run every pair the library accepts)
SAMPLES = [(np.float32, ReduceOp.SUM), (np.int8, ReduceOp.MAX), (np.float16, ReduceOp.SUM),
           (np.bool_, ReduceOp.MIN), (np.complex64, ReduceOp.PROD), (np.int32, ReduceOp.MEAN)]
if BFLOAT16 is not None:
    SAMPLES.append((BFLOAT16, ReduceOp.MEAN))


def digest(x) -> str:
    if x is None:
        return "None"
    x = np.ascontiguousarray(x)
    return f"{x.dtype}{x.shape}:" + hashlib.blake2b(x.view(np.uint8).tobytes(),
                                                     digest_size=12).hexdigest()


def pairs() -> list[tuple[np.dtype, ReduceOp]]:
    out = []
    for dtype in supported_dtypes():
        for op in ReduceOp:
            try:
                check_dtype(op, dtype)
            except TypeError:
                continue
            out.append((np.dtype(dtype), op))
    return out


def algorithms_for(collective: Collective, natives: tuple) -> list[str]:
    own = [a for a in ("native", "shm") if a in natives
           and (a != "shm" or collective is Collective.ALL_REDUCE)]
    return own + ["auto"] + [s for s in SCHEDULES if algorithms.supports(collective, s)]


def call(comm, collective: Collective, x, op, algorithm: str, root: int):
    if collective is Collective.ALL_REDUCE:
        return comm.all_reduce(x, op, algorithm)
    if collective is Collective.REDUCE:
        return comm.reduce(x, op, root, algorithm)
    if collective is Collective.BROADCAST:
        return comm.broadcast(x if comm.rank == root else None, root, algorithm)
    if collective is Collective.ALL_GATHER:
        return comm.all_gather(x, 0, algorithm)
    return comm.reduce_scatter(x, op, algorithm)


def multi_device(collective: Collective, inputs, op, algorithm: str, root: int, groups):
    """Every device's result from the multi-device API running the same schedule (None where
    that API has no such call: two-level schedules other than all-reduce and reduce)."""
    two_level = "/" in algorithm
    if collective is Collective.ALL_REDUCE:
        return collectives.all_reduce(inputs, op, algorithm, groups=groups if two_level else None)
    if collective is Collective.REDUCE:
        got = collectives.reduce(inputs, op, root, algorithm, groups=groups if two_level else None)
        return [got if r == root else None for r in range(len(inputs))]
    if two_level:
        return None
    if collective is Collective.BROADCAST:
        return collectives.broadcast(inputs[root], len(inputs), algorithm)
    if collective is Collective.ALL_GATHER:
        return collectives.all_gather(inputs, 0, algorithm)
    return collectives.reduce_scatter(inputs, op, algorithm)


class Matrix:
    """Runs the cases on one rank, collecting failures and result digests."""

    def __init__(self, comm, groups=None):
        self.comm, self.groups = comm, groups
        self.n, self.rank = comm.size, comm.rank
        native = comm.transport.native
        self.natives = tuple(native.names) if native is not None else ()
        self.failures: list[str] = []
        self.digests: dict[str, str] = {}
        self.cases = 0

    def fail(self, key: str, what: str) -> None:
        self.failures.append(f"rank {self.rank}: {key}: {what}")

    def case(self, collective: Collective, algorithm: str, dtype, op, count: int, *,
             kind: str = "exact", root: int = 0) -> None:
        n, rank = self.n, self.rank
        if collective is Collective.BROADCAST and np.dtype(dtype) == BFLOAT16:
            return  # the core's broadcast descriptor loses bfloat16 (its dtype.str is "<V2")
        op = op if collective in REDUCING else None
        key = (f"{collective.value}|{algorithm}|{np.dtype(dtype)}|{op and op.value}|{count}|"
               f"{kind}|{root}")
        if kind == "exact":
            inputs = exact_inputs(n, count, dtype, op or ReduceOp.SUM)
        else:
            inputs = random_inputs(n, count, dtype, seed=count)
        x = inputs[rank]
        before = x.copy()
        self.cases += 1
        self.comm.last_algorithm = None  # the hot path of repeated native calls leaves it be
        try:
            result = call(self.comm, collective, x, op, algorithm, root)
        except Exception as exc:  # noqa: BLE001 - recorded; the summary lists it
            self.fail(key, f"raised {type(exc).__name__}: {exc}")
            return
        if not np.array_equal(x.view(np.uint8), before.view(np.uint8)):
            self.fail(key, "input modified")
        ran = self.comm.last_algorithm or "native"
        self.digests[key] = digest(result)
        expected = expected_outputs(collective.value, inputs, op or "sum", root=root)[rank]
        if expected is None:
            if result is not None:
                self.fail(key, f"non-root got {type(result).__name__}, not None")
            return
        if result is None or result.dtype != expected.dtype or result.shape != expected.shape:
            self.fail(key, f"got {None if result is None else (result.dtype, result.shape)}, "
                           f"expected {(expected.dtype, expected.shape)}")
            return
        if kind == "exact" and not np.array_equal(result, expected):
            self.fail(key, "differs from the float64 reference")
        if ran in self.natives or ran is None:
            return
        devices = multi_device(collective, inputs, op, ran, root, self.groups)
        if devices is not None and digest(devices[rank]) != digest(result):
            self.fail(key, f"bits differ from the multi-device API's {ran}")

    def run(self, sizes=SIZES) -> Matrix:
        n = self.n
        # 1. every (dtype, op) pair on the natives and auto: MPI's path where MPI has the pair
        for dtype, op in pairs():
            for collective in REDUCING:
                for algorithm in algorithms_for(collective, self.natives):
                    if algorithm in ("native", "shm", "auto"):
                        self.case(collective, algorithm, dtype, op, 1000, root=n - 1)
        for dtype in supported_dtypes():
            for collective in (Collective.BROADCAST, Collective.ALL_GATHER):
                self.case(collective, "native" if "native" in self.natives else "auto", dtype,
                          None, 7, root=n - 1)
        # 2. every algorithm of every collective, at every size, on a few pairs
        for collective in FIVE:
            for algorithm in algorithms_for(collective, self.natives):
                for count in sizes:
                    for dtype, op in SAMPLES[:2] if count != 7 else SAMPLES:
                        self.case(collective, algorithm, dtype, op, count, root=count % n)
        # 3. random floats: the order of additions shows; schedules match the multi-device API
        for collective in REDUCING:
            for algorithm in algorithms_for(collective, self.natives):
                for dtype in (np.float32, np.float16):
                    self.case(collective, algorithm, dtype, ReduceOp.SUM, 1000, kind="random")
        # 4. gather, scatter, all-to-all: every algorithm, a few sizes and dtypes
        for collective in EXCHANGES:
            for algorithm in algorithms_for(collective, self.natives):
                for count in sizes:
                    for dtype in (np.float32, np.int8, np.bool_):
                        self.exchange(collective, algorithm, dtype, count, root=count % n)
        return self

    def exchange(self, collective: Collective, algorithm: str, dtype, count: int, *,
                 root: int = 0) -> None:
        """A gather, scatter or all-to-all of ``count`` elements per block: exact copies."""
        n, rank, comm = self.n, self.rank, self.comm
        key = f"{collective.value}|{algorithm}|{np.dtype(dtype)}|None|{count}|exact|{root}"
        blocks = [[(np.arange(count) * 7 + 13 * r + 3 * k).astype(dtype) for k in range(n)]
                  for r in range(n)]  # blocks[r][k]: rank r's k-th block
        self.cases += 1
        try:
            if collective is Collective.GATHER:
                x = blocks[rank][0]
                got = comm.gather(x, root, algorithm)
                want = np.stack([blocks[r][0] for r in range(n)]) if rank == root else None
            elif collective is Collective.SCATTER:
                x = np.stack(blocks[root]) if rank == root else None
                got = comm.scatter(x, root, algorithm)
                want = blocks[root][rank]
            else:
                x = np.concatenate(blocks[rank])
                got = comm.all_to_all(x, algorithm=algorithm)
                want = np.concatenate([blocks[r][rank] for r in range(n)])
        except Exception as exc:  # noqa: BLE001 - recorded; the summary lists it
            self.fail(key, f"raised {type(exc).__name__}: {exc}")
            return
        self.digests[key] = digest(got)
        if want is None:
            if got is not None:
                self.fail(key, "a rank other than the root got a result")
        elif got is None or got.dtype != want.dtype or not np.array_equal(got, want):
            self.fail(key, f"got {got!r}, expected {want!r}")


def identical(per_rank: list[dict[str, str]]) -> list[str]:
    """Keys of calls that give every rank the same result whose bits differ between ranks."""
    bad = []
    for key in per_rank[0]:
        if key.split("|")[0] not in ("all_reduce", "broadcast", "all_gather"):
            continue  # one rank holds the result, or each rank its own block
        held = {d.get(key) for d in per_rank}
        if len(held) > 1:
            bad.append(f"{key}: ranks hold different bits")
    return bad
