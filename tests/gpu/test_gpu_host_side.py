"""What of the GPU backends runs without a GPU, run for real: imports, registry, errors
raised before any GPU work, dtype plans, kernels compiled by NVRTC, and the NCCL backend's
host side (unique id over MPI, nodes, control channel, notices) under mpiexec."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

import numpy as np
import pytest
from gpukit import GPU, MPI_REASON, ROOT, launch, nccl_reason, needs_mpi, passed

import collectives
from collectives.ops import ReduceOp, check_dtype, supported_dtypes

needs_cupy = pytest.mark.skipif(
    importlib.util.find_spec("cupy") is None,
    reason="CuPy is not installed (pip install -e '.[cuda13]', or '.[cuda12]')")
no_gpu_here = pytest.mark.skipif(GPU is None, reason="a GPU is visible: the no-GPU errors "
                                                    "cannot happen here")


def test_backends_import_and_register_without_cuda():
    names = {ep.name for ep in importlib.metadata.entry_points(group="collectives.backends")}
    assert {"cupy", "nccl"} <= names
    assert collectives.load_backend("cupy").__name__ == "collectives.backends.cupy"
    assert collectives.load_backend("nccl").__name__ == "collectives.backends.nccl"
    # the CPU paths do not notice
    assert (collectives.all_reduce([np.ones(3), np.ones(3)])[0] == 2).all()


@needs_cupy
@no_gpu_here
def test_no_gpu_is_a_clear_error():
    from collectives.backends.cupy import GpuUnavailableError, devices

    with pytest.raises(GpuUnavailableError, match="no CUDA GPU is visible.*CUDA_VISIBLE_DEVICES"):
        devices()
    with pytest.raises(GpuUnavailableError, match="no CUDA GPU is visible"):
        collectives.load_backend("nccl").init()


@needs_cupy
def test_numpy_arrays_are_refused_by_name():
    from collectives.backends import cupy as gpu

    with pytest.raises(TypeError, match=r"values\[0\] is a numpy.ndarray.*cannot be mixed"):
        gpu.all_reduce([np.zeros(3), np.zeros(3)])
    with pytest.raises(TypeError, match="one CuPy array per device"):
        gpu.all_reduce(np.zeros(3))


def test_nccl_names_are_read_as_the_backend_needs():
    from collectives.backends.cupy import nccl_request

    assert nccl_request("nccl", 10) == "nccl"
    assert nccl_request(" NCCL/xring ", 10) == "nccl/ring"
    assert nccl_request("nccl/pscpu", 10) == "nccl/shuffle"
    assert nccl_request("auto", 10) == "auto"
    assert nccl_request("ring", 10) is None
    assert nccl_request("tree:1k:nccl", 10) is None  # 10 elements: the "tree" range
    assert nccl_request("tree:1k:nccl", 10_000) == "nccl"


@pytest.mark.skipif(nccl_reason() is not None, reason=nccl_reason() or "")
def test_every_dtype_has_an_exact_nccl_form_or_none():
    import warnings

    from collectives.backends.cupy.nccl_reductions import reduction

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from cupy.cuda import nccl
    for dtype in supported_dtypes():
        for op in ReduceOp:
            try:
                check_dtype(op, dtype)
            except TypeError:
                continue
            plan = reduction(nccl, dtype, op)
            kind = np.dtype(dtype).kind
            if dtype.name == "bfloat16":  # NCCL's bfloat16; no exact MAX/MIN (no int16 keys)
                if op in (ReduceOp.MAX, ReduceOp.MIN):
                    assert plan is None
                else:
                    assert plan.nccl_type == nccl.NCCL_BFLOAT16 and plan.view == dtype
            elif dtype in (np.int16, np.uint16):
                assert plan is None
            elif kind == "c":
                assert (plan is None) == (op is ReduceOp.PROD)
                if plan is not None:
                    assert plan.scale == 2 and plan.view.itemsize * 2 == dtype.itemsize
            elif kind == "b":
                assert plan.view == np.uint8
            elif kind == "f" and op in (ReduceOp.MAX, ReduceOp.MIN):
                assert (plan is None) == (dtype == np.float16)
                assert plan is None or (plan.keys and plan.view.kind == "i")
            else:
                assert plan is not None and plan.view == dtype and not plan.keys


def test_shared_gpus_are_named():
    from collectives.backends.nccl import ranks_per_node, shared_gpu

    ids = ["h/0000:01:00.0", "h/0000:02:00.0", "h/0000:01:00.0"]
    assert shared_gpu(ids, (0, 1, 2)) == (0, 2, "h/0000:01:00.0")
    assert shared_gpu(ids, (0, 1)) is None
    assert ranks_per_node({"COLLECTIVES_RANKS_PER_NODE": "2"}) == 2
    assert ranks_per_node({}) is None
    with pytest.raises(ValueError, match="COLLECTIVES_RANKS_PER_NODE='x'"):
        ranks_per_node({"COLLECTIVES_RANKS_PER_NODE": "x"})


def test_control_tags_pack_the_call():
    from collectives.backends.nccl.control import control_tag, tag_seq

    tags = {control_tag((seq, check, r, pos)) for seq in (1, 2) for check in (0, 1)
            for r in range(3) for pos in (0, 5)}
    assert len(tags) == 24 and max(tags) < 2**29
    assert tag_seq(control_tag((4100, 1, 2, 3))) == 4100 % 4096


@needs_mpi
@pytest.mark.skipif(nccl_reason() is not None, reason=nccl_reason() or "")
@pytest.mark.parametrize("n, per_node", [(1, None), (2, None), (3, None), (3, "1"), (4, "2")])
def test_host_side_under_mpiexec(n, per_node):
    env = {"COLLECTIVES_RANKS_PER_NODE": per_node} if per_node else None
    out = passed(launch("host_side.py", n, env=env), "host_side")
    assert f"ranks={n}" in out


@needs_mpi
def test_nccl_notices_nobody_read_are_drained_at_free():
    # (the NCCL transport freed its MPI communicators at once: a question nobody answered
    # reached the next communicator made, as on the MPI transport)
    passed(launch("notices_drain.py", 2), "notices_drain")


def test_mpi_reason_is_stated():
    assert MPI_REASON is None or "mpi4py" in MPI_REASON


def test_watchdog_reads_the_answers_peers_give():
    """Peers answer with describe_activity's five items (three for one that stayed silent):
    a late call names the ranks not in it yet, else every peer, with what each says."""
    from collectives.backends.nccl.watchdog import late_ranks

    from collectives.runtime.activity import SILENT, describe_activity

    answers = {1: describe_activity((7, "all_reduce(float32[4], op=sum)", "moving", (2,))),
               2: describe_activity((6, "broadcast(int8[3], root=0)", False)),
               3: (None, "did not answer within 0.5 s", SILENT)}
    missing, doing = late_ranks(answers, 7)
    assert missing == [2, 3]
    assert "rank 2: last finished call 6" in doing and "rank 3: did not answer" in doing
    assert "rank 1" not in doing
    missing, doing = late_ranks({1: answers[1]}, 7)
    assert missing == [1] and "waiting for rank(s) 2" in doing


@needs_mpi
def test_watchdog_holds_a_digest_until_its_call_moves_or_agrees_and_later_ones_behind_it():
    """A call waiting for verdicts (``verdict_pending``) sends its digest once it moves or
    agrees on its own; those issued after it wait behind it, so that every rank all-reduces
    the digests in call order (over MPI's one-rank communicator here: what goes out, in
    which order, saying what)."""
    import types

    from collectives.backends.nccl.watchdog import Watchdog
    from mpi4py import MPI

    # (a transport already failed: the watchdog's thread, which would check NCCL, ends at once)
    watchdog = Watchdog(types.SimpleNamespace(rank=0, failed=RuntimeError("nothing to check")))

    def sent():
        return [(seq, buf.tolist()) for seq, buf, _ in watchdog.digests]

    watchdog.digest(1, 11, MPI.COMM_SELF, None)  # (waits for verdicts)
    watchdog.digest(2, 22, MPI.COMM_SELF, False)
    watchdog.digest(3, 33, MPI.COMM_SELF, None)
    assert sent() == []
    watchdog.decided(3, False)  # (a later call decided first: still behind call 1)
    assert sent() == []
    watchdog.decided(1, True)  # ([check, -check, -1 where it agrees])
    assert sent() == [(1, [11, -11, -1]), (2, [22, -22, 0]), (3, [33, -33, 0])]
    watchdog.digest(4, 44, MPI.COMM_SELF, True)  # (nothing held: out at once)
    assert sent()[-1] == (4, [44, -44, -1])
    for _, _, request in watchdog.digests:
        request.Wait()


def test_install_lines_name_the_wheels_of_each_cuda_extra():
    """Every wheel a GPU error tells to install is in the extra of its CUDA line, and each
    line's extra holds CuPy 14 or later of that line."""
    from collectives.backends.cupy import probe

    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["cuda"] == ["collective-schedules[cuda12]"]
    for line in probe.LINES:
        names = {re.split(r"[<>=\[; ]", r, maxsplit=1)[0]: r for r in extras[f"cuda{line}"]}
        assert names[f"cupy-cuda{line}x"].endswith(f">={probe.MIN_CUPY}")
        for wheel in probe.WHEELS[line]:
            assert re.split(r"[<>=]", wheel.strip("'"), maxsplit=1)[0] in names, (line, wheel)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_missing_cupy_says_which_extra_to_install():
    from collectives.backends import cupy as gpu
    from collectives.backends.cupy import probe

    with pytest.raises(ImportError, match=r"need CuPy 14 or later.*pip install -e "
                                          r"'\.\[cuda1[23]\]' from the checkout"):
        gpu.all_reduce([np.zeros(3)])
    assert probe.cuda_line() in probe.LINES
    assert "CuPy 14 or later, which is not installed" in probe.describe()
