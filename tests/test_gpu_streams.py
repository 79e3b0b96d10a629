"""Stream order of the NCCL backend's asynchronous calls, checked on the NumPy stand-in for
CuPy with a happens-before record (the stand-in runs everything at once, so only the events
recorded and waited on can show a missing wait; on a card a missing wait shows, sometimes, as
wrong bits: tests/gpu/test_gpu_async_streams.py).

Every copy, kernel and NCCL all-reduce is noted on its stream with the bytes it reads and
writes, and a vector clock per stream carries event records and waits across. Checked: an
asynchronous all-reduce (the hot path and the engine's way) runs after the caller's stream at
issue and leaves that stream free; ``wait()`` orders the current stream *at wait()* of the
result's library (CuPy's, or another library's through its array kind: the PyTorch case)
before the result is read there; the call's arrays stay referenced until its event is done;
``wait(timeout=)`` waits on the host. Skipped, saying why, where the stand-in is not the
``cupy`` on the import path (``PYTHONPATH=path/to/stand-in``) or mpi4py is missing.
"""

from __future__ import annotations

import collections
import gc
import importlib.util
import threading
import weakref

import numpy as np
import pytest


def _reason() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return "needs mpi4py (pip install -e '.[mpi]')"
    if importlib.util.find_spec("cupy") is None:
        return ("needs the NumPy stand-in for CuPy first on PYTHONPATH: it records stream "
                "order, which neither a CPU without it nor a GPU can show")
    import cupy

    if not str(getattr(cupy, "__version__", "")).endswith("-fake"):
        return "CuPy is real here: the order record needs the NumPy stand-in for CuPy"
    return None


REASON = _reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


class Order:
    """Vector clocks per stream and the accesses so far; ``violations`` lists the races."""

    def __init__(self):
        self.clocks: dict = collections.defaultdict(lambda: collections.defaultdict(int))
        self.history: list = []  # (lo, hi, "r"/"w", stream, tick, what)
        self.violations: list[str] = []
        self.lock = threading.RLock()

    @staticmethod
    def key(stream) -> int:
        return stream if isinstance(stream, int) else stream.ptr

    def access(self, stream, reads=(), writes=(), what: str = "work") -> tuple:
        """``stream``'s work reading and writing byte ranges; returns its (stream, tick)."""
        key = self.key(stream)
        with self.lock:
            mine = self.clocks[key]
            mine[key] += 1
            for lo, hi, kind in [(a, b, "r") for a, b in reads] + [(a, b, "w") for a, b in writes]:
                for a, b, other, by_stream, tick, by in self.history:
                    if a < hi and lo < b and by_stream != key and mine[by_stream] < tick and (
                            kind == "w" or other == "w"):
                        self.violations.append(f"{what} on {key} ({kind}) is not ordered after "
                                               f"{by} ({other}) on {by_stream}")
            self.history += [(lo, hi, "r", key, mine[key], what) for lo, hi in reads]
            self.history += [(lo, hi, "w", key, mine[key], what) for lo, hi in writes]
            return key, mine[key]

    def after(self, stream, mark: tuple) -> bool:
        """Whether ``stream``'s next work is ordered after the work ``mark`` names."""
        key, tick = mark
        return self.key(stream) == key or self.clocks[self.key(stream)][key] >= tick


def span(a) -> tuple[int, int]:
    return a.data.ptr, a.data.ptr + a.nbytes


@pytest.fixture
def order(monkeypatch):
    """Record the stand-in's device work (NCCL all-reduces included) inside the test."""
    import cupy
    from cupy import cuda
    from cupy.cuda import nccl, runtime

    rec = Order()
    rec.nccl: list = []  # (stream, tick) of each all-reduce
    record, wait = cuda.Event.record, cuda.Stream.wait_event
    all_reduce, launch, memcpy = (nccl.NcclCommunicator.allReduce,
                                  cupy.ElementwiseKernel.__call__, runtime.memcpyAsync)
    sizes = {getattr(nccl, n): np.dtype(n.removeprefix("NCCL_").lower()).itemsize
             for n in ("NCCL_INT8", "NCCL_UINT8", "NCCL_INT32", "NCCL_UINT32", "NCCL_INT64",
                       "NCCL_UINT64", "NCCL_FLOAT16", "NCCL_FLOAT32", "NCCL_FLOAT64")}

    def on_record(event, stream=None):
        record(event, stream)
        key = rec.key(stream if stream is not None else cuda.get_current_stream())
        with rec.lock:
            event.clock = dict(rec.clocks[key])

    def on_wait(stream, event):
        wait(stream, event)
        with rec.lock:
            mine = rec.clocks[rec.key(stream)]
            for other, tick in getattr(event, "clock", {}).items():
                mine[other] = max(mine[other], tick)

    def on_all_reduce(comm, send, receive, count, datatype, op, stream):
        nbytes = count * sizes[datatype]
        rec.nccl.append(rec.access(stream, [(send, send + nbytes)],
                                   [(receive, receive + nbytes)], "ncclAllReduce"))
        all_reduce(comm, send, receive, count, datatype, op, stream)

    def on_launch(kernel, *args, **kw):
        arrays = [a for a in args if isinstance(a, cupy.ndarray)]
        ins, outs = arrays[:kernel.nin], arrays[kernel.nin:]
        rec.access(cuda.get_current_stream(), [span(a) for a in ins or outs],
                   [span(a) for a in outs], kernel.name)
        return launch(kernel, *args, **kw)

    def on_memcpy(dst, src, size, kind, stream):
        rec.access(stream, [(src, src + size)], [(dst, dst + size)], "copy")
        memcpy(dst, src, size, kind, stream)

    monkeypatch.setattr(cuda.Event, "record", on_record)
    monkeypatch.setattr(cuda.Stream, "wait_event", on_wait)
    monkeypatch.setattr(nccl.NcclCommunicator, "allReduce", on_all_reduce)
    monkeypatch.setattr(cupy.ElementwiseKernel, "__call__", on_launch)
    monkeypatch.setattr(runtime, "memcpyAsync", on_memcpy)
    # CuPy's wrapper of another library's stream (the stand-in has none): a stream by handle
    monkeypatch.setattr(cuda, "ExternalStream",
                        lambda ptr, device_id=-1: cuda.Stream(_ptr=ptr), raising=False)
    return rec


@pytest.fixture(scope="module")
def comm():
    from mpi4py import MPI

    import collectives

    communicator = collectives.load_backend("nccl").init(MPI.COMM_SELF, timeout=30)
    yield communicator
    communicator.free()


def _agreed(comm, x, op="sum", **kw):
    """Two blocking calls of ``x``'s signature: agreed, and bound to the hot path."""
    for _ in range(2):
        comm.all_reduce(x, op, "nccl", **kw)


def test_hot_async_all_reduce_runs_beside_the_caller_and_wait_orders_the_current_stream(
        order, comm):
    import cupy

    producer, side = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    x, out = cupy.arange(1024, dtype=cupy.float32), cupy.empty(1024, cupy.float32)
    with producer:
        _agreed(comm, x, out=out)
        order.access(producer, writes=[span(x)], what="the producer of x")
        handle = comm.all_reduce(x, "sum", "nccl", out=out, async_op=True)
        issued = order.nccl[-1]
        assert len(order.nccl) == 3 and issued[0] == comm.transport.stream.ptr
        assert not order.violations, order.violations  # NCCL ran after the producer
        assert not order.after(producer, issued), "the caller's stream waits at issue"
    with side:
        assert handle.wait() is out
        order.access(side, reads=[span(out)], what="a read on the side stream")
    assert not order.violations, order.violations
    assert not order.after(producer, issued)  # wait() ordered the current stream only
    order.access(producer, reads=[span(out)], what="a read on the issuing stream")
    assert len(order.violations) == 1 and "ncclAllReduce" in order.violations[0]
    np.testing.assert_array_equal(cupy.asnumpy(out), np.arange(1024, dtype=np.float32))


def test_a_dropped_handle_stops_counting_while_the_gpu_still_runs_its_call(comm, monkeypatch):
    # (its handle was kept until the GPU had finished: with the GPU behind, 1024 dropped
    # handles refused the next call, though the program held none)
    import cupy
    from cupy import cuda

    x = cupy.arange(4, dtype=cupy.float64)
    comm.all_reduce(x, "mean", "nccl", async_op=True).wait()  # (agreed)
    monkeypatch.setattr(cuda.Event, "done", property(lambda self: False))  # the GPU is behind
    for _ in range(3):
        comm.all_reduce(x, "mean", "nccl", async_op=True)  # (MEAN: never hot) dropped
    gc.collect()
    assert comm.calls.engine.outstanding == 0


def test_an_async_batchs_handle_is_left_to_its_wait(comm, caplog):
    # (a done-callback recorded the batch's event at enqueue through its handle: a batch's
    # handle has no one call's result to keep, and the callback raised, logged at every step)
    import cupy

    xs = [cupy.full(10, 1.0), cupy.full(7, 2.0)]
    with caplog.at_level("WARNING", logger="collectives"):
        for _ in range(2):
            out = comm.batch_all_reduce(xs, async_op=True).wait()
    assert [float(o[0]) for o in out] == [1.0, 2.0]
    assert not [r for r in caplog.records if "done-callback" in r.getMessage()]


@pytest.mark.parametrize("kind", ["blocking", "async", "hot"])
def test_the_watchdog_gives_a_calls_work_its_own_timeout(comm, monkeypatch, kind):
    # (it gave every call's work the communicator's timeout: a call's timeout=5 failed only at
    # 300 s where a peer never came to the work it had enqueued)
    import cupy

    watchdog = comm.transport.watchdog
    given: list = []
    watch = watchdog.watch
    monkeypatch.setattr(watchdog, "watch", lambda *args: (given.append(args[3]), watch(*args)))
    x = cupy.arange(4, dtype=cupy.float64)
    if kind == "hot":
        _agreed(comm, x)
        given.clear()
        comm.all_reduce(x, timeout=7)
    elif kind == "async":
        comm.all_reduce(x, "mean", "nccl", async_op=True, timeout=7).wait()
    else:
        comm.all_reduce(x, "mean", "nccl", timeout=7)
    # (its work's events: within 7 s; an asynchronous handle's own event, recorded after the
    # call's, is kept with the communicator's)
    assert given and given[0] == 7 and (kind == "async" or set(given) == {7}), given
    given.clear()
    comm.all_reduce(x, "mean", "nccl")  # (no timeout=: the communicator's)
    assert given and all(limit == comm.timeout for limit in given), given


def test_the_watchdog_reads_the_timeout_of_the_call_whose_work_it_is_given(comm):
    # (it read the last call's timeout=: an asynchronous call's work enqueued while another
    # call with timeout=3 was made got 3 s, not its own; with peers that happens at progress)
    from types import SimpleNamespace

    engine = comm.calls.engine
    engine.claim_timeout = 3.0  # (the latest call's, entered after)
    engine.advancing = SimpleNamespace(timeout=None)  # (the call whose work goes out now)
    try:
        assert comm.transport.call_limit() == comm.timeout
        engine.advancing = SimpleNamespace(timeout=7.0)
        assert comm.transport.call_limit() == 7.0
    finally:
        engine.advancing = engine.claim_timeout = None
    assert comm.transport.call_limit() == comm.timeout


def test_engine_way_async_call_orders_the_current_stream_at_wait(order, comm):
    import cupy

    producer, side = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    x = cupy.arange(1000, dtype=cupy.float64)
    with producer:
        order.access(producer, writes=[span(x)], what="the producer of x")
        handle = comm.all_reduce(x, "mean", "nccl", async_op=True)  # MEAN: never hot
    with side:
        result = handle.wait()
        order.access(side, reads=[span(result)], what="a read on the side stream")
    assert order.nccl and not order.violations, order.violations
    order.access(producer, reads=[span(result)], what="a read on the issuing stream")
    assert order.violations, "the issuing stream was ordered: the check cannot fail"


def test_blocking_call_still_orders_the_callers_stream_at_return(order, comm):
    import cupy

    producer = cupy.cuda.Stream(non_blocking=True)
    x = cupy.ones(512, cupy.float32)
    with producer:
        _agreed(comm, x)
        order.access(producer, writes=[span(x)], what="the producer of x")
        result = comm.all_reduce(x, "sum", "nccl")
        assert order.after(producer, order.nccl[-1])
        order.access(producer, reads=[span(result)], what="the caller's read")
    assert not order.violations, order.violations


@pytest.mark.parametrize("kind", ["all_gather", "all_reduce mean of int32",
                                  "reduce mean of int32", "reduce_scatter mean of int32"])
def test_a_prepared_calls_start_reads_x_after_the_callers_stream(order, comm, monkeypatch,
                                                                 kind):
    # (the start copied x into its buffers on the communicator's stream before that stream
    # waited for the caller's: a GPU could send the previous step's values)
    import cupy

    copyto = cupy.copyto  # (an integer mean's widening copies x with it)

    def on_copyto(dst, src, casting="same_kind"):
        order.access(cupy.cuda.get_current_stream(), [span(src)], [span(dst)], "copyto")
        return copyto(dst, src, casting=casting)

    monkeypatch.setattr(cupy, "copyto", on_copyto)
    producer = cupy.cuda.Stream(non_blocking=True)
    name, *mean = kind.split()
    x = cupy.arange(16, dtype=cupy.int32 if mean else cupy.float32)
    out = cupy.empty(16, cupy.float64 if mean else cupy.float32)
    prepared = getattr(comm, f"{name}_init")(x, *(["mean"] if mean else []), out=out)
    prepared.start().wait()  # (agreed: the next start goes straight to its run)
    comm.synchronize()  # (the host waited for that run: the record starts anew)
    order.violations.clear()
    order.history.clear()
    with producer:
        order.access(producer, writes=[span(x)], what="the caller writes x")
        prepared.start().wait()
    assert not order.violations, order.violations
    prepared.free()


class Other:
    """A GPU array of another library (what a PyTorch CUDA tensor is to the backend), over a
    stand-in array: a dtype of its own, DLPack on a CUDA device, and that library's own
    current stream (``Other.current``), which its array kind reports."""

    current = 0  # the library's current stream (a raw handle)

    def __init__(self, inner):
        self.inner = inner
        self.shape, self.dtype = inner.shape, f"other.{inner.dtype}"

    def __dlpack__(self, stream=None):
        raise BufferError("adopted through the stand-in's from_dlpack")

    def __dlpack_device__(self):
        return 2, self.inner.device.id


def _cupy():
    import cupy

    return cupy


def _handshake(producer, consumer) -> None:
    """DLPack's stream handshake: ``consumer`` (a stream or raw handle) waits for an event
    recorded on ``producer``."""
    cuda = _cupy().cuda
    producer = producer if not isinstance(producer, int) else cuda.ExternalStream(producer)
    consumer = consumer if not isinstance(consumer, int) else cuda.ExternalStream(consumer)
    if producer.ptr != consumer.ptr:
        event = cuda.Event()
        event.record(producer)
        consumer.wait_event(event)


class OtherKind:
    """``Other``'s array kind, with the device pointers the NCCL hot path reads."""

    @staticmethod
    def detect(x) -> bool:
        return isinstance(x, Other)

    @staticmethod
    def back(result, like):
        """As a DLPack import does (``torch.from_dlpack``): the library's current stream
        waits for CuPy's current one, the producer's."""
        _handshake(_cupy().cuda.get_current_stream(), Other.current)
        return Other(result)

    @staticmethod
    def dtype_of(x):
        return x.inner.dtype

    @staticmethod
    def owns(x) -> bool:
        return isinstance(x, Other)

    def _batches(self, *args, **kw):
        raise NotImplementedError("these tests make no batched calls")

    # (the hot path binds kinds that pack batches, as PyTorch's does: all of packing's names)
    alone_bytes = flat = concatenate = fuse = split = empty = copy = _batches

    @staticmethod
    def device_index(x) -> int:
        return x.inner.device.id

    @staticmethod
    def pointer(x) -> int:
        return x.inner.data.ptr

    @staticmethod
    def by_pointer(x) -> bool:
        return x.inner.flags.c_contiguous

    @staticmethod
    def empty_like(x):
        import cupy

        return Other(cupy.empty(x.shape, x.inner.dtype))

    @staticmethod
    def stream_handle(device: int) -> int:
        return Other.current


@pytest.fixture
def other(monkeypatch, order):
    """``Other`` arrays registered, adopted zero-copy (as ``cupy.from_dlpack`` would)."""
    import cupy

    import collectives.foreign

    collectives.foreign.register_array_kind(OtherKind())
    def from_dlpack(x):
        """``cupy.from_dlpack``: CuPy's current stream waits for the producer's."""
        _handshake(Other.current, cupy.cuda.get_current_stream())
        return x.inner

    monkeypatch.setattr(cupy, "from_dlpack", from_dlpack)
    monkeypatch.setattr(Other, "current", 0)
    return Other


@pytest.mark.parametrize("op", ["sum", "mean"], ids=["hot path", "engine's way"])
def test_wait_orders_the_other_librarys_current_stream_not_cupys(order, comm, other, op):
    """The PyTorch case: issued on the library's default stream, waited on under its side
    stream, read there. Before, ``wait()`` ordered CuPy's current stream only."""
    import cupy

    default, side = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    x = other(cupy.arange(256, dtype=cupy.float32))
    other.current = default.ptr
    _agreed(comm, x, op)
    order.access(default, writes=[span(x.inner)], what="the producer of x")
    count = len(order.nccl)
    hot = comm.calls.hot_paths.get((x.shape, x.dtype, op, "nccl"))
    assert (op == "sum") == (hot is not None and hot.cls is Other)  # (MEAN is never hot)
    handle = comm.all_reduce(x, op, "nccl", async_op=True)
    assert len(order.nccl) == count + 1 and not order.violations, order.violations
    assert not order.after(default, order.nccl[-1]), "the library's stream waits at issue"
    other.current = side.ptr  # as under `with torch.cuda.stream(side):`
    result = handle.wait()
    assert isinstance(result, Other)
    order.access(side, reads=[span(result.inner)], what="a read on the side stream")
    assert not order.violations, order.violations
    expected = np.arange(256, dtype=np.float32)
    np.testing.assert_array_equal(cupy.asnumpy(result.inner), expected)


def test_arrays_stay_alive_until_the_work_is_done_and_timeouts_wait_on_the_host(
        monkeypatch, comm):
    """Events that never finish (the stand-in's are done at once): the call's arrays stay
    referenced after its handle and the caller let go of them; ``wait(timeout=)`` and
    ``synchronize()`` wait on the host and time out."""
    import cupy
    from mpi4py import MPI

    import collectives
    from collectives.errors import CollectiveTimeoutError

    x, out = cupy.ones(64, cupy.float32), cupy.empty(64, cupy.float32)
    _agreed(comm, x, out=out)
    running = [True]
    monkeypatch.setattr(cupy.cuda.Event, "done", property(lambda _: not running[0]))
    handle = comm.all_reduce(x, "sum", "nccl", out=out, async_op=True)
    assert handle.wait() is out and not handle.is_completed()  # (wait() did not block)
    alive = [weakref.ref(x), weakref.ref(out)]
    del x, out, handle
    gc.collect()
    assert all(r() is not None for r in alive), "freed while the GPU may still use them"
    running[0] = False
    comm.transport.watchdog.check()
    gc.collect()
    assert all(r() is None for r in alive), "still held after the work was done"

    fresh = collectives.load_backend("nccl").init(MPI.COMM_SELF, timeout=30)
    try:
        y = cupy.ones(64, cupy.float32)
        running[0] = True
        handle = fresh.all_reduce(y, "mean", "nccl", async_op=True)
        with pytest.raises(CollectiveTimeoutError, match="did not finish"):
            handle.wait(timeout=0.05)
        with pytest.raises(CollectiveTimeoutError):
            fresh.synchronize(0.05)
    finally:
        running[0] = False
        fresh.free()


def test_nccl_init_names_a_communicator_that_is_none():
    # (mpi4py's AttributeError, or its raw error on the null communicator, named nothing; the
    # MPI transport's init said what was wrong)
    from mpi4py import MPI

    import collectives

    nccl = collectives.load_backend("nccl")
    with pytest.raises(TypeError, match="comm=5 must be an mpi4py communicator"):
        nccl.init(5)
    with pytest.raises(ValueError, match="comm is MPI.COMM_NULL"):
        nccl.init(MPI.COMM_NULL)
