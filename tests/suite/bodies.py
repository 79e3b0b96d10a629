"""Test bodies for every SPMD transport: each takes a Communicator and returns a report.

A report maps a case name to ``(problem, digest)``: ``problem`` is None when this rank's
result matched the float64 reference (or the expected error was raised), else what went
wrong; ``digest`` hashes the result's bits, so the runner can check that every rank holds the
same bits. Bodies only use the public API, so a transport joins by running them.
"""

from __future__ import annotations

import functools
import hashlib
import threading

import numpy as np

from collectives.ops import ReduceOp, check_dtype, supported_dtypes
from collectives.tools.reference import exact_inputs, expected_outputs, reference

Report = dict

SIZES = (0, 1, 7, 1000)
ALGORITHMS = ("auto", "one_device", "ring", "rechd", "tree", "shuffle")
TWO_LEVEL = ("pscpu/pscpu", "nccl/xring", "rechd/ring", "tree/rechd")
FEW_DTYPES = (np.float32, np.int8, np.float16, np.complex64, np.bool_)


def digest(x) -> str | None:
    if x is None:
        return None
    x = np.ascontiguousarray(np.asarray(x))
    return hashlib.sha1(repr((x.shape, str(x.dtype))).encode() + x.view(np.uint8).tobytes()
                        ).hexdigest()[:16]


_INPUTS_LOCK = threading.Lock()


def inputs_and_reference(n: int, count: int, dtype: np.dtype, op: ReduceOp):
    """Every rank's inputs and their float64 reference, made once per case for a whole matrix
    (every rank and every algorithm of a process reads the same arrays, and each case checks
    that its call left its input unchanged): at 16 ranks, making them anew on each rank for
    each algorithm was most of the matrix's time. Thread ranks ask for a case at the same
    moment: the lock lets the first make it and the others read it (without it, most of them
    missed the cache together and each made the case again)."""
    with _INPUTS_LOCK:
        return _inputs_and_reference(n, count, dtype, op)


@functools.cache
def _inputs_and_reference(n: int, count: int, dtype: np.dtype, op: ReduceOp):
    xs = exact_inputs(n, count, dtype, op)
    return xs, reference(xs, op)


def pairs(dtypes=None):
    out = []
    for dtype in dtypes if dtypes is not None else supported_dtypes():
        for op in ReduceOp:
            try:
                check_dtype(op, np.dtype(dtype))
            except TypeError:
                continue
            out.append((np.dtype(dtype), op))
    return out


def compare(got, want, op=None) -> str | None:
    if want is None:
        return None if got is None else f"expected None, got {type(got).__name__}"
    if got is None:
        return "got None"
    got = np.asarray(got)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    if op is ReduceOp.MEAN and want.dtype.kind in "fc" or op is ReduceOp.MEAN and want.dtype.itemsize <= 2:
        tol = 1e-2 if want.dtype.itemsize <= 2 else 1e-6
        ok = np.allclose(got.astype(np.complex128), want.astype(np.complex128), rtol=tol, atol=0)
    else:
        ok = np.array_equal(got, want)
    return None if ok else "values differ from the float64 reference"


def _case(report: Report, name: str, got, want, op=None, inputs=(), same: bool = True) -> None:
    """Record one result: its problem (None: right) and, where every rank must hold the same
    bits (``same``), its digest."""
    problem = compare(got, want, op)
    for i, (x, before) in enumerate(inputs):
        if not np.array_equal(x, before):
            problem = f"input {i} was modified"
    report[name] = (problem, digest(got) if same else None)


def all_reduce_matrix(comm, algorithms=ALGORITHMS + TWO_LEVEL, full: bool = True) -> Report:
    """Every algorithm x dtype x op x size of all_reduce."""
    n, r = comm.size, comm.rank
    report: Report = {}
    for algorithm in algorithms:
        chosen = pairs() if full else pairs(FEW_DTYPES)
        for dtype, op in chosen:
            for count in SIZES:
                xs, want = inputs_and_reference(n, count, dtype, op)
                x = xs[r]
                before = x.copy()
                name = f"all_reduce/{algorithm}/{dtype}/{op.value}/{count}"
                try:
                    got = comm.all_reduce(x, op, algorithm, groups=2 if "/" in algorithm else None)
                except Exception as exc:  # noqa: BLE001 - reported, not raised
                    report[name] = (f"{type(exc).__name__}: {exc}", None)
                    continue
                _case(report, name, got, want, op, [(x, before)])
    return report


def other_collectives(comm, algorithms=ALGORITHMS) -> Report:
    """reduce (two roots), broadcast, all_gather (axis 1), reduce_scatter, gather, scatter and
    all_to_all, per algorithm that has them, on a few dtypes."""
    n, r = comm.size, comm.rank
    report: Report = {}
    for algorithm in algorithms:
        for dtype, op in pairs((np.float64, np.int16)):
            xs = exact_inputs(n, 101, dtype, op)
            for root in sorted({0, n - 1}):
                want = expected_outputs("reduce", xs, op, root=root)[r]
                got = _try(report, f"reduce/{algorithm}/{dtype}/{op.value}/{root}",
                           comm.reduce, xs[r], op, root, algorithm)
                if got is not False:
                    _case(report, f"reduce/{algorithm}/{dtype}/{op.value}/{root}", got, want, op)
            rows = [x.reshape(101, 1) for x in xs]
            want = expected_outputs("reduce_scatter", rows, op)[r]
            got = _try(report, f"rs/{algorithm}/{dtype}/{op.value}",
                       comm.reduce_scatter, rows[r], op, algorithm)
            if got is not False:
                _case(report, f"rs/{algorithm}/{dtype}/{op.value}", got, want, op, same=False)
        bcast = algorithm if algorithm != "rechd" else "tree"
        for root in sorted({0, n - 1}):
            value = np.arange(12.0).reshape(3, 4) + root
            got = _try(report, f"broadcast/{bcast}/{root}", comm.broadcast,
                       value if r == root else None, root, bcast)
            if got is not False:
                _case(report, f"broadcast/{bcast}/{root}", got, value)
        mine = np.full((2, 3), r, np.int32)
        whole = np.concatenate([np.full((2, 3), p, np.int32) for p in range(n)], axis=1)
        got = _try(report, f"all_gather/{algorithm}", comm.all_gather, mine, 1, algorithm)
        if got is not False:
            _case(report, f"all_gather/{algorithm}", got, whole)
    for algorithm in ("auto", "tree", "shuffle"):
        for root in sorted({0, n - 1}):
            rows = np.stack([np.full(5, p, np.float32) for p in range(n)])
            got = _try(report, f"gather/{algorithm}/{root}",
                       comm.gather, rows[r], root, algorithm)
            if got is not False:
                _case(report, f"gather/{algorithm}/{root}", got, rows if r == root else None)
            got = _try(report, f"scatter/{algorithm}/{root}", comm.scatter,
                       rows if r == root else None, root, algorithm)
            if got is not False:
                _case(report, f"scatter/{algorithm}/{root}", got, rows[r], same=False)
    for algorithm in ("auto", "ring", "shuffle"):
        sent = np.arange(2 * n * 3).reshape(2 * n, 3) + 1000 * r
        want = np.concatenate([(np.arange(2 * n * 3).reshape(2 * n, 3) + 1000 * p)[2 * r:2 * r + 2]
                               for p in range(n)])
        got = _try(report, f"all_to_all/{algorithm}", comm.all_to_all, sent, None, algorithm)
        if got is not False:
            _case(report, f"all_to_all/{algorithm}", got, want, same=False)
    return report


def _try(report: Report, name: str, method, *args, **kwargs):
    try:
        return method(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        report[name] = (f"{type(exc).__name__}: {exc}", None)
        return False


def async_and_prepared(comm, calls: int = 200) -> Report:
    """Many asynchronous calls in flight, waited in any order, mixed with blocking ones; a
    prepared all-reduce started again and again on refilled buffers."""
    n, r = comm.size, comm.rank
    report: Report = {}
    handles = [(k, comm.all_reduce(np.full(7, r + k, np.float64), "sum", "auto" if k % 2 else "ring",
                                   async_op=True)) for k in range(16)]
    blocking = comm.all_reduce(np.full(3, r, np.int64))
    _case(report, "async/blocking-between", blocking, np.full(3, sum(range(n)), np.int64))
    for k, handle in reversed(handles):
        _case(report, f"async/{k}", handle.wait(), np.full(7, sum(p + k for p in range(n)), float))
    x = np.zeros(5)
    out = np.empty(5)
    prepared = comm.all_reduce_init(x, "sum", out=out)
    for k in range(calls):
        x[:] = r * k
        prepared.start().wait()
        if not np.array_equal(out, np.full(5, k * sum(range(n)), float)):
            report["prepared"] = (f"wrong result at start {k}", None)
            break
    else:
        report["prepared"] = (None, digest(out))
    return report


def many_small_calls(comm, calls: int = 10_000) -> Report:
    """Back-to-back small all-reduces, every result checked."""
    n, r = comm.size, comm.rank
    x = np.empty(4, np.float32)
    for k in range(calls):
        x[:] = r + k % 5
        got = comm.all_reduce(x)
        if not np.array_equal(got, np.full(4, sum(p + k % 5 for p in range(n)), np.float32)):
            return {"many-small": (f"call {k} returned {got}", None)}
    return {"many-small": (None, digest(got))}


def point_to_point_and_objects(comm) -> Report:
    """A ring of sends, objects gathered and broadcast, tags kept apart."""
    n, r = comm.size, comm.rank
    report: Report = {}
    if n > 1:
        inbox, other = np.empty(4), np.empty(2, np.int32)
        first = comm.irecv(inbox, (r - 1) % n, tag=1)
        second = comm.irecv(other, (r - 1) % n, tag=2)
        comm.send(np.arange(2, dtype=np.int32) + r, (r + 1) % n, tag=2)
        comm.send(np.full(4, float(r)), (r + 1) % n, tag=1)
        _case(report, "p2p/tag1", first.wait(), np.full(4, float((r - 1) % n)), same=False)
        _case(report, "p2p/tag2", second.wait(), np.arange(2, dtype=np.int32) + (r - 1) % n,
              same=False)
    objects = comm.all_gather_object({"rank": r, "name": f"r{r}"})
    report["objects"] = (None if objects == [{"rank": p, "name": f"r{p}"} for p in range(n)]
                         else f"got {objects}", digest(np.array([len(objects)])))
    shared = comm.broadcast_object(("hello", n) if r == n - 1 else None, root=n - 1)
    report["broadcast_object"] = (None if shared == ("hello", n) else f"got {shared}", None)
    return report


def sub_communicators(comm) -> Report:
    """split by parity and dup, used at the same time from two threads."""
    n, r = comm.size, comm.rank
    half = comm.split(r % 2, key=-r)
    twin = comm.dup()
    results: dict = {}

    def use(name, c, value):
        try:
            results[name] = [c.all_reduce(np.full(3, value, np.int64)) for _ in range(20)][-1]
        except Exception as exc:  # noqa: BLE001 - reported
            results[name] = exc

    threads = [threading.Thread(target=use, args=("half", half, r)),
               threading.Thread(target=use, args=("twin", twin, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    members = [p for p in range(n) if p % 2 == r % 2]
    _case(report := {}, "split", results["half"], np.full(3, sum(members), np.int64), same=False)
    _case(report, "dup", results["twin"], np.full(3, n, np.int64))
    report["split-rank"] = (None if half.rank == sorted(members, reverse=True).index(r) else
                            f"rank {half.rank} in the split", None)
    return report


# A gradient list in miniature: mixed dtypes interleaved, empty, single-element, prime and
# larger tensors, one of them larger than the small bucket below (it travels alone).
BATCH_TENSORS = ((np.float32, (3, 5)), (np.float64, (7,)), (np.float32, (0,)), (np.float32, (1,)),
                 (np.int32, (4, 4)), (np.int32, (2,)), (np.float32, (1009,)), (np.float64, (2, 3)),
                 (np.float16, (11,)), (np.float32, (13,)))


def batch_fusion(comm, algorithms=("auto", "ring")) -> Report:
    """batch_all_reduce fused by default, with small buckets, unfused, and as one async
    handle: bitwise the per-tensor all-reduce's results (exact inputs), inputs untouched,
    input order and shapes; every op."""
    n, r = comm.size, comm.rank
    report: Report = {}
    for op in ReduceOp:
        tensors = [(np.dtype(d), s) for d, s in BATCH_TENSORS
                   if not (op is ReduceOp.MEAN and np.dtype(d).kind in "iu")]
        xs = [exact_inputs(n, int(np.prod(s)), d, op, seed=k, shape=s)
              for k, (d, s) in enumerate(tensors)]
        mine = [x[r] for x in xs]
        before = [x.copy() for x in mine]
        wants = [reference(x, op) for x in xs]
        for algorithm in algorithms:
            for label, kwargs in (("default", {}), ("small-buckets", {"bucket_bytes": 64}),
                                  ("unfused", {"bucket_bytes": 0}),
                                  ("async", {"async_op": True})):
                name = f"batch/{algorithm}/{op.value}/{label}"
                got = _try(report, name, comm.batch_all_reduce, mine, op, algorithm, **kwargs)
                if got is False:
                    continue
                got = got.wait() if kwargs.get("async_op") else got
                if len(got) != len(wants):
                    report[name] = (f"{len(got)} results for {len(wants)} tensors", None)
                    continue
                for k, (g, want) in enumerate(zip(got, wants)):
                    _case(report, f"{name}/{k}", g, want, op, list(zip(mine, before)))
    return report


def buckets_overlap(comm, steps: int = 3) -> Report:
    """``comm.buckets``: tensors marked ready one by one, in an order that differs from rank
    to rank, over several steps; every result the per-tensor all-reduce's bits, inputs
    untouched (fused buckets are reduced in place, in their own copy); MEAN too (integers
    to float64); buckets start as soon as they can (the first before the last tensor is
    ready); misuse raises."""
    n, r = comm.size, comm.rank
    report: Report = {}
    tensors = [(np.dtype(d), s) for d, s in BATCH_TENSORS]
    like = [np.zeros(s, d) for d, s in tensors]
    for op, bucket_bytes, op_steps in (("sum", 64, steps), ("mean", 256, 1)):
        buckets = comm.buckets(like, op, bucket_bytes=bucket_bytes)
        for step in range(op_steps):
            xs = [exact_inputs(n, int(np.prod(s)), d, op, seed=step * 31 + k, shape=s)
                  for k, (d, s) in enumerate(tensors)]
            order = list(range(len(tensors)))
            if r % 2:  # odd ranks: ready in another order (buckets still start in one order)
                order = order[1::2] + order[::2]
            before = [x[r].copy() for x in xs]
            started_early = False
            for k in order:
                buckets.ready(k, xs[k][r])
                started_early |= k != order[-1] and buckets.started > 0
            got = buckets.wait()
            for k, x in enumerate(xs):
                _case(report, f"buckets/{op}/{step}/{k}", got[k], reference(x, op), op,
                      [(x[r], before[k])])
            report[f"buckets/{op}/{step}/started-early"] = (
                None if started_early else "no bucket started before the last tensor", None)
    problems = []
    try:
        buckets.wait()
        problems.append("wait() with no tensor ready did not raise")
    except ValueError:
        pass
    try:
        buckets.ready(0, np.zeros(3, np.float32))
        problems.append("a tensor of the wrong shape was taken")
    except ValueError:
        pass
    report["buckets/misuse"] = ("; ".join(problems) or None, None)
    return report
