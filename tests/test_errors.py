"""Bad input: clear exceptions naming the argument and the fix, raised before any data moves."""

from __future__ import annotations

import gc
import re
import time
import traceback

import numpy as np
import pytest

import collectives
from collectives import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    PeerFailedError,
    ReduceOp,
)
from collectives.ops import identity, supported_dtypes


def four(dtype=np.float32, n=4, size=5):
    return [np.ones(size, dtype) for _ in range(n)]


@pytest.mark.parametrize("spelling, op", [("sum", ReduceOp.SUM), ("SUM", ReduceOp.SUM),
                                          ("Mean", ReduceOp.MEAN), ("avg", ReduceOp.MEAN),
                                          ("max", ReduceOp.MAX), ("min", ReduceOp.MIN),
                                          ("prod", ReduceOp.PROD), (ReduceOp.MAX, ReduceOp.MAX)])
def test_op_spellings(spelling, op):
    assert ReduceOp.parse(spelling) is op


@pytest.mark.parametrize("call, error, message", [
    (lambda: collectives.all_reduce([]), ValueError, "values is empty"),
    (lambda: collectives.all_reduce(np.ones(3)), TypeError, "one array per device"),
    (lambda: collectives.all_reduce([np.ones(3), np.ones(4)]), ValueError, r"values\[1\] has shape"),
    (lambda: collectives.all_reduce([np.ones(3), np.ones(3, np.float32)]), TypeError,
     r"values\[1\] has dtype float32"),
    (lambda: collectives.all_reduce(four(), "median"), ValueError, "op='median' is not a reduction"),
    (lambda: collectives.all_reduce(four(), "sum", "butterfly"), ValueError, "unknown algorithm 'butterfly'"),
    (lambda: collectives.all_reduce(four(), "sum", "ring/tree/ring"), ValueError, "malformed"),
    (lambda: collectives.all_reduce(four(np.complex64), "max"), TypeError, "op='max' is not defined"),
    (lambda: collectives.all_reduce(four(np.bool_), "sum"), TypeError, "accepts max, min"),
    (lambda: collectives.all_reduce([np.array(["a"])] * 2), TypeError, "cannot be reduced"),
    (lambda: collectives.all_reduce(four(), shards=-1), ValueError, "shards=-1"),
    (lambda: collectives.all_reduce(four(), "sum", "pscpu/pscpu", groups=[[0, 1], [1, 2, 3]]),
     ValueError, "exactly one"),
    (lambda: collectives.reduce(four(), "sum", root=4), ValueError, "root=4 is out of range"),
    (lambda: collectives.reduce(four(), "sum", root=1.0), TypeError, "root must be an integer"),
    (lambda: collectives.broadcast(np.ones(3), 0), ValueError, "names no device"),
    (lambda: collectives.broadcast(np.ones(3), 3, "rechd"), ValueError, "has no broadcast"),
    (lambda: collectives.all_gather(four(), axis=1), ValueError, "axis=1 is out of range"),
    (lambda: collectives.all_gather(four(), axis=0.0), TypeError, "axis=0.0 must be an int"),
    (lambda: collectives.all_gather(four(), axis=None), TypeError, "axis=None must be an int"),
    (lambda: collectives.reduce_scatter([np.float32(1)] * 2), ValueError, "scalars"),
    (lambda: collectives.all_reduce(four(), out=[np.empty(5, np.float32)] * 3), ValueError,
     "3 arrays for 4 devices"),
    (lambda: collectives.all_reduce(four(), out=[np.empty(10, np.float32)[::2]] * 4), ValueError,
     "not C-contiguous"),
    (lambda: collectives.all_reduce(four(), out=[np.empty(5, np.float64)] * 4), TypeError,
     r"out\[0\] has dtype float64"),
    (lambda: collectives.all_reduce(four(), out=[np.empty(6, np.float32)] * 4), ValueError,
     r"out\[0\] has shape \(6,\)"),
    (lambda: collectives.reduce(four(), out=np.empty(5, np.float64)), TypeError,  # (one out:
     r"^out has dtype float64"),  # it was named out[0])
    (lambda: collectives.reduce_scatter([np.ones(4)] * 2, out=[np.zeros(2)]), ValueError,
     "1 arrays for 2 devices"),
    (lambda: collectives.reduce_scatter([np.ones(5)] * 2, out=[np.zeros(2)] * 2), ValueError,
     r"out\[1\] has shape \(2,\); the result has shape \(3,\)"),
    (lambda: collectives.batch_all_reduce([four(), four(n=3)]), ValueError,
     "value_lists\\[1\\] has 3 devices"),
    (lambda: collectives.batch_all_reduce([four()], "sum", "pscpu:2k"), ValueError,
     "not well formed|spec"),
    (lambda: collectives.run(lambda c: None, 0), ValueError, "size=0"),
])
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("call, error, message", [
    (lambda c: c.reduce(np.ones(3), "sum", root=0.0), TypeError, "root must be an integer"),
    (lambda c: c.reduce(np.ones(3), "sum", root=True), TypeError, "root must be an integer"),
    (lambda c: c.all_reduce(np.ones(3), "sum", "ring", shards=2.0), ValueError, "shards=2.0"),
    (lambda c: c.all_reduce(np.ones(3), "sum", "ring", shards=True), ValueError, "shards=True"),
    (lambda c: c.all_gather(np.ones(3), axis=0.0), TypeError, "axis=0.0 must be an int"),
])
def test_bad_input_is_refused_after_an_equal_good_call(call, error, message):
    # (the validated calls are cached by their arguments, and 0.0 == 0, True == 1: a cached
    # call of root=0 took root=0.0 without its check)
    def body(comm):
        comm.reduce(np.ones(3), "sum", root=0)
        comm.reduce(np.ones(3), "sum", root=1)
        comm.all_reduce(np.ones(3), "sum", "ring", shards=2)
        comm.all_reduce(np.ones(3), "sum", "ring", shards=1)
        comm.all_gather(np.ones(3), axis=0)
        with pytest.raises(error, match=message):
            call(comm)

    collectives.run(body, 2)


def test_read_only_out():
    out = [np.empty(5, np.float32) for _ in range(4)]
    out[2].flags.writeable = False
    with pytest.raises(ValueError, match=r"out\[2\] is read-only"):
        collectives.all_reduce(four(), out=out)


def test_nothing_moves_before_an_error():
    values = four()
    out = [np.zeros(5, np.float32) for _ in range(3)] + [np.zeros(5, np.float64)]
    with pytest.raises(TypeError):
        collectives.all_reduce(values, out=out)
    assert all((o == 0).all() for o in out)


@pytest.mark.parametrize("dtype", supported_dtypes())
def test_identities(dtype):
    for op in ReduceOp:
        try:
            e = identity(op, dtype)
        except (TypeError, ValueError):
            continue
        x = np.array([3, 0, 1], dtype=dtype) if np.dtype(dtype).kind != "b" else np.array([True, False])
        kernel = {ReduceOp.SUM: np.add, ReduceOp.MEAN: np.add, ReduceOp.PROD: np.multiply,
                  ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}[op]
        try:
            np.testing.assert_array_equal(kernel(x, np.asarray(e, dtype=dtype)), x)
        except TypeError:
            assert np.dtype(dtype).kind in "bc"  # no identity check for ops these dtypes reject


# --- across ranks --------------------------------------------------------------------------

def _run_expect(body, n, error, message, timeout=10.0):
    with pytest.raises(error, match=message):
        collectives.run(body, n, timeout=timeout)


@pytest.mark.parametrize("body, message", [
    (lambda c: c.all_reduce(np.ones(3 + c.rank)), "different shape"),
    (lambda c: c.all_reduce(np.ones(3, np.float32 if c.rank else np.float64)), "different dtype"),
    (lambda c: c.all_reduce(np.ones(3), "sum" if c.rank else "max"), "different op"),
    (lambda c: c.all_reduce(np.ones(3), "sum", "ring" if c.rank else "tree"), "different algorithm"),
    (lambda c: c.reduce(np.ones(3), "sum", root=c.rank % 2), "different root"),
    (lambda c: c.all_reduce(np.ones(3)) if c.rank else c.reduce(np.ones(3)), "different collective"),
    # (it named the all_gather of the split sizes alone, a call the user never made)
    (lambda c: c.all_to_all(np.ones(6), splits=[2, 2, 2]) if c.rank else c.all_to_all(np.ones(6)),
     r"rank 1: all_gather \(the sizes of all_to_all\(splits=\.\.\.\)\), rank 2"),
])
def test_mismatch_raises_everywhere(body, message):
    seen = []

    def wrapped(comm):
        try:
            body(comm)
        except CollectiveMismatchError as exc:
            seen.append(comm.rank)
            raise exc

    _run_expect(wrapped, 3, CollectiveMismatchError, message)
    assert sorted(seen) == [0, 1, 2]  # every rank, not just one


def test_timeout_names_missing_ranks():
    def body(comm):
        if comm.rank in (1, 3):
            time.sleep(1.5)  # never arrive (alive: a rank that returned would have left)
            return None
        comm.all_reduce(np.ones(3), timeout=0.5)

    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=r"all_reduce\(.*timed out after 0.5 s waiting "
                                                     r"for rank\(s\) 1, 3") as info:
        collectives.run(body, 4, timeout=30)
    assert info.value.missing == [1, 3]
    assert time.monotonic() - start < 5


def test_timeout_mid_collective_without_checks():
    # With the agreement off, the wait on a peer's data still times out naming that peer.
    def body(comm):
        if comm.rank == 2:
            time.sleep(1.5)  # alive, elsewhere
            return None
        comm.all_reduce(np.ones(8), "sum", "ring", timeout=0.5)

    with pytest.raises(CollectiveTimeoutError, match="rank\\(s\\) 2"):
        collectives.run(body, 3, timeout=30, check=False)


def test_a_timeout_tells_whom_the_stuck_neighbour_waits_for():
    # Ring: rank 1 waits for rank 0, which waits for the absent rank 3. Rank 1 times out
    # first (the others hear its notice); its error names the absent rank, and says what
    # rank 0 (published by its slow wait) was waiting for.
    errors = {}

    def body(comm):
        if comm.rank == 3:
            time.sleep(2.0)  # alive, elsewhere
            return None
        try:
            comm.all_reduce(np.ones(64), "sum", "ring", timeout=1.0 if comm.rank == 1 else 10.0)
        except CollectiveError as exc:
            errors[comm.rank] = exc
            raise

    with pytest.raises(CollectiveError):
        collectives.run(body, 4, timeout=30, check=False)
    assert isinstance(errors[1], CollectiveTimeoutError) and errors[1].missing == [3], errors
    assert "rank 0: in call 1, all_reduce" in str(errors[1])
    assert "waiting for rank(s) 3" in str(errors[1]).split("rank 0: in call 1", 1)[1]


@pytest.mark.parametrize("waited, activity, held_up_by", [
    ([0], {0: (5, "", "moving", (3,))}, [3]),            # through a neighbour to an unasked rank
    ([0], {0: (5, "", "moving", (1,))}, [0]),            # a cycle back to this rank stops there
    ([0], {0: (4, "", "moving", (3,))}, [0]),            # a peer in another call is not followed
    ([0, 2], {0: (5, "", "moving", (2,)), 2: (5, "", "moving", ())}, [2]),
    ([0], {}, [0]),
])
def test_a_timeout_follows_the_chain_of_waits(waited, activity, held_up_by):
    from collectives.runtime.missing import held_up_by as follow

    assert follow(waited, 5, activity, rank=1) == held_up_by


def test_a_failing_rank_does_not_hang_the_others():
    def body(comm):
        if comm.rank == 0:
            raise RuntimeError("boom")
        comm.all_reduce(np.ones(3))

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="boom"):
        collectives.run(body, 4, timeout=60)
    assert time.monotonic() - start < 5


def test_run_raises_the_failing_ranks_own_error_not_an_echo():
    # A peer that hears of the failure between two calls raises CommunicatorBrokenError at its
    # next one; run() raised that (rank 0's, the lowest) instead of rank 1's own error.
    class Cause(Exception):
        pass

    def body(comm):
        comm.all_reduce(np.ones(3), async_op=True).wait()  # (the progress thread hears)
        if comm.rank == 1:
            raise Cause("on rank 1")
        time.sleep(0.3)
        comm.all_reduce(np.ones(3))

    with pytest.raises(Cause):  # (the echoes are CollectiveErrors, RuntimeErrors)
        collectives.run(body, 3, timeout=5)


def test_peers_are_told_which_rank_failed():
    errors = {}

    def body(comm):
        try:
            if comm.rank == 2:
                raise KeyError("lost")
            comm.barrier()
        except Exception as exc:
            errors[comm.rank] = exc
            raise

    with pytest.raises(KeyError):
        collectives.run(body, 3, timeout=60)
    assert isinstance(errors[0], PeerFailedError) and "rank 2 left after call 0: KeyError" in str(errors[0])


def test_a_receive_refused_for_its_arguments_takes_no_message():
    # out=None raised AttributeError; timeout=10**400 raised OverflowError after the receive
    # was posted, and that receive then took the next message (a later recv got the one after)
    def body(comm):
        if comm.rank == 1:
            comm.send(np.full(2, 1.0), 0, timeout=5)
            comm.send(np.full(2, 2.0), 0, timeout=5)
            return None
        refused = []
        for out, timeout in ((None, 5), ([0.0, 0.0], 5), (3.0, 5), (np.zeros(2), 10 ** 400)):
            try:
                comm.irecv(out, 1) if timeout == 5 else comm.recv(out, 1, timeout=timeout)
            except (TypeError, ValueError) as exc:
                refused.append("out" in str(exc) or "timeout" in str(exc))
        got = [comm.recv(np.zeros(2), 1, timeout=5)[0] for _ in range(2)]
        return refused, got

    assert collectives.run(body, 2, timeout=10)[0] == ([True] * 4, [1.0, 2.0])


@pytest.mark.parametrize("kwargs, error, named", [
    ({"timeout": -1}, ValueError, "timeout=-1"),
    ({"timeout": 0}, ValueError, "timeout=0"),
    ({"timeout": float("nan")}, ValueError, "timeout=nan"),
    ({"timeout": "5"}, TypeError, "timeout='5'"),
    ({"timeout": None}, TypeError, "timeout=None"),
    ({"timeout": True}, TypeError, "timeout=True"),
    ({"timeout": 10 ** 400}, ValueError, "timeout (an integer of 401 digits)"),
    ({"check": "no"}, TypeError, "check='no'"),
])
@pytest.mark.parametrize("make", ["run", "init"])
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_communicators_settings_are_checked(make, kwargs, error, named):
    # These were taken as they came: timeout=-1 and "5" as numbers, check="no" as True; and
    # under collectives.run, a rank that failed to make its communicator printed a traceback
    # in its thread while run() returned None for it.
    calls = []
    with pytest.raises(error, match=named.replace("(", r"\(").replace(")", r"\)")):
        if make == "run":
            collectives.run(calls.append, 2, **kwargs)
        else:
            collectives.load_backend("local").init(**kwargs)
    assert calls == []  # no rank ran


@pytest.mark.parametrize("value, grace", [("off", 0.0), ("No", 0.0), ("0", 0.0), ("on", None),
                                          ("yes", None), ("TRUE", None), ("2.5", 2.5), ("", None)])
def test_the_hang_guards_setting_reads_both_switches_and_a_grace(value, grace, monkeypatch):
    # (on, yes and true were refused while off, no and false were taken)
    from collectives.runtime import hang_guard

    monkeypatch.setenv(hang_guard.ENV, value)
    assert hang_guard.setting() == grace


def test_a_bad_hang_guard_setting_names_the_variable(monkeypatch):
    from collectives.runtime import hang_guard

    monkeypatch.setenv(hang_guard.ENV, "sometimes")
    with pytest.raises(ValueError, match="COLLECTIVES_HANG_GUARD='sometimes'"):
        hang_guard.setting()


@pytest.mark.parametrize("grace", [1e-9, 0.02, 2.0, 600.0])
def test_the_hang_guard_looks_at_most_every_hundredth_of_a_second(grace, monkeypatch):
    # (a grace of 1e-9 made its thread look without pause, holding the GIL from the calls)
    from collectives.runtime import hang_guard

    monkeypatch.setattr(hang_guard, "_fixed", grace)
    assert 0.01 <= hang_guard.period() <= 1.0
    assert hang_guard.period() == min(1.0, max(0.01, grace / 4))


@pytest.mark.parametrize("groups", [[[0, 1], [2, 3.5]], [[0, 1.9], [2, 3]], "0123", ["01", "23"],
                                    "node", [["a", "b"], [2, 3]], [[True, 1], [2, 3]]])
def test_groups_of_anything_but_participant_numbers_are_refused_by_name(groups):
    # (floats were truncated, strings read digit by digit, and "node" raised int()'s
    # "invalid literal", naming no argument)
    with pytest.raises(TypeError, match=r"groups=.* must be a group size or a list of lists"):
        collectives.all_reduce(four(n=4), "sum", "ring/ring", groups=groups)


@pytest.mark.parametrize("value", ["+2", "1_0", "\u0662", "\u00b2", "0", "abc"])
def test_ranks_per_node_is_read_alike_by_both_transports(value):
    # (MPI's int() took "+2", "1_0" and Arabic digits, which NCCL refused; NCCL's own "²"
    # error named no variable)
    pytest.importorskip("mpi4py")
    from collectives.backends.mpi import groups
    from collectives.backends.nccl import bootstrap

    assert bootstrap.ranks_per_node is groups.ranks_per_node  # (one reader, not two alike)
    with pytest.raises(ValueError, match=r"COLLECTIVES_RANKS_PER_NODE=.* must be a positive"):
        groups.groups_from_env(4, {"COLLECTIVES_RANKS_PER_NODE": value})


def test_a_call_slower_than_its_timeout_says_its_peers_were_in_it():
    # (it said they "never arrived in this collective", quoting them as in this very call)
    def body(comm):
        x = np.ones(8 << 20)
        comm.all_reduce(x[:4], "sum", "ring")
        with pytest.raises(collectives.CollectiveTimeoutError) as info:
            comm.all_reduce(x, "sum", "ring", timeout=0.001)
        return str(info.value)

    messages = collectives.run(body, 2, timeout=30)
    assert any("which were in this collective too: it was still running" in m
               for m in messages), messages


def test_an_empty_all_to_all_agreed_before_still_compares_on_every_rank():
    # (zero-size calls agree every time; an all-to-all was left out whole, for the sake of
    # splits=, and an empty one of another shape on one rank returned at once on the other)
    def body(comm):
        comm.all_to_all(np.zeros((0, 3)))
        comm.all_to_all(np.zeros((0,)))
        with pytest.raises(CollectiveMismatchError):
            comm.all_to_all(np.zeros((0, 3)) if comm.rank == 0 else np.zeros((0,)))
        return comm.all_to_all(np.arange(4.0), splits=[1, 3] if comm.rank else [2, 2]).tolist()

    assert collectives.run(body, 2, timeout=10) == [[0.0, 1.0, 0.0], [2.0, 3.0, 1.0, 2.0, 3.0]]


def _bad_ready(comm, xs):
    buckets = comm.buckets(xs, bucket_bytes=0)
    buckets.ready(0, np.ones(4))  # (another shape)


# One bad argument per call kind, to a rank alone (a one-rank communicator)
BAD_ALONE = {
    "plain": lambda comm, xs: comm.all_reduce(xs[0], "median"),
    "async": lambda comm, xs: comm.all_reduce(xs[0], "median", async_op=True).wait(),
    "batch": lambda comm, xs: comm.batch_all_reduce(xs, "median", bucket_bytes=0),
    "batch-async": lambda comm, xs: comm.batch_all_reduce(xs, "median", bucket_bytes=0,
                                                          async_op=True).wait(),
    "buckets-op": lambda comm, xs: comm.buckets(xs, "median", bucket_bytes=0),
    "buckets-list": lambda comm, xs: comm.buckets(None),
    "buckets-ready": _bad_ready,
    "prepared": lambda comm, xs: comm.all_reduce_init(xs[0], "median"),
}


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("kind", BAD_ALONE)
def test_a_rank_alone_raises_its_bad_argument_and_its_next_call_works(kind, check):
    """With no peer to tell, a bad argument is only raised: nothing breaks, with or without
    agreements (check=False broke it, and a list's refusals ran calls no peer makes)."""
    def body(comm):
        xs = [np.ones(3) for _ in range(3)]
        with pytest.raises((TypeError, ValueError)):
            BAD_ALONE[kind](comm, xs)
        return comm.all_reduce(np.ones(2)).tolist()

    assert collectives.run(body, 1, check=check) == [[1.0, 1.0]]


def test_a_bad_argument_after_a_dropped_failed_handle_is_refused_as_any_other(caplog):
    """A dropped handle's error is logged at the next call, which runs as it would: a bad
    argument there raises its own error on its rank, and its peers hear of it."""
    def body(comm):
        x = np.ones(3)
        handle = comm.all_reduce(x, "median" if comm.rank == 1 else "sum", async_op=True)
        if comm.rank == 1:
            with pytest.raises(ValueError, match="median"):
                handle.wait()
            with pytest.raises(PeerFailedError, match="rank 0 .*xs must be a list"):
                comm.batch_all_reduce([x, x], bucket_bytes=0)
        else:
            time.sleep(0.3)  # (its call fails meanwhile, on the progress thread)
            del handle
            gc.collect()
            with pytest.raises(TypeError, match="xs must be a list"):
                comm.batch_all_reduce(None)  # type: ignore[arg-type]
        return comm.all_reduce(x).tolist()

    assert collectives.run(body, 2, timeout=10) == [[2.0] * 3] * 2
    assert any(re.match(r"rank 0: call 1 failed.*rank 1 .*median", r.getMessage())
               for r in caplog.records), caplog.records


def test_a_blocking_calls_error_keeps_the_frames_it_was_raised_through():
    # (errors were stored without their frames for every call, blocking ones too: a bad
    # argument's traceback ended at the engine, without the check that raised it)
    def body(comm):
        try:
            comm.all_reduce(np.ones(3, dtype=object))
        except TypeError as exc:
            return [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
        return []

    for names in collectives.run(body, 1):
        assert "check_dtype" in names, names
