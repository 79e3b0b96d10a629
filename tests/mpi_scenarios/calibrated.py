"""Calibration under MPI: ``init(calibrate=...)``'s measurement gives every rank rank 0's
numbers, times MPI's own all-reduce, and ``auto`` then weighs it against the schedules (the
same choice on every rank, the right answer either way); the cache of the host set is read
back without measuring again; the model's predictions for the schedules at a small size are
within a coarse factor of their measured times.

Run with ``COLLECTIVES_CACHE_DIR`` set to a fresh folder.
"""

from __future__ import annotations

import os

import numpy as np
from _common import WORLD, Report, meet
from collectives.backends import mpi

from collectives.algorithms.sampling import predict
from collectives.algorithms.schedule import Collective
from collectives.api import calibration
from collectives.api.calibration_links import all_reduce_time

report = Report("calibrated")
n, rank = WORLD.size, WORLD.rank


def predicted_against_measured(comm, nbytes: int) -> None:
    """The calibrated model prices the schedules as they run on this job, every rank busy
    (on an oversubscribed node too, where a pair of ranks alone on the cores is several times
    faster): over the four, the geometric mean of predicted / measured is within 2x."""
    ratios = {}
    for name in ("tree", "rechd", "ring", "shuffle"):
        predicted = predict(Collective.ALL_REDUCE, name, n, nbytes, comm.fabric,
                            comm.placement).seconds
        ratios[name] = predicted / all_reduce_time(comm, name, 0, nbytes, 3)
    mean = float(np.exp(np.mean(np.log(list(ratios.values())))))
    report.check(1 / 2 <= mean <= 2, f"predicted / measured at {nbytes} B: {ratios}")


def main() -> None:
    comm = mpi.init(timeout=120)
    fabric = calibration.apply(comm, "fresh", sizes=(4 << 10, 256 << 10), repeats=2,
                               collectives=("all_reduce",))
    everyone = WORLD.allgather(fabric.to_json())
    report.check(len(set(everyone)) == 1, "ranks hold different measured constants")
    report.check(comm.fabric == fabric, "comm.fabric is not the measured fabric")
    report.check(fabric.host.beta > 0 and fabric.call_overhead > 0, f"odd numbers: {fabric}")
    timed = fabric.timings("native", Collective.ALL_REDUCE, n)
    report.check(timed is not None and len(timed) == 2, f"MPI's all-reduce not timed: {timed}")
    for nbytes in (4 << 10, 256 << 10):
        x = np.full(nbytes // 8, rank + 1.0)
        decision = comm.explain("all_reduce", x)
        names = {p.algorithm for p in decision.predictions}
        report.check("native" in names and "ring" in names, f"candidates: {names}")
        got = comm.all_reduce(x)
        report.check(np.array_equal(got, np.full_like(x, n * (n + 1) / 2)), "wrong all-reduce")
        ran = WORLD.allgather(comm.last_algorithm or "native")
        report.check(len(set(ran)) == 1 and ran[0] == decision.name,
                     f"ranks ran {ran}, the model said {decision.name}")
    predicted_against_measured(comm, 4 << 10)
    meet()
    again = mpi.init(timeout=120)
    cached = calibration.apply(again, "cached")
    report.check(cached == fabric, "the cache did not give back the measured constants")
    files = os.listdir(calibration.cache_dir()) if rank == 0 else ["x"]
    report.check(len(files) == 1, f"cache files: {files}")
    again.free()
    import collectives

    user = collectives.init("mpi", calibrate="cached")  # measured on its own communicator
    report.check(user.fabric == fabric, "init(calibrate='cached') did not read the cache")
    x = np.ones(4)
    report.check(np.array_equal(user.all_reduce(x), x * n), "wrong all-reduce after init")
    comm.free()
    report.finish()


if __name__ == "__main__":
    main()
