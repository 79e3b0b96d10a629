"""What ranks busy at once cost one another, measured for calibration: a crowded host, and
the rounds of a whole job across hosts.

* **A crowded host** (more ranks than cores): ``crowded_pair`` times the link's small probes
  on two of the host's ranks while the others sleep; ``calibration`` solves the pair's
  constants as the host link's, and what every rank busy costs beyond them as waits
  (``Fabric.crowding``, ``Fabric.crowding_message``: ``calibration_links.crowding``).
* **A job across hosts**: the ``net`` class is probed on a rank of each of two hosts, which
  sees what the link costs but not what the whole job's ranks cost one another while they
  all run. Where hosts share a machine's cores (network namespaces, virtual machines on one
  box) or a switch, every round of the job waits longer than the pair's. ``job_times``
  times a few small all-reduces on every rank of the job, and ``round_wait`` solves the
  per-round wait (``Fabric.round_overhead``) that makes the model, with the classes'
  constants, predict them: 0 where the pair's constants already do (hosts of their own).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace
from typing import Any

import numpy as np

from ..algorithms.cost import Fabric, Placement
from ..algorithms.sampling import predict
from ..algorithms.schedule import Collective
from .calibration_links import all_reduce_call, interleaved, link_times


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        return os.cpu_count() or 1


def crowded_pair(comm: Any, host: tuple[int, ...], repeats: int) -> tuple[int, dict | None]:
    """The fewest cores a rank may run on, and, where ``host`` (the first host's ranks) runs
    more processes than that, the small probes' times on two of its ranks while every other
    rank sleeps (collective; every rank gets them)."""
    fewest = min(comm.all_gather_object(cores()))
    if not comm.placement.processes or len(host) <= fewest:
        return fewest, None
    sub = comm.split(0 if comm.rank in host[:2] else None, comm.rank)
    got = None
    if sub is not None:
        with sub:  # (its alpha and overhead count, not its streams: no one-way probe)
            got = link_times(sub, repeats, one_way=False)
        comm.all_reduce(np.zeros(1))
    else:  # asleep, not polling: the pair has the cores to itself
        work = comm.all_reduce(np.zeros(1), async_op=True)
        while not work.is_completed():
            time.sleep(0.002)
        work.wait()
    return fewest, next(g for g in comm.all_gather_object(got) if g is not None)


def job_probes(n: int) -> dict[str, tuple[str, int, int]]:
    """The small all-reduces timed on every rank of a job of ``n``: name -> (algorithm,
    sub-chunks, bytes); rounds of one message each (ring, tree) and of many (shuffle)."""
    return {"job.ring": ("ring", 1, 4 * n), "job.tree": ("tree", 0, 4 * n),
            "job.shuffle": ("shuffle", 0, 4 * n)}


def job_times(comm: Any, repeats: int) -> dict[str, float]:
    """Each job probe's median seconds on every rank of ``comm`` at once, in interleaved
    rounds (collective)."""
    return interleaved(comm, {name: all_reduce_call(comm, *spec)
                              for name, spec in job_probes(comm.size).items()}, repeats)


def round_wait(times: dict[str, float], fabric: Fabric, placement: Placement) -> float:
    """The wait per round (``Fabric.round_overhead``) that makes ``fabric`` predict the job
    probes' ``times`` on ``placement``: the median over the probes of what each took beyond
    its price, per round on its critical path; never below 0."""
    n = placement.size
    still = replace(fabric, round_overhead=0.0)
    unit = replace(fabric, round_overhead=1.0)
    waits = []
    for name, (algorithm, shards, nbytes) in job_probes(n).items():
        if name not in times:
            continue
        price = predict(Collective.ALL_REDUCE, algorithm, n, nbytes, still, placement,
                        shards=shards).seconds
        rounds = predict(Collective.ALL_REDUCE, algorithm, n, nbytes, unit, placement,
                         shards=shards).seconds - price
        if rounds > 0:
            waits.append((times[name] - price) / rounds)
    return max(float(statistics.median(waits)), 0.0) if waits else 0.0
