"""Calibration on the job: measure the cost model's constants, cache them per host set.

``measure`` times, on the running communicator (collective over it):

* the **call overhead**: an all-reduce on a communicator of one rank (nothing moves);
* per link class present, on a communicator of just the ranks it is measured on (``local``:
  every rank of a host, every host at once, all busy as in a collective, so a round's
  latency includes what they cost one another, e.g. on a node with more ranks than cores;
  ``net``: a rank of each of two hosts), through the library's own schedules (so Python's share is in the
  numbers): the tree's and the ring's all-reduces of a few bytes and the ring's of 4 MiB,
  from which ``calibration_links`` solves the class's ``alpha`` and ``beta`` and the
  per-message ``overhead`` so that the model predicts those very times;
* **gamma** per dtype: a timed reduction of 4 MiB on every rank at once;
* the transport's **own collectives** (MPI's), at a few sizes: the model interpolates them.

Every rank ends with rank 0's numbers, so every rank makes the same choices. ``apply``
reads the cache (a JSON file per host set in the user's cache folder) or measures, and sets
``comm.fabric``; ``collectives.init(calibrate=...)`` and ``collectives probe`` call it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..algorithms.cost import Fabric, Placement
from ..algorithms.schedule import Collective
from ..hints import Calibrate
from ..ops import ReduceOp
from .calibration_links import PROBES, all_reduce_time, link_times, solve, timed

ENV = "COLLECTIVES_CALIBRATE"
CACHE_ENV = "COLLECTIVES_CACHE_DIR"
NATIVE_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
OTHER_SIZES = (4 << 10, 1 << 20, 16 << 20)
GAMMA_BYTES = 4 << 20
GAMMA_DTYPES = ("float32", "float64", "float16", "int32")
METHOD = 2  # 1: the local link measured on a pair of ranks alone; 2: on every rank of a host


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


def _gamma(comm: Any, dtype: str, repeats: int) -> float:
    count = GAMMA_BYTES // np.dtype(dtype).itemsize
    dst, src = np.ones(count, dtype), np.ones(count, dtype)
    arrays = comm.arrays
    zero = np.zeros(1, dtype)

    def reduce() -> None:
        arrays.combine(ReduceOp.SUM, dst, [src])
        dst[:1] = zero  # keep the values small

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        reduce()
        times.append(time.perf_counter() - start)
    worst = comm.all_reduce(np.array([statistics.median(times)]), "max")[0]
    return float(worst) / (count * np.dtype(dtype).itemsize)


def _natives(comm: Any, sizes, repeats: int, which) -> list:
    native = comm.transport.native
    if native is None or comm.size < 2:
        return []
    out = []
    plans = [("all_reduce", sizes), ("broadcast", OTHER_SIZES), ("all_gather", OTHER_SIZES),
             ("reduce_scatter", OTHER_SIZES), ("reduce", OTHER_SIZES)]
    for collective, nbytes_list in plans:
        if which is not None and collective not in which:
            continue
        points = []
        for nbytes in nbytes_list:
            count = max(nbytes // 4 // comm.size, 1) * comm.size
            x = np.ones(count, np.float32)
            fn = _native_call(comm, collective, x)
            points.append((count * 4, timed(comm, fn, repeats)))
        out.append(("native", collective, comm.size, tuple(points)))
    if which is None or "all_reduce" in which:  # the transport's other all-reduces (MPI's shm)
        x = np.ones(comm.size, np.float32)
        for method in native.methods:
            if not native.supports(
                    comm._call(Collective.ALL_REDUCE, x, "sum", method)):
                continue
            points = []
            for nbytes in sizes:
                count = max(nbytes // 4 // comm.size, 1) * comm.size
                y, into = np.ones(count, np.float32), np.empty(count, np.float32)
                points.append((count * 4, timed(
                    comm, lambda y=y, into=into, m=method: comm.all_reduce(y, "sum", m, out=into),
                    repeats)))
            out.append((method, "all_reduce", comm.size, tuple(points)))
    return out


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
        Timed repeats per measurement; the best counts.
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
    found: dict[str, float] = {}
    solo = comm.split(comm.rank, 0)
    with solo:
        found["call"] = all_reduce_time(solo, "ring", 1, 8, repeats)
    groups = _groups(comm)
    for kind, measured_on in groups.items():
        got = _on(comm, measured_on, lambda sub: link_times(sub, repeats))
        if got is not None:
            found.update({f"{kind}.{k}": v for k, v in got.items()})
    gammas = tuple((d, _gamma(comm, d, repeats)) for d in GAMMA_DTYPES)
    measured = tuple(_natives(comm, sizes, repeats, collectives)) if natives else ()
    everything = comm.all_gather_object(found)
    for part in everything:
        for key, value in part.items():
            found.setdefault(key, value)
    fabric = comm.broadcast_object(_fabric(base, found, gammas, measured, comm, groups)
                                   if comm.rank == 0 else None, 0)
    return fabric


def _fabric(base: Fabric, found: dict, gammas: tuple, measured: tuple, comm: Any,
            groups: dict) -> Fabric:
    """The constants that make the model predict what ``found`` measured (``call``: a call
    on one rank; ``KIND.PROBE``: ``calibration_links``'s probes on the class's group)."""
    call = found["call"]
    gamma = dict(gammas)["float32"]
    links, overheads = {}, []
    for kind in ("local", "net"):
        if f"{kind}.one" not in found:
            continue
        times = {k: found[f"{kind}.{k}"] for k in PROBES}
        links[kind], o = solve(times, call, gamma, len(groups[kind][0]), base.serial)
        overheads.append(o)
    changes: dict = {"round_overhead": 0.0, "call_overhead": call, "gamma": gamma,
                     "gammas": gammas, "measured": measured, "raw": tuple(sorted(found.items())),
                     "source": f"measured {datetime.date.today().isoformat()} "
                               f"({comm.transport.name}, {comm.size} ranks)"}
    if overheads:
        changes["overhead"] = min(overheads)
    if "local" in links:
        changes["host" if comm.placement.processes else "proc"] = links["local"]
    if "net" in links:
        changes["net"] = links["net"]
    return replace(base, **changes)


def apply(comm: Any, mode: Calibrate | str = True, **options: Any) -> Fabric:
    """Set ``comm.fabric`` from the cache of this host set or from a measurement;
    collective: every rank calls it.

    Parameters
    ----------
    comm
        The communicator whose ``fabric`` is set.
    mode
        True (the cache, else measure and save), ``"cached"`` (the cache, else leave the
        constants as they are) or ``"fresh"`` (measure and save); False, None or ``"0"``
        do nothing.
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
    if text is not None:
        comm.fabric = Fabric.from_json(text)
        return comm.fabric
    if mode == "cached":
        return comm.fabric
    fabric = measure(comm, **options)
    if comm.rank == 0:
        save(path, key, fabric)
    comm.fabric = fabric
    return fabric


def save(path: Path, key: dict, fabric: Fabric) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"key": key, "fabric": fabric.to_json()}, indent=1))
    temporary.replace(path)
