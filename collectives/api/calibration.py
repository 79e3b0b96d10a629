"""Calibration on the job: measure the cost model's constants, cache them per host set.

``measure`` times, on the running communicator (collective over it):

* the **call overhead**: an all-reduce on a communicator of one rank (nothing moves);
* per link class present, on the ranks it is measured on (``local``: every rank of a host,
  every host at once, all busy as in a collective, so what they cost one another counts;
  ``net``: a rank of each of two hosts), through the library's own schedules: the tree's
  and the ring's all-reduces of a few bytes and the ring's and (processes) the tree's of
  4 MiB, from which ``calibration_links`` solves the class's ``alpha``, ``beta``, ``two_way``
  and per-message ``overhead`` so that the model predicts those very times; in rounds, with
  other schedules timed beside them as checks (a class the checks contradict is probed
  again, the attempt they agree with best counts, and one still contradicted is flagged in
  ``Fabric.flags``);
* **crowding**, where a host runs more ranks than cores: the probes again on two of its
  ranks while the others sleep; the pair's constants are the host link's, and what the small
  probes cost more with every rank busy, per process beyond the cores, is solved as a wait
  per round (``Fabric.crowding``) and per peer received from (``Fabric.crowding_message``);
* a job **across hosts**: small all-reduces on every rank at once, and the wait per round
  beyond the classes' prices (``Fabric.round_overhead``: hosts sharing a machine's cores,
  or a switch; ``calibration_crowds``);
* **gamma** per dtype: a timed reduction of 4 MiB on every rank at once;
* the transport's **own collectives** (MPI's), at a few sizes: the model interpolates them.

Every rank ends with rank 0's numbers, so every rank makes the same choices. ``apply``
reads the cache (a JSON file per host set in the user's cache folder; checked against a
few schedules timed now) or measures, and sets ``comm.fabric``;
``collectives.init(calibrate=...)`` and ``collectives probe`` call it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..algorithms.cost import Fabric, Link, Placement, human_bytes
from ..algorithms.schedule import Collective
from ..hints import Calibrate
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
    verify,
)

ENV = "COLLECTIVES_CALIBRATE"
CACHE_ENV = "COLLECTIVES_CACHE_DIR"
NATIVE_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
OTHER_SIZES = (4 << 10, 1 << 20, 16 << 20)
GAMMA_DTYPES = ("float32", "float64", "float16", "int32")
METHOD = 6  # 1: the local link on a pair of ranks alone; 2: on every rank of a host; 3: and
# in rounds, with checks, and the crowding of a host with more ranks than cores; 4: crowding
# per round and per peer received from, over the pair's constants (the shuffle's probe); 5:
# a link's two_way, from the tree's one-way stream beside the ring's; 6: a job across hosts'
# wait per round, from small all-reduces on every rank
ATTEMPTS = 2  # a link class whose checks contradict its probes is probed once more


def cache_dir() -> Path:
    """``$COLLECTIVES_CACHE_DIR``, else ``$XDG_CACHE_HOME/collectives``, else
    ``~/.cache/collectives``."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "collectives"


def host_set(comm: Any) -> dict:
    """What the numbers belong to: the transport, and every rank's host (collective); and
    how they were measured (``METHOD``: caches of an older method are not read)."""
    hosts = comm.all_gather_object(socket.gethostname())
    return {"transport": comm.transport.name, "size": comm.size, "hosts": hosts,
            "processes": comm.placement.processes, "method": METHOD}


def cache_file(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"fabric-{digest}.json"


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
        _fabric(base, call, gammas, attempts, (cores, pair), measured, comm, groups, job)
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


def _fabric(base: Fabric, call: float, gammas: tuple, attempts: dict, crowd: tuple,
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
                               f"({comm.transport.name}, {comm.size} ranks)"}
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
    if "local" in links:
        changes["host" if comm.placement.processes else "proc"] = links["local"]
    if "net" in links:
        changes["net"] = links["net"]
    fabric = replace(base, **changes)
    if job is not None:
        raw.update(job)
        fabric = replace(fabric, raw=tuple(sorted(raw.items())),
                         round_overhead=round_wait(job, fabric, comm.placement))
    return fabric


def apply(comm: Any, mode: Calibrate | str = True, **options: Any) -> Fabric:
    """Set ``comm.fabric`` from the cache of this host set or from a measurement;
    collective: every rank calls it.

    Parameters
    ----------
    comm
        The communicator whose ``fabric`` is set.
    mode
        True (the cache, unless a few schedules timed now contradict it, else measure and
        save), ``"cached"`` (the cache, else leave the constants as they are) or ``"fresh"``
        (measure and save); False, None or ``"0"`` do nothing.
    **options
        For `measure` (``repeats=``, ``natives=``, ...).

    Returns
    -------
    Fabric
        The constants now in ``comm.fabric``.

    Raises
    ------
    ValueError
        ``mode`` is none of the above.
    """
    mode = str(mode).strip().lower()
    if mode in ("", "0", "false", "off", "none"):
        return comm.fabric
    if mode not in ("1", "true", "on", "cached", "fresh"):
        raise ValueError(f"calibrate={mode!r}: use True, 'cached' or 'fresh' (or {ENV}=1, "
                         "cached, fresh)")
    key = host_set(comm)
    path = cache_file(key)
    text = None
    if comm.rank == 0 and mode != "fresh" and path.exists():
        try:
            text = json.loads(path.read_text())["fabric"]
        except (OSError, ValueError, KeyError):
            text = None
    text = comm.broadcast_object(text, 0)
    if text is not None:  # unless the schedules now contradict it (a busy spell then)
        cached = Fabric.from_json(text)
        checked = mode != "cached" and comm.placement.processes
        worst = disagreement(verify(comm, cached)) if checked else 1.0
        if worst <= CONTRADICTED:
            comm.fabric = cached
            return cached
        if comm.rank == 0:
            warnings.warn(f"calibration: the schedules now take {worst:.2g}x (or 1/x) the "
                          "cached constants' prices; measuring again", RuntimeWarning, stacklevel=2)
    if mode == "cached":
        return comm.fabric
    fabric = measure(comm, **options)
    if comm.rank == 0:
        save(path, key, fabric)
        for flag in fabric.flags:
            warnings.warn(f"calibration: {flag}", RuntimeWarning, stacklevel=2)
    comm.fabric = fabric
    return fabric


def save(path: Path, key: dict, fabric: Fabric) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"key": key, "fabric": fabric.to_json()}, indent=1))
    temporary.replace(path)
