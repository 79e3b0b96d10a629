"""The SPMD bound of ``benchmarks/ceiling.py`` and the shared-memory all-reduce in rounds.

The bound's kernel is checked against what it stands for (its output, the bytes it claims
to move); its multi-process timing runs once, small. The all-reduce runs under ``mpiexec``
(``tests/mpi_scenarios/shm_rounds.py``: many rounds and blocks, bit for bit against the
rank-order sum in float32, several calls in flight, a mismatch).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import ceiling  # noqa: E402


@pytest.mark.parametrize("p", [2, 3, 4])
def test_spmd_share_does_one_ranks_share(p):
    nbytes = 4 * (1000 * p + 3)  # slices of unequal length
    share = ceiling.SpmdShare(p, nbytes, block_bytes=64)
    share.peers = [np.full_like(peer, q + 2.0) for q, peer in enumerate(share.peers)]
    share()
    lo, hi = share.cuts[0]
    want_own = 1.0 + sum(q + 2.0 for q in range(p - 1))  # its input, then each peer's slice
    assert np.array_equal(share.out[lo:hi], np.full(hi - lo, want_own, np.float32))
    assert np.array_equal(share.out[hi:], np.ones(len(share.out) - hi, np.float32))
    n = nbytes // 4
    mine, others = (hi - lo) * 4, (n - (hi - lo)) * 4
    assert share.moved == (p + 1) * mine + 2 * others  # p slices read, 1 written, gather
    assert ceiling.SpmdShare(p, nbytes, copy_in=True).moved == share.moved + 2 * others
    pushed = ceiling.SpmdShare(p, nbytes, block_bytes=64, push=True)
    pushed.peers = [np.full_like(peer, q + 2.0) for q, peer in enumerate(pushed.peers)]
    pushed()
    for output in (pushed.out[lo:hi], *pushed.pushed):  # its slice, in every rank's output
        assert np.array_equal(output, np.full(hi - lo, want_own, np.float32))
    assert pushed.moved == 2 * p * mine < share.moved  # nothing reduced is read back


def test_spmd_row_times_every_rank_at_once():
    row = ceiling.spmd_row(2, 64 << 10, repeats=2)
    assert row["participants"] == 2 and row["size"] == 64 << 10
    assert 0 < row["spmd_us"] < 1e6 and 0 < row["spmd_copy_in_us"] < 1e6
    assert row["spmd_copy_in_moved"] > row["spmd_moved"] > 64 << 10


def test_auto_runs_shm_where_measured_faster():
    from collectives.backends.mpi import tuning

    from collectives.algorithms.schedule import Collective

    big, small = 64 << 20, 4 << 10
    assert tuning.use_shm("auto", Collective.ALL_REDUCE, 1 << 20, True, 3)
    assert tuning.use_shm("auto", Collective.ALL_REDUCE, big, True, 8)  # (the last entry)
    assert not tuning.use_shm("auto", Collective.ALL_REDUCE, small, True, 3)
    assert not tuning.use_shm("auto", Collective.ALL_REDUCE, big, True, 2)  # the schedules
    assert not tuning.use_shm("auto", Collective.ALL_REDUCE, big, False, 4)  # across hosts
    assert not tuning.use_shm("auto", Collective.ALL_REDUCE, big, True)  # rank count unknown
    assert not tuning.use_shm("auto", Collective.BROADCAST, big, True, 4)
    assert not tuning.prefer_native(Collective.ALL_REDUCE, 3, big)  # (MPI's own: not shm)


MPIEXEC = Path(sys.executable).parent / "mpiexec"
HAVE_MPI = MPIEXEC.exists() or shutil.which("mpiexec") is not None


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and an mpiexec")
@pytest.mark.parametrize("n", [2, 3])
def test_shm_rounds_bitwise(n):
    mpiexec = str(MPIEXEC) if MPIEXEC.exists() else shutil.which("mpiexec")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("COLLECTIVES_RANKS_PER_NODE", None)
    proc = subprocess.run([mpiexec, "-n", str(n), sys.executable,
                           str(ROOT / "tests" / "mpi_scenarios" / "shm_rounds.py")],
                          capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "SUMMARY shm_rounds PASS" in out, out[-4000:]
