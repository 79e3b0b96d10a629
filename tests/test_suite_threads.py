"""The SPMD suite (tests/suite) over thread ranks; tests/test_mpi.py runs it over MPI."""

from __future__ import annotations

import pytest
from suite import bodies, kept_bodies
from suite.runner import judge

import collectives


def run_body(body, n, **kwargs):
    reports = collectives.run(lambda comm: body(comm, **kwargs), n, timeout=60)
    problems = judge(reports)
    assert not problems, "\n".join(problems[:30])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 13, 16])
@pytest.mark.slow
def test_all_reduce_matrix(n):
    run_body(bodies.all_reduce_matrix, n, full=n in (1, 3, 4))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_other_collectives(n):
    run_body(bodies.other_collectives, n)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_async_and_prepared(n):
    run_body(bodies.async_and_prepared, n)


def test_many_small_calls():
    run_body(bodies.many_small_calls, 2, calls=2000)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_point_to_point_and_objects(n):
    run_body(bodies.point_to_point_and_objects, n)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_sub_communicators(n):
    run_body(bodies.sub_communicators, n)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_batch_fusion(n):
    run_body(bodies.batch_fusion, n)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_buckets_overlap(n):
    run_body(bodies.buckets_overlap, n)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_kept_buckets(n):
    run_body(kept_bodies.kept_buckets, n)
