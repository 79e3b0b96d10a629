"""Bad arguments a fuzzer of the public API found slipping through: each is refused with an
error naming the argument, on every rank where the call has peers (they raise
``PeerFailedError`` at once, and the next call works), never an internal error, a quiet
reading of a wrong value, or a hang."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

import collectives
from collectives import PeerFailedError


def _one_rank_bad(call, good_call=None):
    """Rank 0 makes ``call(comm)``, rank 1 ``good_call`` (by default the same call, good):
    each rank's outcome (the error's type and text, or "returned") and the next all-reduce."""
    def body(comm):
        try:
            (call if comm.rank == 0 else (good_call or call))(comm, comm.rank == 0)
            outcome = "returned", ""
        except Exception as exc:  # noqa: BLE001 - judged below
            outcome = type(exc).__name__, str(exc)
        return outcome, comm.all_reduce(np.ones(2), timeout=5).tolist()

    return collectives.run(body, 2, timeout=10)


def _refused_on_every_rank(results, error: str, words: str) -> None:
    ((kind0, said0), next0), ((kind1, said1), next1) = results
    assert kind0 == error and words in said0, (kind0, said0)
    assert kind1 == "PeerFailedError" and ("rank 0" in said1 or "rank(s) [0]" in said1), (
        kind1, said1)
    assert next0 == next1 == [2.0, 2.0]


def test_a_root_that_is_an_array_on_one_rank_is_refused_by_broadcast_object():
    # (``rank == root`` ran first: an array's truth raised there alone, out of step)
    results = _one_rank_bad(lambda comm, bad: comm.broadcast_object(
        "hi", root=np.array([0, 1]) if bad else 0))
    _refused_on_every_rank(results, "TypeError", "root")


@pytest.mark.parametrize("bad", ["no", np.array([True, False]), []], ids=["str", "array", "list"])
@pytest.mark.parametrize("kind", ["all_reduce", "batch_all_reduce", "broadcast"])
def test_async_op_must_be_a_flag(kind, bad):
    # ("no" read as True, an array's truth raised on one rank alone, a list was unhashable)
    def call(comm, is_bad):
        flag = bad if is_bad else False
        x = np.ones(3)
        if kind == "batch_all_reduce":
            return comm.batch_all_reduce([x], async_op=flag)
        return getattr(comm, kind)(x, async_op=flag)

    _refused_on_every_rank(_one_rank_bad(call), "TypeError", "async_op")


def test_the_multi_device_flags_and_accumulation_fn_are_checked():
    values = [np.ones(3)] * 2
    for kwargs, words in (({"async_op": "no"}, "async_op"), ({"shared_result": "x"}, "shared_result"),
                          ({"accumulation_fn": "x"}, "accumulation_fn")):
        with pytest.raises(TypeError, match=words):
            collectives.all_reduce(values, **kwargs)
    handle = collectives.all_reduce(values, async_op=True)
    with pytest.raises(TypeError, match="callback"):
        handle.add_done_callback(None)


def test_the_multi_device_functions_take_their_first_argument_by_its_name():
    # (the wrappers took it as ``values``: ``value_lists=`` and ``value=``, as the signatures
    # and type hints show them, raised "missing 1 required positional argument")
    v = [np.ones(3, np.float32)] * 2
    assert len(collectives.batch_all_reduce(value_lists=[v, v])) == 2
    assert collectives.all_reduce(values=v)[0].tolist() == [2.0] * 3
    assert collectives.scatter(value=np.ones((2, 3)), devices=2)[1].tolist() == [1.0] * 3
    assert collectives.broadcast(value=np.ones(3), devices=2)[1].tolist() == [1.0] * 3
    with pytest.raises(TypeError, match="missing its first argument: 'values'"):
        collectives.all_reduce()


def test_a_count_of_devices_past_one_process_is_refused():
    # (2**70 devices: the cost model's plans were made for each, until memory ran out)
    with pytest.raises(ValueError, match="more devices than one process holds"):
        collectives.broadcast(np.ones(3), 2 ** 70)
    for command in (["bench", "-n", str(2 ** 70)], ["probe", "-n", str(2 ** 70)]):
        run = subprocess.run([sys.executable, "-m", "collectives.tools.cli", *command],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "must be at most 131,072" in run.stderr, run.stderr


@pytest.mark.parametrize("splits", [[6.5, 6.5], ["6", "6"], [True, True], 6, np.int64(-1)],
                         ids=["floats", "strings", "bools", "int", "numpy-int"])
def test_all_to_all_splits_must_be_a_list_of_whole_numbers(splits):
    # (6.5 was cast to 6 quietly; a scalar raised "'int' object is not iterable")
    results = _one_rank_bad(lambda comm, bad: comm.all_to_all(
        np.arange(12.0), splits=splits if bad else [6, 6]))
    _refused_on_every_rank(results, "TypeError", "splits")


def test_reduce_scatter_init_refuses_a_scalar_as_the_call_does():
    # (its rows were read first: an IndexError. Making a prepared call is a step every rank
    # takes: the peer hears of the refusal there, and the next call works)
    def body(comm):
        x = np.float32(1) if comm.rank == 0 else np.ones(2, np.float32)
        try:
            comm.reduce_scatter_init(x, out=np.empty(1, np.float32))
            outcome = "returned"
        except (ValueError, PeerFailedError) as exc:
            outcome = str(exc)
        return outcome, comm.all_reduce(np.ones(2), timeout=5).tolist()

    (said0, next0), (said1, next1) = collectives.run(body, 2, timeout=10)
    assert said0.startswith("x is a scalar; reduce_scatter splits axis 0"), said0
    assert "rank 0 failed to start it: ValueError: x is a scalar" in said1, said1
    assert next0 == next1 == [2.0, 2.0]


def test_making_a_prepared_call_refuses_any_error_of_one_rank_on_every_rank():
    # (only a TypeError, ValueError or IndexError reached the peers: a MemoryError on one
    # rank left them waiting out their timeout in the step they all take)
    def body(comm):
        if comm.rank == 1:
            def no_memory(*args, **kwargs):
                raise MemoryError("no memory for the call")
            comm.calls.validated = no_memory  # (this rank's runner alone)
        start = time.monotonic()
        try:
            comm.all_reduce_init(np.ones(4), out=np.empty(4))
            outcome = "returned"
        except (MemoryError, PeerFailedError) as exc:
            outcome = type(exc).__name__
        took = time.monotonic() - start
        vars(comm.calls).pop("validated", None)  # (memory again)
        return outcome, took, comm.all_reduce(np.ones(2)).tolist()

    (said0, took0, next0), (said1, _, next1) = collectives.run(body, 2, timeout=10)
    assert (said0, said1) == ("PeerFailedError", "MemoryError") and took0 < 5
    assert next0 == next1 == [2.0, 2.0]


@pytest.mark.parametrize("collective", [None, 0, "barrier", "allreduce"])
def test_explain_names_the_collectives_it_knows(collective):
    def body(comm):
        with pytest.raises(ValueError, match="collective=.*'all_reduce'"):
            comm.explain(collective, np.ones(3))
        with pytest.raises(ValueError, match="x is a scalar"):
            comm.explain("reduce_scatter", np.float32(1))

    collectives.run(body, 1, timeout=10)


@pytest.mark.parametrize("shape, error", [(2 ** 70, "ValueError"), ((2 ** 40, 2 ** 40), "ValueError"),
                                          (2 ** 45, "MemoryError")],
                         ids=["past-an-index", "two-dims", "no-memory"])
def test_shared_empty_of_an_impossible_shape_on_one_rank_is_refused_on_every_rank(shape, error):
    # (thread ranks made the array after the agreement: it raised there alone, the peer
    # returned)
    results = _one_rank_bad(lambda comm, bad: comm.shared_empty(shape if bad else 3))
    _refused_on_every_rank(results, error, "shape")


def test_the_process_group_names_a_non_tensor():
    torch = pytest.importorskip("torch")
    from collectives.adapters.torch_group import process_group

    def body(comm):
        group = process_group(comm)  # (its calls fail through their Work, as gloo's do)
        with pytest.raises(TypeError, match="not a torch.Tensor"):
            group.allreduce([None]).wait()
        return torch.ones(1).tolist()

    assert collectives.run(body, 1, timeout=10) == [[1.0]]



def test_run_names_a_bad_function_or_arguments():
    # (every rank raised "'int' object is not callable", or "Value after * must be an iterable")
    with pytest.raises(TypeError, match=r"fn=5 must be a function of the communicator"):
        collectives.run(5, 2)
    with pytest.raises(TypeError, match=r"args=5 must be a tuple"):
        collectives.run(lambda comm, a: a, 2, args=5)


def test_every_call_that_takes_a_function_checks_it_at_once():
    # (multi-device reduce called accumulation_fn=5 deep inside; another library's handle
    # wrapped its callback, so the inner handle's check passed anything)
    values = [np.ones(3), np.ones(3)]
    with pytest.raises(TypeError, match="accumulation_fn=5 must be a function"):
        collectives.reduce(values, "sum", 0, accumulation_fn=5)
    torch = pytest.importorskip("torch")

    def body(comm):
        handle = comm.all_reduce(torch.ones(3), async_op=True)
        with pytest.raises(TypeError, match="callback=5 must be a function of the handle"):
            handle.add_done_callback(5)
        return handle.wait().tolist()

    assert collectives.run(body, 2) == [[2.0] * 3] * 2
