"""Calibration's measurement: the job's constants, timed on the running communicator.

``measure`` (collective; every rank gets rank 0's numbers) times what ``calibration``'s
docstring lists: the call overhead on a communicator of one rank, each link class present on
its group of ranks (``calibration_links`` solves the constants; a class its checks contradict
is probed again), the crowding of a host with more ranks than cores and the wait per round of
a job across hosts (``calibration_crowds``), gamma per dtype, and the transport's own
collectives at a few sizes. ``calibration.apply`` calls it where no cache serves.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..algorithms.cost import Fabric, Link, Placement, human_bytes
from ..algorithms.schedule import Collective
from .calibration_crowds import crowded_pair, job_times, round_wait
from .calibration_links import (
    CONTRADICTED,
    all_reduce_time,
    check,
    coefficients,
    crowding,
    disagreement,
    gamma_time,
    interleaved,
    link_times,
    solve,
    streams,
)

NATIVE_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
OTHER_SIZES = (4 << 10, 1 << 20, 16 << 20)
GAMMA_DTYPES = ("float32", "float64", "float16", "int32")
ATTEMPTS = 2  # a link class whose checks contradict its probes is probed once more


def _groups(comm: Any) -> dict[str, tuple[tuple[int, ...], ...]]:
    """The ranks each link class present is measured on, groups measured at once (the
    first's numbers count): ``local``, every host of more than one rank, each host's ranks
    together (every rank busy, as in a collective: where "hosts" share cores, one host's
    alone would have them to itself); ``net``, the first rank of each of two hosts."""
    placement: Placement = comm.placement
    out = {}
    hosts = placement.hosts.groups if placement.hosts is not None else (tuple(range(comm.size)),)
    local = tuple(tuple(g) for g in hosts if len(g) > 1)
    if local:
        out["local"] = local
    if len(hosts) > 1:
        out["net"] = ((hosts[0][0], hosts[1][0]),)
    return out


def _on(comm: Any, groups, task) -> Any:
    """``task(sub)`` on a communicator of each group's ranks, all at once; the first group's
    answer (None elsewhere); collective."""
    mine = next((i for i, g in enumerate(groups) if comm.rank in g), None)
    sub = comm.split(mine, comm.rank)
    if sub is None:
        return None
    with sub:
        got = task(sub)
    return got if mine == 0 else None


def _natives(comm: Any, sizes, repeats: int, which) -> list:
    """The transport's own collectives' ``(method, collective, size, points)``: every method
    and size timed in interleaved rounds (``calibration_links.interleaved``), the median of
    all repeats (a bad moment spoils one round of a point, not the point)."""
    native = comm.transport.native
    if native is None or comm.size < 2:
        return []
    jobs: dict[tuple[str, str], list] = {}
    plans = [("all_reduce", sizes), ("broadcast", OTHER_SIZES), ("all_gather", OTHER_SIZES),
             ("reduce_scatter", OTHER_SIZES), ("reduce", OTHER_SIZES)]
    for collective, nbytes_list in plans:
        if which is not None and collective not in which:
            continue
        for nbytes in nbytes_list:
            count = max(nbytes // 4 // comm.size, 1) * comm.size
            x = np.ones(count, np.float32)
            jobs.setdefault(("native", collective), []).append(
                (count * 4, _native_call(comm, collective, x)))
    if which is None or "all_reduce" in which:  # the transport's other all-reduces (MPI's shm)
        x = np.ones(comm.size, np.float32)
        for method in native.methods:
            if not native.supports(
                    comm.calls.validated(Collective.ALL_REDUCE, x, "sum", method)):
                continue
            for nbytes in sizes:
                count = max(nbytes // 4 // comm.size, 1) * comm.size
                y, into = np.ones(count, np.float32), np.empty(count, np.float32)
                jobs.setdefault((method, "all_reduce"), []).append((count * 4, (
                    lambda y=y, into=into, m=method: comm.all_reduce(y, "sum", m, out=into))))
    seen = interleaved(comm, {(key, nbytes): fn for key, points in jobs.items()
                              for nbytes, fn in points}, repeats)
    return [(method, collective, comm.size,
             tuple((nbytes, seen[((method, collective), nbytes)]) for nbytes, _ in points))
            for (method, collective), points in jobs.items()]


def _native_call(comm: Any, collective: str, x: np.ndarray):
    n = comm.size
    if collective == "all_reduce":
        out = np.empty_like(x)
        return lambda: comm.all_reduce(x, "sum", "native", out=out)
    if collective == "broadcast":
        return lambda: comm.broadcast(x, 0, "native", out=x if comm.rank else None)
    if collective == "all_gather":
        out = np.empty(x.size * n, x.dtype)
        return lambda: comm.all_gather(x, algorithm="native", out=out)
    if collective == "reduce_scatter":
        out = np.empty(x.size // n, x.dtype)
        return lambda: comm.reduce_scatter(x, "sum", "native", out=out)
    return lambda: comm.reduce(x, "sum", 0, "native")


def measure(comm: Any, *, sizes: Sequence[int] = NATIVE_SIZES, repeats: int = 7,
            natives: bool = True, collectives: Sequence[str] | None = None) -> Fabric:
    """The fabric of this job, measured; collective: every rank calls it, and every rank
    gets rank 0's numbers.

    Parameters
    ----------
    comm
        The communicator to measure on (its calls count; ``collectives.init(calibrate=...)``
        measures on a communicator of its own).
    sizes
        Bytes per rank at which the transport's own collectives are timed.
    repeats
        Timed repeats per measurement; the median counts (a link's probes: over rounds).
    natives
        Whether to time the transport's own collectives (MPI's).
    collectives
        Which of its collectives (default: all five).

    Returns
    -------
    Fabric
        The measured constants over ``comm.fabric``'s, which stay where nothing measured
        them (a link class the job does not have).
    """
    base = comm.fabric
    solo = comm.split(comm.rank, 0)
    with solo:
        call = all_reduce_time(solo, "ring", 1, 8, repeats)
    gammas = tuple((d, gamma_time(comm, d, repeats)) for d in GAMMA_DTYPES)
    gamma = dict(gammas)["float32"]
    groups = _groups(comm)
    attempts: dict[str, list[dict]] = {}
    todo = list(groups)
    for attempt in range(ATTEMPTS):
        for kind in todo:
            got = _on(comm, groups[kind], lambda sub: link_times(
                sub, repeats, checks=comm.placement.processes,
                one_way=comm.placement.processes))
            attempts.setdefault(kind, []).append(_first(comm, got))
        if attempt + 1 < ATTEMPTS:
            todo = comm.broadcast_object([
                kind for kind, tries in attempts.items()
                if _best(tries, call, gamma, len(groups[kind][0]), base.serial)[0]
                > CONTRADICTED] if comm.rank == 0 else None, 0)
        if not todo:
            break
    cores, pair = crowded_pair(comm, groups.get("local", ((),))[0], repeats)
    # a job across hosts: what every rank busy at once costs each round beyond the pair's
    job = job_times(comm, repeats) if "net" in groups and comm.placement.processes else None
    measured = tuple(_natives(comm, sizes, repeats, collectives)) if natives else ()
    fabric = comm.broadcast_object(
        solved_fabric(base, call, gammas, attempts, (cores, pair), measured, comm, groups, job)
        if comm.rank == 0 else None, 0)
    return fabric


def _first(comm: Any, got: Any) -> Any:  # (collective)
    """The first rank's non-None ``got``, on every rank."""
    return next(g for g in comm.all_gather_object(got) if g is not None)


def _best(tries: list[dict], call: float, gamma: float, n: int,
          serial: bool) -> tuple[float, dict, Link, float, list]:
    """Of a class's attempts, the one its checks agree with best: ``(disagreement, times,
    link, overhead, checks)``."""
    out = []
    for times in tries:
        link, o = solve(times, call, gamma, n, serial)
        checks = check(times, link, o, call, gamma, n, serial)
        out.append((disagreement(checks), times, link, o, checks))
    return min(out, key=lambda t: t[0])


def solved_fabric(base: Fabric, call: float, gammas: tuple, attempts: dict, crowd: tuple,
                  measured: tuple, comm: Any, groups: dict, job: dict | None = None) -> Fabric:
    """The constants that make the model predict what was measured (``call``: a call on one
    rank; ``attempts``: per class, ``calibration_links``'s probes on its group, per attempt;
    ``crowd``: the cores, and the small probes on a pair alone or None; ``job``: the job
    probes on every rank of a job across hosts, or None)."""
    gamma = dict(gammas)["float32"]
    links, overheads, raw, checks, flags, chosen = {}, {}, {"call": call}, [], [], {}
    for kind, tries in attempts.items():
        n = len(groups[kind][0])
        worst, times, links[kind], o, got = _best(tries, call, gamma, n, base.serial)
        chosen[kind] = times
        overheads[kind] = o
        raw.update({f"{kind}.{k}": v for k, v in times.items()})
        checks += [(kind, *c) for c in got]
        if worst > CONTRADICTED:
            flags += [f"{kind} link: {name.split('.')[1]} check, rechd at {human_bytes(nbytes)}, "
                      f"measured {m * 1e6:.0f} us where the probes predict {p * 1e6:.0f} us "
                      f"({m / p:.2g}x; probed {len(tries)} times): the probes may have met "
                      "a busy moment; run `collectives probe` again"
                      for name, nbytes, m, p in got if max(m / p, p / m) > CONTRADICTED]
    cores, pair = crowd
    changes: dict = {"round_overhead": 0.0, "call_overhead": call, "gamma": gamma,
                     "gammas": gammas, "measured": measured, "cores": cores,
                     "checks": tuple(checks), "flags": tuple(flags),
                     "source": f"measured {datetime.date.today().isoformat()} "
                               f"({comm.transport.name}, {comm.size} "
                               f"rank{'' if comm.size == 1 else 's'})"}
    if pair is not None and "local" in links:  # the pair's constants, and the crowd's waits
        raw.update({f"pair.{k}": v for k, v in pair.items()})
        busy, n = chosen["local"], len(groups["local"][0])
        alone, o = solve(pair, call, gamma, 2)
        extra = (n - cores) / cores
        changes["crowding"], changes["crowding_message"] = waits = crowding(
            busy, alone, o, call, n, extra)
        beta, two_way = streams(busy, coefficients(n), alone.alpha, o, call, gamma,
                                (extra * waits[0], extra * waits[1]))
        links["local"] = Link(alone.alpha, beta, two_way)
        overheads["local"] = o
    changes["raw"] = tuple(sorted(raw.items()))
    if overheads:
        changes["overhead"] = min(overheads.values())
    probed = []
    if "local" in links:
        probed.append("host" if comm.placement.processes else "proc")
        changes[probed[-1]] = links["local"]
    if "net" in links:
        probed.append("net")
        changes["net"] = links["net"]
    changes["probed"] = tuple(probed)
    fabric = replace(base, **changes)
    if job is not None:
        raw.update(job)
        fabric = replace(fabric, raw=tuple(sorted(raw.items())),
                         round_overhead=round_wait(job, fabric, comm.placement))
    return fabric
