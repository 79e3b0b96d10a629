"""The API people expect: init, spec forms everywhere, ops by other libraries' names, arrays of
other libraries, lists refused, logging, multi-device gather/scatter/all_to_all."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

import collectives
from collectives import ReduceOp
from collectives.api.initialize import launched_by_mpi


def test_init_local_is_one_rank_and_idempotent():
    comm = collectives.init("local")
    assert (comm.rank, comm.size) == (0, 1) and collectives.init("local") is comm
    # other options are not ignored quietly: that communicator waits 300 s, not 5
    with pytest.raises(ValueError, match=r"already made .* with no options; pass the same "):
        collectives.init("local", timeout=5)
    assert collectives.init("local") is comm
    np.testing.assert_array_equal(comm.all_reduce(np.arange(3.0)), np.arange(3.0))
    with comm.dup() as twin:
        assert twin is not comm and twin.size == 1


def test_init_auto_reads_the_launchers_environment():
    assert not launched_by_mpi({})
    assert not launched_by_mpi({"PMI_SIZE": "1"})
    assert not launched_by_mpi({"SLURM_NTASKS": "4"})  # a batch system alone is not a launcher
    assert launched_by_mpi({"PMI_SIZE": "4", "PMI_RANK": "0"})
    assert launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "2"})
    assert launched_by_mpi({"PMIX_SIZE": "3"})


def test_init_rejects_unknown_backends_with_a_suggestion():
    with pytest.raises(ValueError, match="did you mean 'local'"):
        collectives.init("locl")
    with pytest.raises(TypeError, match="backend must be a name"):
        collectives.init(3)
    # (the multi-device backend has no communicator: an AttributeError named no fix)
    with pytest.raises(ValueError, match=r"backend='cupy' makes no communicator.*init\('nccl'\)"):
        collectives.init("cupy")


def test_backends_are_reachable_after_import_collectives_alone():
    code = ("import collectives; m = collectives.backends.local; "
            "print(m.__name__, 'mpi4py' in __import__('sys').modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["collectives.backends.local", "False"]


@pytest.mark.parametrize("spec, same_as", [
    (("xring", 2), ("ring", 2)),
    ("xring#2", ("ring", 2)),
    ([("pscpu", 1, 10), ("xring", 2, -1)], ("ring", 2)),  # 1000 elements: the second range
    ("pscpu:10:xring#2", ("ring", 2)),
    ("pscpu:2k:xring", ("shuffle", 1)),  # a spec's shards as given: one gather participant
])
def test_every_spec_form_selects_like_the_explicit_call(spec, same_as):
    values = [np.random.default_rng(d).standard_normal(1000).astype(np.float32) for d in range(4)]
    want = collectives.all_reduce(values, "sum", same_as[0], shards=same_as[1])
    got = collectives.all_reduce(values, "sum", spec)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))  # same algorithm: same bits

    def body(comm):
        return comm.all_reduce(values[comm.rank], "sum", spec), comm.last_algorithm

    for result, ran in collectives.run(body, 4):
        assert ran == same_as[0] and np.array_equal(result, want[0])


def test_ops_from_other_libraries():
    assert ReduceOp.parse("avg") is ReduceOp.MEAN and ReduceOp.parse("product") is ReduceOp.PROD
    mpi = pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed")
    assert ReduceOp.parse(mpi.SUM) is ReduceOp.SUM and ReduceOp.parse(mpi.MAX) is ReduceOp.MAX
    with pytest.raises(ValueError, match="bitwise"):
        ReduceOp.parse(mpi.BAND)
    with pytest.raises(ValueError, match="bitwise"):
        ReduceOp.parse("bxor")


def test_a_list_where_one_array_is_expected_is_refused():
    arrays = [np.ones(3), np.ones(3)]
    with pytest.raises(TypeError, match="list of arrays"):
        collectives.run(lambda comm: comm.all_reduce(arrays), 2)
    # a plain list of numbers is one array, as in NumPy
    got = collectives.run(lambda comm: comm.all_reduce([1.0, 2.0]), 2)
    np.testing.assert_array_equal(got[0], [2.0, 4.0])


def test_native_on_devices_says_where_it_exists():
    # (it said "unknown algorithm 'native'", whose list of known ones left it out)
    with pytest.raises(ValueError, match="names a transport's own collective.*it has none"):
        collectives.all_reduce([np.ones(2)] * 2, algorithm="native")

    def on_threads(comm):
        with pytest.raises(ValueError, match="'shm' names a transport's own collective"):
            comm.all_reduce(np.ones(2), algorithm="shm")
        return comm.all_reduce(np.ones(2), algorithm="ring").tolist()  # (and nothing broke)

    assert collectives.run(on_threads, 2) == [[2.0, 2.0]] * 2


class DLPackOnly:
    """A real DLPack producer that is nothing else (no __array__, no shape): what another
    library's CPU array looks like to the library."""

    def __init__(self, array: np.ndarray):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_any_dlpack_array_is_accepted_without_a_copy():
    base = np.arange(6.0)
    got = collectives.run(lambda comm: comm.all_reduce(DLPackOnly(base)), 3)
    np.testing.assert_array_equal(got[0], base * 3)
    np.testing.assert_array_equal(base, np.arange(6.0))  # the input is untouched
    values = [DLPackOnly(np.full(4, float(d))) for d in range(3)]
    np.testing.assert_array_equal(collectives.all_reduce(values)[0], np.full(4, 3.0))


def test_torch_tensors_come_back_as_torch_tensors():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    values = [torch.full((4,), float(d)) for d in range(3)]
    out = collectives.all_reduce(values, "mean")
    assert isinstance(out[0], torch.Tensor) and torch.equal(out[0], torch.full((4,), 1.0))

    def body(comm):
        x = torch.arange(4.0) + comm.rank
        filled = torch.empty(4)
        comm.all_reduce(x, out=filled)
        return comm.all_gather(x), filled

    for gathered, filled in collectives.run(body, 2):
        assert isinstance(gathered, torch.Tensor) and gathered.tolist() == [0, 1, 2, 3, 1, 2, 3, 4]
        assert filled.tolist() == [1.0, 3.0, 5.0, 7.0]


def test_multi_device_gather_scatter_all_to_all():
    values = [np.arange(6) + 10 * d for d in range(3)]
    np.testing.assert_array_equal(collectives.gather(values, root=1), np.stack(values))
    scalars = [np.array(1.5 * d) for d in range(3)]  # 0-d: one element per device
    np.testing.assert_array_equal(collectives.gather(scalars), [0.0, 1.5, 3.0])
    rows = collectives.scatter(np.arange(6).reshape(3, 2), 3)
    assert [r.tolist() for r in rows] == [[0, 1], [2, 3], [4, 5]]
    swapped = collectives.all_to_all(values)
    np.testing.assert_array_equal(swapped[2], [4, 5, 14, 15, 24, 25])
    with pytest.raises(ValueError, match="equal blocks"):
        collectives.all_to_all([np.arange(5)] * 3)
    with pytest.raises(ValueError, match="leading axis of 3 rows"):
        collectives.scatter(np.arange(4), 3)


def test_spmd_all_to_all_errors_reach_every_rank():
    def body(comm):
        splits = [1, 1] if comm.rank else [5, 5]  # rank 0's do not sum to its 2 rows
        return comm.all_to_all(np.arange(2), splits=splits)

    with pytest.raises(ValueError, match="summing to x's leading axis"):
        collectives.run(body, 2)


def test_logging_says_what_a_new_call_runs_as(caplog):
    with caplog.at_level(logging.INFO, logger="collectives"):
        collectives.run(lambda comm: comm.all_reduce(np.ones(3), algorithm="tree"), 2)
    assert any("runs as tree" in r.getMessage() for r in caplog.records)
    assert not logging.getLogger("collectives").handlers  # none attached without the variable


def test_debug_variable_checks_every_call(tmp_path):
    code = ("import numpy as np, collectives;"
            "print(collectives.run(lambda c: [c.all_reduce(np.ones(2)) for _ in range(3)][-1]"
            "[0].tolist(), 2))")
    env = {"COLLECTIVES_DEBUG": "detail", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("collectives.calls DEBUG") == 6  # 3 calls, 2 ranks, each logged
    bad = subprocess.run([sys.executable, "-c", "import collectives; collectives.init('local')"],
                         capture_output=True, text=True, env={"COLLECTIVES_DEBUG": "loud"})
    assert "COLLECTIVES_DEBUG='loud'" in bad.stderr


@pytest.mark.parametrize("call", ["all_reduce(values, algorithm='ring')",
                                  "batch_all_reduce([values], algorithm='ring')",
                                  "broadcast(values[0], 2, algorithm='tree')"])
def test_debug_variable_holds_for_the_multi_device_api(call):
    # (it was read only where a communicator was made: calls across devices alone neither
    # logged under info nor refused a bad value)
    code = f"import numpy as np, collectives; values = [np.ones(3)] * 2; collectives.{call}"
    run = lambda value: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code], capture_output=True, text=True,
        env={"COLLECTIVES_DEBUG": value, "PATH": ""}, timeout=120)
    info = run("info")
    assert info.returncode == 0 and "collectives.plans INFO: plan:" in info.stderr, info.stderr
    bad = run("loud")
    assert bad.returncode == 1 and "COLLECTIVES_DEBUG='loud'" in bad.stderr, bad.stderr


def test_debug_variable_agrees_on_calls_check_false_skips():
    # (check=False skipped the agreement before the variable was looked at: ranks that
    # disagreed about the op returned the sum on both, silently, where the documentation
    # promises every call agreed whatever check= says)
    code = ("import numpy as np, collectives\n"
            "def body(c):\n"
            "    c.all_reduce(np.ones(4))\n"
            "    return c.all_reduce(np.ones(4) * (c.rank + 2), 'max' if c.rank else 'sum')\n"
            "try:\n"
            "    collectives.run(body, 2, check=False)\n"
            "except collectives.CollectiveMismatchError as exc:\n"
            "    print('mismatch:', exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"COLLECTIVES_DEBUG": "detail", "PATH": ""}, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "mismatch:" in out.stdout and "different op" in out.stdout, out.stdout


def test_an_integer_means_errors_name_the_dtype_passed_and_explain_prices_float64():
    # (the float64 copy an integer MEAN travels as was named instead: "different dtype (rank
    # 0: 'float64', rank 1: 'float32')" for an int32 beside a float32, and explain priced
    # the int8 bytes where float64 ones travel)
    def body(comm):
        x = np.ones(4, np.int32) if comm.rank == 0 else np.ones(4, np.float32)
        with pytest.raises(collectives.CollectiveMismatchError) as raised:
            comm.all_reduce(x, "mean")
        small = np.ones(30000, np.int8)
        chosen = comm.explain("all_reduce", small, "mean").name
        comm.all_reduce(small, "mean")
        return str(raised.value), chosen, comm.last_algorithm

    for message, chosen, ran in collectives.run(body, 3):
        assert "'int32'" in message and "'float64'" not in message, message
        assert chosen == ran, (chosen, ran)
