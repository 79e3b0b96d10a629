"""Under mpiexec on a GPU: the NCCL backend's Communicator, checked against the reference.

``one_rank`` (mpiexec -n 1): every collective, op and dtype on a one-rank NCCL communicator,
blocking and async, plus the errors for host arrays, and ``dup``/``split`` on streams of
their own. ``two_level`` (mpiexec -n 2 with
COLLECTIVES_RANKS_PER_NODE=1, every rank on GPU 0): all-reduce through NCCL inside each
simulated node and MPI between them; calls that need a NCCL world communicator raise a clear
error naming the shared GPU. ``two_level_async`` (any -n, with COLLECTIVES_RANKS_PER_NODE):
a loop of asynchronous two-level all-reduces, several in flight at once. ``mixed_async``
(a world over several GPUs): asynchronous calls that run the library's schedules over NCCL
send/recv in flight with NCCL's own collectives, one rank arriving late each time. ``hot``
(any -n, one GPU per rank): the hot path of a repeated NCCL all-reduce. ``refused`` (-n 2,
as ``two_level``): calls refused at their agreement (ranks disagree on a dtype; one rank's
bad op, also among asynchronous calls of a new signature) leave the communicator usable.
``p2p_ring`` (a world over several GPUs): users' messages around a ring, each receive posted
before its send.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import cupy
import numpy as np

import collectives
from collectives.ops import BFLOAT16, ReduceOp, check_dtype
from collectives.tools.reference import exact_input, expected_outputs

STAND_IN = str(cupy.__version__).endswith("-fake")
if STAND_IN:  # real CuPy's argument types, which the stand-in does not enforce (apicheck)
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
    from apicheck import strict

    api = contextlib.ExitStack()
    api_problems = api.enter_context(strict())
mode = sys.argv[1]
comm = collectives.load_backend("nccl").init(timeout=60)
rank, size = comm.rank, comm.size
DTYPES = [np.bool_, np.int8, np.int16, np.uint32, np.int64, np.float16, np.float32, np.float64,
          np.complex64, np.complex128]
# bfloat16 where ml_dtypes is installed (a NumPy stand-in for CuPy has no NCCL bfloat16)
if BFLOAT16 is not None and not STAND_IN:
    DTYPES.append(BFLOAT16)
checked = 0


def pairs():
    for dtype in DTYPES:
        for op in ReduceOp:
            try:
                check_dtype(op, np.dtype(dtype))
            except TypeError:
                continue
            yield np.dtype(dtype), op


def same(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def check(collective, dtype, op, count, algorithm, async_op=False):
    global checked
    n = size
    rows = count * n if collective == "reduce_scatter" else count
    inputs = [exact_input(n, p, rows, dtype, op) for p in range(n)]
    x = cupy.asarray(inputs[rank])
    fn = getattr(comm, collective)
    if collective in ("all_reduce", "reduce_scatter"):
        out = fn(x, op.value, algorithm, async_op=async_op)
    elif collective == "reduce":
        out = fn(x, op.value, 0, algorithm, async_op=async_op)
    elif collective == "broadcast":
        out = fn(x, 0, algorithm, async_op=async_op)
    else:
        out = fn(x, 0, algorithm, async_op=async_op)
    if async_op:
        out = out.wait()
    expected = expected_outputs(collective, inputs, op)[rank]
    if expected is None:
        return
    got = cupy.asnumpy(out)
    if op is ReduceOp.MEAN and expected.dtype.kind in "fc":
        np.testing.assert_allclose(got, expected, rtol=1e-2 if expected.itemsize <= 4 else 1e-6)
    else:
        assert same(got, expected), (collective, dtype, op, count, algorithm, got, expected)
    checked += 1


if mode == "one_rank":
    for dtype, op in pairs():
        for collective in ("all_reduce", "reduce", "reduce_scatter"):
            for count in (0, 1, 1009):
                check(collective, dtype, op, count, "auto")
        check("all_reduce", dtype, op, 257, "nccl", async_op=True)
        check("all_reduce", dtype, op, 257, "ring")
    for dtype in DTYPES:
        check("broadcast", np.dtype(dtype), ReduceOp.SUM, 1009, "auto")
        check("all_gather", np.dtype(dtype), ReduceOp.SUM, 1009, "auto")
    try:
        comm.all_reduce(np.zeros(3, np.float32))
        raise AssertionError("a NumPy array was accepted")
    except TypeError as exc:
        assert "CuPy arrays" in str(exc), exc
    # an asynchronous call off the hot path (MEAN) records the event after its work as its
    # work is enqueued (at wait() the event followed every call enqueued since: a wait with a
    # timeout waited for them too, and is_completed() asked whether the stream was idle)
    handle = comm.all_reduce(cupy.ones(1009, np.float32), "mean", async_op=True)
    while not handle._work.is_completed():
        time.sleep(0.001)
    assert handle._done is not None, "no event after the call's work before wait()"
    later = comm.all_reduce(cupy.ones(7, np.float32), "mean", async_op=True)
    assert same(cupy.asnumpy(handle.wait(timeout=30)), np.ones(1009, np.float32))
    assert same(cupy.asnumpy(later.wait()), np.ones(7, np.float32))
    checked += 1
    # dup() and split() run on streams of their own (on one stream, two threads' calls that
    # ranks enqueue in different orders would wait for each other on the GPU)
    for child in (comm.dup(), comm.split(0)):
        assert child.transport.stream.ptr != comm.transport.stream.ptr
        got = child.all_reduce(cupy.full(5, 3.0, np.float32))
        assert same(cupy.asnumpy(got), np.full(5, 3.0 * size, np.float32))
        child.synchronize()
        child.free()
        checked += 1
    comm.barrier()
    comm.synchronize()
elif mode == "two_level":
    for dtype, op in pairs():
        if (dtype in (np.float16, np.int16) or dtype.name == "bfloat16"
                or (dtype.kind == "c" and op is ReduceOp.PROD)):
            continue  # no exact NCCL form, or no MPI type (float16, bfloat16)
        for count in (0, 1, 1009, (4 << 20) + 3):
            for algorithm in ("auto", "two_level"):
                if count > 2000 and (dtype != np.float32 or algorithm == "auto"):
                    continue
                check("all_reduce", dtype, op, count, algorithm)
    x = cupy.ones(10, np.float32)
    for bad in (lambda: comm.all_reduce(x, "sum", "nccl"), lambda: comm.broadcast(x, 0)):
        try:
            bad()
            raise AssertionError("ranks sharing a GPU were given a NCCL world communicator")
        except ValueError as exc:  # every rank that validated the call itself
            assert "share GPU" in str(exc), exc
        except collectives.PeerFailedError as exc:  # a broadcast's non-root hears the root's
            assert rank != 0 and "share GPU" in str(exc), exc
    assert (cupy.asnumpy(comm.all_reduce(x)) == size).all()  # still usable
elif mode == "two_level_async":
    # A loop of asynchronous two-level all-reduces, several in flight at once, sizes of one
    # and of several 4 MiB chunks: each run issues its chunks' MPI all-reduces and its NCCL
    # all-gather as its copies land, so later calls must not start theirs in between.
    sizes = [1009, (4 << 20) + 3, 3, (9 << 20) // 4, 0, 257]
    for step in range(3):
        works, wanted = [], []
        for k, count in enumerate(sizes):
            dtype = np.dtype(np.float32 if k % 2 == 0 else np.int64)
            inputs = [exact_input(size, p, count, dtype, ReduceOp.SUM) for p in range(size)]
            x = cupy.asarray(inputs[rank])
            works.append(comm.all_reduce(x, "sum", "two_level", async_op=True))
            wanted.append(expected_outputs("all_reduce", inputs, ReduceOp.SUM)[rank])
        for work, expected in zip(works, wanted):
            got = cupy.asnumpy(work.wait())
            assert same(got, expected), (step, got[:4], expected[:4])
            checked += 1
elif mode == "hot":
    # The hot path of an agreed all-reduce (backends/nccl/hot_path.py), on the caller's own
    # non-blocking stream where the inputs are made and the results read: into a new array,
    # into out=, in place, at sizes up to several MiB (no copy: no size limit).
    from collectives.backends.nccl.hot_path import HotAllReduce

    hot_runs: list[bool] = []  # every call of the hot path's quick(): whether it ran the call
    quick = HotAllReduce.quick

    def counted(self, x, out, seq):
        got = quick(self, x, out, seq)
        hot_runs.append(got is not None)
        return got

    HotAllReduce.quick = counted  # (the real one runs; only counted)
    stream = cupy.cuda.Stream(non_blocking=True)
    for dtype, op in ((np.dtype(np.float32), ReduceOp.SUM), (np.dtype(np.int64), ReduceOp.MAX)):
        for count in (1, 1009, (1 << 20) + 3):
            inputs = [exact_input(size, p, count, dtype, op) for p in range(size)]
            expected = expected_outputs("all_reduce", inputs, op)[rank]
            with stream:
                for step in range(6):
                    x = cupy.asarray(inputs[rank])
                    target = (None, cupy.empty_like(x), x)[step % 3]
                    got = comm.all_reduce(x, op.value, "nccl", out=target)
                    assert target is None or got is target, step
                    assert same(cupy.asnumpy(got), expected), (step, count, dtype)
                    if target is not x:
                        assert same(cupy.asnumpy(x), inputs[rank]), "the input was written"
                    # the first call of a signature is agreed; the hot path runs the others
                    assert hot_runs == [True] * step, (step, hot_runs)
                    checked += 1
                # an asynchronous call of the agreed signature takes the hot path too
                handle = comm.all_reduce(cupy.asarray(inputs[rank]), op.value, "nccl",
                                         async_op=True)
                assert same(cupy.asnumpy(handle.wait()), expected), (count, dtype)
                target = cupy.empty_like(x)  # (and into an out=)
                handle = comm.all_reduce(cupy.asarray(inputs[rank]), op.value, "nccl",
                                         out=target, async_op=True)
                assert handle.wait() is target and same(cupy.asnumpy(target), expected)
                assert hot_runs == [True] * 7, hot_runs
                checked += 1
            hot_runs.clear()
    # not hot, so the engine's way each time: MEAN (a division after the sum), float MAX
    # (order-preserving keys); an out on another GPU (where there is one) is refused
    for op, dtype in ((ReduceOp.MEAN, np.dtype(np.float64)), (ReduceOp.MAX, np.dtype(np.float32))):
        inputs = [exact_input(size, p, 1009, dtype, op) for p in range(size)]
        expected = expected_outputs("all_reduce", inputs, op)[rank]
        for step in range(3):
            got = comm.all_reduce(cupy.asarray(inputs[rank]), op.value, "nccl")
            assert same(cupy.asnumpy(got), expected), (op, step)
            assert not hot_runs, (op, hot_runs)
            checked += 1
    if cupy.cuda.runtime.getDeviceCount() > 1:
        x = cupy.ones(8, np.float32)
        with cupy.cuda.Device((comm.transport.device + 1) % cupy.cuda.runtime.getDeviceCount()):
            elsewhere = cupy.empty(8, np.float32)
        for _ in range(2):  # refused, naming both GPUs (NCCL would write to the wrong one)
            try:
                comm.all_reduce(x, "sum", "nccl", out=elsewhere)
                raise AssertionError("an out on another GPU was accepted")
            except ValueError as exc:
                assert "out is on GPU" in str(exc), exc
            assert same(cupy.asnumpy(comm.all_reduce(x, "sum", "nccl")),
                        np.full(8, size, np.float32)), "the communicator broke"
            checked += 1
    x = cupy.ones(8, np.float32)
    half = x[::2]  # not contiguous: the engine's way runs it (and says why, if it must)
    assert same(cupy.asnumpy(comm.all_reduce(half, "sum", "nccl")), np.full(4, size, np.float32))
    # an out that partly overlaps the input: not hot; the engine's way reduces into a buffer
    # of its own, then copies, so the input is read before anything is written
    overlapping = cupy.arange(9, dtype=np.float32)
    comm.all_reduce(overlapping[:8], "sum", "nccl", out=overlapping[1:])
    assert same(cupy.asnumpy(overlapping), np.r_[0, np.arange(8) * size].astype(np.float32))
    checked += 2
elif mode == "refused":
    # (each digest of a refused call differed, and the watchdog broke the communicator)
    for k, (x, error) in enumerate([
            (cupy.ones(3, np.float32 if rank == 0 else np.float64),
             collectives.CollectiveMismatchError),
            (cupy.ones(3, np.bool_ if rank == 1 else np.float32),
             TypeError if rank == 1 else collectives.PeerFailedError)]):
        try:
            comm.all_reduce(x, "sum")
            raise AssertionError(f"refused call {k} ran")
        except error:
            pass
        comm.synchronize()
        time.sleep(0.1)  # (the watchdog's checks run meanwhile)
        got = comm.all_reduce(cupy.ones(2, np.float32), "sum")
        assert same(cupy.asnumpy(got), np.full(2, size, np.float32)), k
        checked += 1
    # A list of three tensors of a new signature, each its own bucket, all issued at once;
    # rank 1 (0.2 s late) passes a bad op and refuses each bucket. Rank 0's later buckets
    # wait for the first's verdict, hear the refusal, and agree on their own: their digests
    # must say so (they said "moving" at issue, beside rank 1's refusals, and the digests'
    # difference broke the communicator)
    for step in range(2):
        xs = [cupy.ones(257 + step, np.float32) for _ in range(3)]  # (a new signature)
        if rank == 1:
            time.sleep(0.2)
        try:
            comm.batch_all_reduce(xs, "median" if rank == 1 else "sum", bucket_bytes=0,
                                  async_op=True).wait()
            raise AssertionError(f"step {step}: the refused list ran")
        except (ValueError, collectives.PeerFailedError) as exc:
            mine = isinstance(exc, ValueError)
            assert mine == (rank == 1) and "median" in str(exc), (step, exc)
        comm.synchronize()
        time.sleep(0.1)  # (the watchdog's checks run meanwhile)
        got = comm.all_reduce(cupy.ones(2, np.float32), "sum")
        assert same(cupy.asnumpy(got), np.full(2, size, np.float32)), step
        checked += 1
elif mode == "mixed_async":
    # A new signature (a schedule over send/recv, agreed first) then an agreed one (NCCL's
    # all-reduce, no agreement). The early rank's agreement completes while it is busy
    # elsewhere, so its schedule's rounds reach the stream before it issues the second call;
    # the late rank issues both at once, its agreement still open. Both must still put the
    # rounds and NCCL's collective on their streams in one order (swapped, each stream waits
    # for the other forever).
    dtype = np.dtype(np.float32)
    native_in = [exact_input(size, p, 4099, dtype, ReduceOp.SUM) for p in range(size)]
    native_expected = expected_outputs("all_reduce", native_in, ReduceOp.SUM)[rank]
    native_x = cupy.asarray(native_in[rank])
    comm.all_reduce(native_x, "sum", "nccl")  # agreed from now on
    for step in range(4):
        count = 1000 + step
        inputs = [exact_input(size, p, count, dtype, ReduceOp.SUM) for p in range(size)]
        late = rank == step % size
        if late:
            time.sleep(0.3)
        first = comm.all_reduce(cupy.asarray(inputs[rank]), "sum", ("ring", "rechd")[step % 2],
                                async_op=True)
        blocks = cupy.full(size * (2 + step), rank * 10 + step, np.int32)
        exchanged = comm.all_to_all(blocks, async_op=True)  # an exchange over send/recv
        if not late:  # the late rank's arrival completes this rank's agreements meanwhile
            time.sleep(0.6)
        second = comm.all_reduce(native_x, "sum", "nccl", async_op=True)
        assert same(cupy.asnumpy(first.wait()),
                    expected_outputs("all_reduce", inputs, ReduceOp.SUM)[rank]), step
        assert same(cupy.asnumpy(second.wait()), native_expected), step
        wanted = np.repeat(np.arange(size, dtype=np.int32) * 10 + step, 2 + step)
        assert same(cupy.asnumpy(exchanged.wait()), wanted), step
        checked += 3
elif mode == "p2p_ring":
    # The README's ring: irecv from the left, then a blocking send to the right (and the same
    # with isend first). Each irecv in a NCCL group of its own queued every rank's receive
    # before its send: every stream waited for a send queued behind its peer's receive.
    left, right = (rank - 1) % size, (rank + 1) % size
    for step, count in enumerate((4, 0, 4099)):
        inbox = cupy.full(count, -1, np.int64)
        if step % 2 == 0:
            request = comm.irecv(inbox, left)
            comm.send(cupy.full(count, rank * 100 + step, np.int64), right)
        else:
            sent = comm.isend(cupy.full(count, rank * 100 + step, np.int64), right)
            request = comm.irecv(inbox, left)
            sent.wait()
        request.wait()
        comm.synchronize()  # (an irecv's handle orders no stream: docs/gpu.md)
        assert same(cupy.asnumpy(inbox), np.full(count, left * 100 + step, np.int64)), step
        checked += 1
comm.barrier()
if STAND_IN:
    api.close()
    assert not api_problems, api_problems[:5]
if rank == 0:
    print(f"SUMMARY {mode} PASS checked={checked} ranks={size}")
