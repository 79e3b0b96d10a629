"""Correctness over real MPI ranks: every collective, algorithm, op and dtype.

Checks, per call: the result equals a float64 NumPy reference (exactly representable small
integers in, so every order of operations gives the same bits); the input is untouched; every
rank that holds the result holds the same bits (digests gathered to rank 0); and where a
schedule ran, the bits equal the embedded transport's for the same schedule
(``collectives.run`` on rank 0). Random floats then make the order of additions visible.
"""

from __future__ import annotations

import numpy as np
from _common import WORLD, Report, digest, exact_inputs, random_inputs, reference
from collectives.backends import mpi

import collectives
from collectives import algorithms
from collectives.ops import BFLOAT16, ReduceOp, check_dtype, supported_dtypes
from collectives.schedule import Collective

comm = mpi.init(timeout=20)
n, rank = comm.size, comm.rank
report = Report("matrix")
digests: dict[str, str] = {}
embedded: dict[str, list[str]] = {}
multi_group = comm.groups is not None and len(comm.groups) > 1

SIZES = [0, 1, 7, 1000, 65537]
SCHEDULES = ["ring", "rechd", "tree", "shuffle", "one_device", "ring/ring", "tree/rechd"]
COLLECTIVES = list(Collective)
REDUCING = (Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER)


def algorithms_for(collective: Collective) -> list[str]:
    shm = ["shm"] if collective is Collective.ALL_REDUCE else []
    return ["native", "auto", *shm] + [s for s in SCHEDULES
                                       if algorithms.supports(collective, algorithms.canonical(s))]


def valid(dtype, op) -> bool:
    try:
        check_dtype(op, dtype)
        return True
    except TypeError:
        return False


def call(c, collective: Collective, x, op, algorithm: str, root: int, groups=None):
    if collective is Collective.ALL_REDUCE:
        return c.all_reduce(x, op, algorithm, groups=groups)
    if collective is Collective.REDUCE:
        return c.reduce(x, op, root, algorithm)
    if collective is Collective.BROADCAST:
        return c.broadcast(x if c.rank == root else None, root, algorithm)
    if collective is Collective.ALL_GATHER:
        return c.all_gather(x, 0, algorithm)
    return c.reduce_scatter(x, op, algorithm)


def expected_for(collective: Collective, inputs, op, root: int, r: int):
    if collective is Collective.ALL_REDUCE:
        return reference(inputs, op)
    if collective is Collective.REDUCE:
        return reference(inputs, op) if r == root else None
    if collective is Collective.BROADCAST:
        return inputs[root]
    if collective is Collective.ALL_GATHER:
        return np.concatenate(inputs)
    full = reference(inputs, op)
    rows = full.shape[0]
    return full[r * rows // n:(r + 1) * rows // n]


def embedded_digests(collective: Collective, inputs, op, algorithm: str, root: int):
    """Every rank's result digest from the embedded transport running the same schedule."""
    if algorithm == "native":
        return None
    if "/" in algorithm and multi_group and collective is not Collective.ALL_REDUCE:
        if collective is Collective.REDUCE:  # the thread Communicator takes no groups here
            result = collectives.reduce(list(inputs), op, root, algorithm, groups=comm.groups)
            return [digest(result) if r == root else "None" for r in range(n)]
        return None
    groups = comm.groups if collective is Collective.ALL_REDUCE else None
    results = collectives.run(lambda c: call(c, collective, inputs[c.rank], op, algorithm, root,
                                             groups), n, timeout=60)
    return [digest(x) for x in results]


def run_case(collective: Collective, algorithm: str, dtype, op, count: int, kind: str = "exact",
             root: int = 0, seed: int = 0) -> None:
    key = f"{collective.value}|{algorithm}|{np.dtype(dtype)}|{op and op.value}|{count}|{kind}|{root}"
    if kind == "exact":
        inputs = exact_inputs(n, count, dtype, op or ReduceOp.SUM)
    else:
        inputs = random_inputs(n, count, dtype, seed)
    x = inputs[rank]
    before = x.copy()
    try:
        result = call(comm, collective, x, op, algorithm, root, None)
    except Exception as exc:  # noqa: BLE001 - recorded; the summary lists it
        report.check(False, f"{key}: raised {type(exc).__name__}: {exc}")
        return
    report.check(np.array_equal(x, before), f"{key}: input modified")
    ran = comm.last_algorithm
    if algorithm == "shm" and n > 1:
        report.check(ran == "shm", f"{key}: ran {ran!r}, not shm")
    if algorithm == "native" and n > 1:
        native_expected = (collective in (Collective.BROADCAST, Collective.ALL_GATHER)
                           or mpi.native_types(np.dtype(dtype), op) is not None)
        if collective is Collective.REDUCE_SCATTER and count > mpi.MAX_COUNT:
            native_expected = False  # one MPI call cannot take it: the schedule runs
        report.check((ran == "native") == native_expected,
                     f"{key}: ran {ran!r}, native expected {native_expected}")
    expected = expected_for(collective, inputs, op or ReduceOp.SUM, root, rank)
    if expected is None:
        report.check(result is None, f"{key}: non-root got {type(result).__name__}, not None")
    elif kind == "exact":
        same = (result is not None and result.dtype == expected.dtype
                and result.shape == expected.shape and np.array_equal(result, expected))
        report.check(same, f"{key}: result differs from the float64 reference "
                           f"({None if result is None else (result.dtype, result.shape)})")
    else:
        tol = 5e-2 if np.dtype(dtype).itemsize <= 2 else 1e-4
        close = np.allclose(np.asarray(result, np.float64), np.asarray(expected, np.float64),
                            rtol=tol, atol=tol * n)
        report.check(close, f"{key}: random-float result far from the reference")
    digests[key] = digest(result)
    if rank == 0:
        name = algorithm if algorithm != "auto" else ran
        if name not in ("native", "shm"):  # not one of the core's schedules
            got = embedded_digests(collective, inputs, op, name, root)
            if got is not None:
                embedded[key] = got


def main() -> None:
    # 1. every (dtype, op) pair: the native path where MPI has one, a schedule otherwise
    for dtype in supported_dtypes():
        for op in ReduceOp:
            if not valid(dtype, op):
                continue
            for collective, algs in ((Collective.ALL_REDUCE, ["native", "ring", "shm", "auto"]),
                                     (Collective.REDUCE, ["native", "tree"]),
                                     (Collective.REDUCE_SCATTER, ["native", "ring"])):
                for algorithm in algs:
                    run_case(collective, algorithm, dtype, op, 1000, root=n - 1)
    # 2. every algorithm of every collective at every size
    for collective in COLLECTIVES:
        op = ReduceOp.SUM if collective in REDUCING else None
        for algorithm in algorithms_for(collective):
            for count in SIZES:
                run_case(collective, algorithm, np.float32, op, count, root=count % n)
            for dtype in (np.float16, BFLOAT16):
                for count in (7, 65537):
                    run_case(collective, algorithm, dtype, op, count)
    # 3. random floats: schedules give the embedded transport's bits, native identical bits
    for collective in REDUCING:
        for algorithm in algorithms_for(collective):
            for dtype in (np.float32, np.float64, np.float16, BFLOAT16):
                run_case(collective, algorithm, dtype, ReduceOp.SUM, 1000, "random", seed=7)
            run_case(collective, algorithm, np.float32, ReduceOp.SUM, 65537, "random", seed=8)
    shapes_and_options()
    chunked()
    scratch_is_reused()
    compare()


def shapes_and_options() -> None:
    """Shapes, axes, roots, ``out=``, integer MEAN, non-contiguous and scalar inputs."""
    x = (np.arange(60, dtype=np.float64).reshape(3, 4, 5) % 7) + rank
    total = sum((np.arange(60, dtype=np.float64).reshape(3, 4, 5) % 7) + r for r in range(n))
    for algorithm in ("native", "ring", "auto"):
        out = np.empty_like(x)
        got = comm.all_reduce(x, "mean", "shm", out=out)
        report.check(got is out and np.array_equal(out, total / n), "all_reduce shm out=")
        got = comm.all_reduce(x, "mean", algorithm, out=out)
        report.check(got is out and np.array_equal(out, total / n), f"all_reduce out= {algorithm}")
        ints = np.arange(10, dtype=np.int32) + rank
        mean = comm.all_reduce(ints, "mean", algorithm)
        report.check(mean.dtype == np.float64 and np.allclose(mean, np.arange(10) + (n - 1) / 2),
                     f"int mean {algorithm}")
        red = comm.reduce(ints, "mean", n - 1, algorithm)
        report.check((red is None) == (rank != n - 1), f"reduce root {algorithm}")
        if red is not None:
            report.check(red.dtype == np.float64 and np.allclose(red, np.arange(10) + (n - 1) / 2),
                         f"reduce int mean {algorithm}")
        rows = np.arange(6, dtype=np.int64).reshape(3, 2) * (rank + 1)
        mine = comm.reduce_scatter(rows, "sum", algorithm)
        full = np.arange(6).reshape(3, 2) * (n * (n + 1) // 2)
        report.check(np.array_equal(mine, full[rank * 3 // n:(rank + 1) * 3 // n]),
                     f"reduce_scatter 3 rows over {n} ranks {algorithm}")
        block = np.full((2, 3), rank, np.int16)
        gathered = comm.all_gather(block, axis=1, algorithm=algorithm)
        want = np.concatenate([np.full((2, 3), r, np.int16) for r in range(n)], axis=1)
        report.check(np.array_equal(gathered, want), f"all_gather axis=1 {algorithm}")
        scalar = comm.all_gather(np.float32(rank), algorithm=algorithm)
        report.check(np.array_equal(scalar, np.arange(n, dtype=np.float32)),
                     f"all_gather scalar {algorithm}")
        strided = (np.arange(20, dtype=np.float32) + rank)[::2]
        got = comm.all_reduce(strided, "max", algorithm)
        report.check(np.array_equal(got, np.arange(0, 20, 2, dtype=np.float32) + n - 1),
                     f"non-contiguous input {algorithm}")
        # Ranks on different paths (a list takes the core's, an array the fast native one)
        mixed = [1.0, 2.0, 3.0] if rank == 0 else np.array([1.0, 2.0, 3.0])
        got = comm.all_reduce(mixed, "sum", algorithm)
        report.check(np.array_equal(got, np.array([1.0, 2.0, 3.0]) * n), f"mixed paths {algorithm}")
        aliased = np.full(4, rank + 1, np.int32)
        got = comm.all_reduce(aliased, "sum", algorithm, out=aliased)
        report.check(got is aliased and np.array_equal(aliased, np.full(4, n * (n + 1) // 2)),
                     f"out=x {algorithm}")
        target = np.empty(5, BFLOAT16)
        src = np.arange(5).astype(BFLOAT16) if rank == n - 1 else None
        got = comm.broadcast(src, n - 1, algorithm, out=target)
        report.check(got is target and np.array_equal(target.astype(np.float32), np.arange(5)),
                     f"broadcast bfloat16 from rank {n - 1} into out= {algorithm}")


def chunked() -> None:
    """Messages split at a lowered MAX_COUNT: the path arrays beyond 2**31 elements take."""
    saved = mpi.MAX_COUNT, mpi.NATIVE_PIECE_BYTES
    mpi.MAX_COUNT, mpi.NATIVE_PIECE_BYTES = 300, 1024
    try:
        for collective in COLLECTIVES:
            op = ReduceOp.SUM if collective in REDUCING else None
            for algorithm in ("native", "ring", "auto"):
                for count in (1000, 4099):
                    run_case(collective, algorithm, np.float32, op, count, root=n - 1)
            run_case(collective, "native", BFLOAT16, op, 1000)
    finally:
        mpi.MAX_COUNT, mpi.NATIVE_PIECE_BYTES = saved


def scratch_is_reused() -> None:
    """Receive buffers come from one arena that stops growing once it fits the largest call."""
    if n == 1:
        return
    x = np.ones(1 << 18, np.float32)
    comm.all_reduce(x, algorithm="ring")
    size = len(comm.transport._arena)
    for _ in range(3):
        comm.all_reduce(x, algorithm="ring")
    report.check(size > 0 and len(comm.transport._arena) == size,
                 f"arena grew from {size} to {len(comm.transport._arena)} bytes")


def compare() -> None:
    """Rank 0: same bits on every rank holding a result, and the embedded transport's bits."""
    everyone = WORLD.gather(digests, root=0)
    if rank != 0:
        return
    for key in digests:
        collective = Collective(key.split("|")[0])
        per_rank = [d[key] for d in everyone]
        if collective in (Collective.ALL_REDUCE, Collective.BROADCAST, Collective.ALL_GATHER):
            report.check(len(set(per_rank)) == 1, f"{key}: ranks hold different bits {per_rank}")
        if key in embedded:
            report.check(per_rank == embedded[key],
                         f"{key}: bits differ from the embedded transport's")


if __name__ == "__main__":
    main()
    compared = WORLD.bcast(len(embedded), root=0)
    report.finish(f"embedded_compared={compared} groups={comm.groups}")
