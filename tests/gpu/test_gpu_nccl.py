"""The NCCL backend under mpiexec on a real GPU: a one-rank communicator for every
collective, op and dtype; the two-level path with one rank per simulated node, two processes
sharing one GPU; several GPUs where there are several. Skipped, with the reason, where CuPy,
NCCL, a GPU or MPI is missing (the host side runs for real in test_gpu_host_side.py)."""

from __future__ import annotations

import pytest
from gpukit import gpu_count, launch, nccl_reason, needs_gpu, needs_mpi, passed, torch_reason

pytestmark = [*needs_gpu, needs_mpi,
              pytest.mark.skipif(nccl_reason() is not None, reason=nccl_reason() or "")]


def test_one_rank_every_collective_op_and_dtype():
    out = passed(launch("nccl_ranks.py", 1, "one_rank", timeout=540), "one_rank")
    assert "checked=" in out


def test_hot_path_of_a_repeated_all_reduce():
    out = passed(launch("nccl_ranks.py", 1, "hot", timeout=300), "hot")
    assert "ranks=1" in out


@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs; this machine shows fewer")
def test_hot_path_over_several_gpus():
    passed(launch("nccl_ranks.py", gpu_count(), "hot", timeout=300), "hot")


def test_two_level_with_one_rank_per_simulated_node_on_one_gpu():
    out = passed(launch("nccl_ranks.py", 2, "two_level", timeout=540,
                        env={"COLLECTIVES_RANKS_PER_NODE": "1"}), "two_level")
    assert "ranks=2" in out


def test_a_call_refused_at_its_agreement_leaves_the_communicator_usable():
    out = passed(launch("nccl_ranks.py", 2, "refused", timeout=300,
                        env={"COLLECTIVES_RANKS_PER_NODE": "1"}), "refused")
    assert "checked=4" in out


def test_async_two_level_loop_with_one_rank_per_node():
    """Several asynchronous two-level calls in flight: each keeps its turn until its last
    chunk is back, so every rank issues MPI's and NCCL's collectives in the same order."""
    out = passed(launch("nccl_ranks.py", 2, "two_level_async", timeout=300,
                        env={"COLLECTIVES_RANKS_PER_NODE": "1"}), "two_level_async")
    assert "ranks=2" in out


@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs; this machine shows fewer")
def test_async_two_level_loop_with_two_gpus_per_node():
    out = passed(launch("nccl_ranks.py", 4, "two_level_async", timeout=300,
                        env={"COLLECTIVES_RANKS_PER_NODE": "2"}), "two_level_async")
    assert "ranks=4" in out


@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs; this machine shows fewer")
def test_world_over_several_gpus():
    passed(launch("nccl_ranks.py", gpu_count(), "one_rank", timeout=540), "one_rank")


@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs; this machine shows fewer")
def test_schedules_over_send_recv_in_flight_with_nccl_collectives():
    """A schedule over NCCL send/recv and NCCL's own all-reduce, both asynchronous, with one
    rank late: both take their turn in call order, so every stream sees them in one order."""
    out = passed(launch("nccl_ranks.py", 2, "mixed_async", timeout=180), "mixed_async")
    assert "ranks=2" in out


@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs; this machine shows fewer")
def test_users_messages_around_a_ring_with_each_receive_posted_first():
    out = passed(launch("nccl_ranks.py", gpu_count(), "p2p_ring", timeout=180), "p2p_ring")
    assert "checked=3" in out


TORCH = torch_reason()


@pytest.mark.skipif(TORCH is not None, reason=TORCH or "")
def test_torch_tensors_take_the_hot_path_and_come_back_as_tensors():
    out = passed(launch("nccl_torch.py", 1, "hot", timeout=300), "hot")
    assert "ranks=1" in out


@pytest.mark.skipif(TORCH is not None, reason=TORCH or "")
def test_docs_torch_training_step_all_reduces_buckets_during_backward():
    out = passed(launch("nccl_torch.py", 1, "buckets", timeout=300), "buckets")
    assert "checked=3" in out
