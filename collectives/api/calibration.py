"""Calibration on the job: measure the cost model's constants, cache them per host set.

``measure`` (``calibration_measure``) times, on the running communicator (collective over it):

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

import hashlib
import json
import os
import socket
import warnings
from pathlib import Path
from typing import Any

from ..algorithms.cost import Fabric
from ..hints import Calibrate
from .calibration_links import CONTRADICTED, disagreement, verify
from .calibration_measure import measure

ENV = "COLLECTIVES_CALIBRATE"
CACHE_ENV = "COLLECTIVES_CACHE_DIR"
METHOD = 6  # 1: the local link on a pair of ranks alone; 2: on every rank of a host; 3: and
# in rounds, with checks, and the crowding of a host with more ranks than cores; 4: crowding
# per round and per peer received from, over the pair's constants (the shuffle's probe); 5:
# a link's two_way, from the tree's one-way stream beside the ring's; 6: a job across hosts'
# wait per round, from small all-reduces on every rank


OFF = ("", "0", "false", "off", "none")
ON = ("1", "true", "on", "cached", "fresh")


def mode_of(mode: Any) -> str:
    """``mode`` (True, ``"cached"``, ``"fresh"``, an environment variable's text) as
    ``apply`` takes it: ``""`` for off, else ``"1"``, ``"cached"`` or ``"fresh"``; a
    ValueError naming the choices for anything else."""
    text = str(mode).strip().lower()
    if text in OFF:
        return ""
    if text not in ON:
        raise ValueError(f"calibrate={mode!r}: use True, 'cached' or 'fresh' (or {ENV}=1, "
                         "cached, fresh)")
    return "1" if text in ("1", "true", "on") else text


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
    mode = mode_of(mode)
    if not mode:
        return comm.fabric
    key = host_set(comm)
    path = cache_file(key)
    cached = None
    if comm.rank == 0 and mode != "fresh" and path.exists():
        cached = read_cache(path)
    cached = comm.broadcast_object(cached, 0)
    if cached is not None:  # unless the schedules now contradict it (a busy spell then)
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


def read_cache(path: Path) -> Fabric | None:
    """The fabric cached in ``path``; None, with a warning naming the file, where it cannot
    be read (a corrupt file is measured again, and overwritten, rather than break ``auto``)."""
    try:
        return Fabric.from_json(json.loads(path.read_text())["fabric"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"calibration: the cache {path} cannot be read ({exc}); it is not "
                      "used", RuntimeWarning, stacklevel=3)
        return None


def save(path: Path, key: dict, fabric: Fabric) -> None:
    """Keep ``fabric`` in the cache; where the cache cannot be written, say so (the
    measurement is used all the same, and made again next time)."""
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps({"key": key, "fabric": fabric.to_json()}, indent=1))
        temporary.replace(path)
    except OSError as exc:
        warnings.warn(f"calibration: the measurement could not be cached in {path.parent} "
                      f"({exc.strerror or exc}); set {CACHE_ENV} to a folder this process "
                      "can write", RuntimeWarning, stacklevel=3)
