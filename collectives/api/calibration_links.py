"""Calibration of one link class: time a few all-reduces on a group of ranks, and solve the
class's constants through the cost model's own pricing of those very plans.

The group is every rank that a collective over that class keeps busy at once (all the ranks
of a host for the ``local`` class), so a round's measured latency includes what they cost
one another: on a node with more ranks than cores, a round waits for its peers to be
scheduled, which a pair of ranks alone on the cores never sees. The probes, on ``n`` ranks:

* ``tree``: the tree's all-reduce of ``4 n`` bytes;
* ``one`` and ``eight``: the ring's of ``4 n`` bytes in one sub-chunk and of ``32 n`` in 8
  (the same rounds, 8 times the messages: a round's latency ``alpha`` and a message's
  ``overhead`` apart);
* ``fan``: the shuffle's of ``4 n`` bytes (each rank receives from every other in one round:
  on a crowded host, the wait per peer apart from the wait per round);
* ``big``: the ring's of ``STREAM_BYTES``, every rank sending and receiving in each round;
* ``oneway``: the tree's of ``STREAM_BYTES``, every rank sending or receiving in each round,
  never both (``beta`` from this, and ``two_way`` from what ``big`` costs beyond it: on one
  host both directions are copies through the same memory). Processes only: threads of one
  process share their buffers, and keep ``two_way`` 0.

A bad moment (another job's burst) must not poison the constants: every probe runs in
``ROUNDS`` rounds, interleaved with the others and apart in time, and the median of all
their repeats counts. Two other schedules are timed beside them (``CHECKS``: the recursive
halving-doubling all-reduce of a small and a large buffer); ``check`` prices them with the
solved constants, and a measured time off its price by more than ``CONTRADICTED`` times
flags the probes (calibration probes the class again, keeps the attempt the checks agree
with best, and says so where a user looks: ``collectives probe``, ``comm.explain``). A
busy spell can outlast a calibration, so cached constants are checked again when a later job
reads them (``verify``: the checks on the whole job, against the constants' prices). Only
processes are checked: threads of one process share their buffers, so a schedule there
moves less than its messages say, and the model prices them by their bookkeeping.
``gamma_time`` times a reduction on every rank (``gamma``).

How many rounds, messages and bytes the model charges each probe is read off the model
itself (``coefficients``: each probe priced with one constant at 1 and the others at 0), so
the solved constants make the model predict the probes' measured times. On two ranks this is
tree = c + 2a + 2o, one = c + 2a + 4o, eight = c + 2a + 32o, big = one + S beta + S beta
two_way + S/2 gamma, oneway = tree + 2 S beta + S gamma.

Where a host runs more ranks than cores, ``crowding`` solves what the busy probes cost
beyond the constants of a pair of ranks alone on the cores: a wait per round and one per
peer received from (``Fabric.crowding``, ``Fabric.crowding_message``), by least squares of
the relative errors over the small probes (the shuffle's one round of ``n - 1`` peers against
the ring's ``2 (n - 1)`` rounds of one tell them apart).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..algorithms.cost import Fabric, Link, Placement
from ..algorithms.sampling import predict
from ..algorithms.schedule import Collective
from ..ops import ReduceOp

STREAM_BYTES = 4 << 20
GAMMA_BYTES = 4 << 20  # reduced per rank for gamma
TARGET_SECONDS = 0.01  # a repeat runs about this long
PROBES = ("tree", "one", "eight", "fan", "big", "oneway")
SMALL = PROBES[:4]  # bytes cost next to nothing: alpha, overhead and crowding only
ROUNDS = 3  # each probe's repeats are split over this many rounds, interleaved
CHECKS = {"check.small": ("rechd", 0, 16 << 10), "check.large": ("rechd", 0, 4 << 20)}
CONTRADICTED = 2.0  # a check this many times off (either way) contradicts the probes


def probes(n: int, one_way: bool = True) -> dict[str, tuple[str, int, int]]:
    """The all-reduces timed on ``n`` ranks: name -> (algorithm, sub-chunks, bytes);
    ``one_way``: with ``oneway`` (the tree's rounds each move bytes one way only, on any
    ``n``: no rank sends and receives in one round)."""
    out = {"tree": ("tree", 0, 4 * n), "one": ("ring", 1, 4 * n),
           "eight": ("ring", 8, 32 * n), "fan": ("shuffle", 0, 4 * n),
           "big": ("ring", 1, STREAM_BYTES)}
    if one_way:
        out["oneway"] = ("tree", 0, STREAM_BYTES)
    return out


def samples(comm: Any, fn, repeats: int) -> list[float]:
    """``repeats`` timings of the slowest rank's seconds per call (collective)."""
    fn()  # agreement, plans, buffers
    start = time.perf_counter()
    fn()
    once = comm.all_reduce(np.array([time.perf_counter() - start]), "max")[0]
    iters = int(min(max(TARGET_SECONDS / max(once, 1e-7), 1), 500))
    times = []
    for _ in range(repeats):
        comm.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - start) / iters)
    return [float(t) for t in comm.all_reduce(np.array(times), "max")]


def all_reduce_call(comm: Any, algorithm: str, shards: int, nbytes: int) -> Callable[[], Any]:
    """A float32 all-reduce of ``nbytes`` by ``algorithm`` on ``comm``, its buffers made once."""
    x = np.zeros(max(nbytes // 4, 1), np.float32)
    out = np.empty_like(x)
    return lambda: comm.all_reduce(x, "sum", algorithm, shards=shards, out=out)


def all_reduce_time(comm: Any, algorithm: str, shards: int, nbytes: int, repeats: int) -> float:
    """Seconds per float32 all-reduce of ``nbytes`` by ``algorithm`` on ``comm`` (collective)."""
    return float(statistics.median(samples(comm, all_reduce_call(comm, algorithm, shards,
                                                                  nbytes), repeats)))


def link_times(comm: Any, repeats: int, rounds: int = ROUNDS, checks: bool = True,
               one_way: bool = True) -> dict[str, float]:
    """Every probe's (and ``checks``'; ``oneway`` only with ``one_way``) seconds on ``comm``
    (collective; all its ranks take part): ``rounds`` rounds of each in turn, ``repeats``
    repeats in all (at least 2 a round), the median of them all (every rank of a busy host
    streaming at once is the probe a burst of noise hits hardest; a burst spoils a round, not
    the median)."""
    plan = {**probes(comm.size, one_way), **(CHECKS if checks else {})}
    return interleaved(comm, {name: all_reduce_call(comm, *spec) for name, spec in plan.items()},
                       repeats, rounds)


def interleaved(comm: Any, calls: dict[Any, Callable[[], Any]], repeats: int,
                rounds: int = ROUNDS) -> dict[Any, float]:
    """Each of ``calls`` (key -> a collective call) timed on ``comm`` in ``rounds`` rounds of
    each in turn, ``repeats`` repeats in all (at least 2 a round): the median of them all, by
    key (collective; a bad moment spoils one round of a call, not the call)."""
    each = max(-(-repeats // rounds), 2)
    seen: dict[Any, list[float]] = {key: [] for key in calls}
    for _ in range(rounds):
        for key, fn in calls.items():
            seen[key] += samples(comm, fn, each)
    return {key: float(statistics.median(v)) for key, v in seen.items()}


def gamma_time(comm: Any, dtype: str, repeats: int) -> float:
    """Seconds per byte of a ``dtype`` reduction on every rank at once, the slowest rank's
    median (collective)."""
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


class Charge(NamedTuple):
    """What the model charges a probe per unit of each constant (the call's own cost once)."""

    alpha: float
    overhead: float
    beta: float
    gamma: float
    wait: float = 0.0  # crowding's waits per round, per busy process beyond the cores per core
    wait_message: float = 0.0  # and per peer received from
    two_way: float = 0.0  # per unit of beta * two_way (the bytes moved the other way at once)


def coefficients(n: int, serial: bool = False) -> dict[str, Charge]:
    """Per probe on ``n`` ranks of one host, its price with ``alpha``, ``overhead``, ``beta``,
    ``gamma``, ``crowding`` and ``crowding_message`` each at 1 in turn (the others at 0): how
    many rounds, messages, bytes moved, bytes reduced and peers waited for lie on its
    critical path; and ``beta * two_way`` as a constant of its own (the price at ``beta`` 1
    and ``two_way`` 1 less that at ``two_way`` 0: the bytes moved the other way at once)."""
    still = Link(0.0, 0.0)
    zero = Fabric(still, still, still, gamma=0.0, overhead=0.0, round_overhead=0.0,
                  call_overhead=0.0, serial=serial)
    units = (Fabric(still, Link(1.0, 0.0), still, gamma=0.0, serial=serial),
             Fabric(still, still, still, gamma=0.0, overhead=1.0, serial=serial),
             Fabric(still, Link(0.0, 1.0), still, gamma=0.0, serial=serial),
             Fabric(still, still, still, gamma=1.0, serial=serial),  # (cores 1: n - 1 beyond)
             Fabric(still, still, still, gamma=0.0, serial=serial, cores=1, crowding=1.0),
             Fabric(still, still, still, gamma=0.0, serial=serial, cores=1, crowding_message=1.0),
             Fabric(still, Link(0.0, 1.0, two_way=1.0), still, gamma=0.0, serial=serial))
    placement = Placement(n)
    out = {}
    for name, (algorithm, shards, nbytes) in probes(n).items():
        base, *prices = [predict(Collective.ALL_REDUCE, algorithm, n, nbytes, fabric,
                                 placement, shards=shards).seconds for fabric in (zero, *units)]
        a, o, b, g, w, m, _ = (p - base for p in prices)
        beyond = max(n - 1, 1)
        out[name] = Charge(a, o, b, g, w / beyond, m / beyond, prices[6] - prices[2])
    return out


def solve(times: dict[str, float], call: float, gamma: float, n: int,
          serial: bool = False) -> tuple[Link, float]:
    """The link (``alpha``, ``beta``, ``two_way``) and the per-message ``overhead`` that make
    the model predict the probes' ``times`` on ``n`` ranks, given the call's own cost ``call``
    and ``gamma``: ``overhead`` from each pair of small probes the model tells apart (the
    mean), ``alpha`` from ``one``, ``beta`` and ``two_way`` from ``big`` and ``oneway``
    (``streams``)."""
    k = coefficients(n, serial)
    rest = {name: times[name] - call for name in SMALL}
    estimates = []
    for x, y in (("one", "eight"), ("tree", "one")):
        det = k[x].alpha * k[y].overhead - k[y].alpha * k[x].overhead
        if abs(det) > 1e-9 * max(k[x].alpha * k[y].overhead, 1.0):
            estimates.append((k[x].alpha * rest[y] - k[y].alpha * rest[x]) / det)
    o = max(statistics.fmean(estimates), 0.0) if estimates else 0.0
    a = max((rest["one"] - k["one"].overhead * o) / k["one"].alpha, 1e-7)
    beta, two_way = streams(times, k, a, o, call, gamma, serial=serial)
    return Link(a, beta, two_way), o


def streams(times: dict[str, float], k: dict[str, Charge], alpha: float, overhead: float,
            call: float, gamma: float, waits: tuple[float, float] = (0.0, 0.0),
            serial: bool = False) -> tuple[float, float]:
    """``beta`` and ``two_way`` from the big probes' ``times`` (``coefficients`` ``k``), less
    what the other constants charge them (``waits``: crowding's, per round and per peer,
    already times the processes beyond the cores per core): two equations, ``big`` (every
    round both ways) and ``oneway`` (one way only), in ``beta`` and ``beta * two_way``.
    ``two_way`` is clipped to [0, 1], and ``beta`` is then ``big``'s at that ``two_way`` (the
    schedules that send and receive at once stay priced as measured); ``two_way`` is 0
    without ``oneway`` (threads, ``serial``), where the two equations do not tell the terms
    apart, or where they leave ``beta`` no positive value."""
    def rest(name: str) -> float:
        c = k[name]
        return (times[name] - call - c.alpha * alpha - c.overhead * overhead - c.gamma * gamma -
                c.wait * waits[0] - c.wait_message * waits[1])

    big, one = k["big"], k.get("oneway")
    two_way = 0.0
    if one is not None and "oneway" in times and not serial:
        det = big.beta * one.two_way - one.beta * big.two_way
        if abs(det) > 1e-9 * max(big.beta * one.two_way, one.beta * big.two_way):
            beta = (rest("big") * one.two_way - rest("oneway") * big.two_way) / det
            both = (big.beta * rest("oneway") - one.beta * rest("big")) / det
            two_way = min(max(both / beta, 0.0), 1.0) if beta > 0 else 0.0
    beta = rest("big") / (big.beta + two_way * big.two_way)
    return max(beta, 1e-13), two_way


def crowding(busy: dict[str, float], alone: Link, overhead: float, call: float, n: int,
             extra: float) -> tuple[float, float]:
    """The waits (per round, per peer received from; per busy process beyond the cores, per
    core) that make the model, with the constants of a pair alone (``alone``, ``overhead``),
    predict the small probes timed with all ``n`` ranks of a host busy (``extra``: the
    processes beyond its cores, per core): non-negative least squares of the relative errors
    (a probe ten times longer does not count ten times more)."""
    k = coefficients(n)
    rows = []
    for name in SMALL:
        if name in busy and busy[name] > 0:
            rest = busy[name] - call - k[name].alpha * alone.alpha - k[name].overhead * overhead
            rows.append((k[name].wait * extra / busy[name],
                         k[name].wait_message * extra / busy[name], rest / busy[name]))
    if not rows or extra <= 0:
        return 0.0, 0.0
    a = np.array([r[:2] for r in rows])
    b = np.array([r[2] for r in rows])
    fits = []
    both = np.linalg.lstsq(a, b, rcond=None)[0]
    if (both >= 0).all():
        fits.append((float(both[0]), float(both[1])))
    for col in (0, 1):  # one term alone (the other at 0), where both do not fit
        x = a[:, col]
        w = max(float(x @ b) / float(x @ x), 0.0) if float(x @ x) > 0 else 0.0
        fits.append((w, 0.0) if col == 0 else (0.0, w))
    return min(fits, key=lambda f: float(np.sum((a @ np.array(f) - b) ** 2)))


def check(times: dict[str, float], link: Link, overhead: float, call: float, gamma: float,
          n: int, serial: bool = False) -> list[tuple[str, int, float, float]]:
    """The checks' ``(name, bytes, measured, predicted)`` on ``n`` ranks of one class: what the
    constants solved from the probes (``link``, ``overhead``) predict for the other
    schedules timed beside them, against their measured ``times``."""
    fabric = Fabric(link, link, link, gamma=gamma, overhead=overhead, round_overhead=0.0,
                    call_overhead=call, serial=serial)
    out = []
    for name, (algorithm, shards, nbytes) in CHECKS.items():
        if name in times:
            guess = predict(Collective.ALL_REDUCE, algorithm, n, nbytes, fabric, Placement(n),
                            shards=shards).seconds
            out.append((name, nbytes, times[name], guess))
    return out


def verify(comm: Any, fabric: Fabric, repeats: int = 3) -> list[tuple[str, int, float, float]]:
    """The checks timed now on every rank of ``comm`` (collective), ``(name, bytes, measured,
    predicted)`` with ``fabric`` on ``comm``'s placement: constants measured at a busy moment
    are contradicted here."""
    out = []
    for name, (algorithm, shards, nbytes) in CHECKS.items():
        measured = all_reduce_time(comm, algorithm, shards, nbytes, repeats)
        guess = predict(Collective.ALL_REDUCE, algorithm, comm.size, nbytes, fabric,
                        comm.placement, shards=shards).seconds
        out.append((name, nbytes, measured, guess))
    return out


def disagreement(checks: list) -> float:
    """How far off the worst check is: measured over predicted or its inverse (1: exact)."""
    return max((max(m / p, p / m) for _, _, m, p in checks if m > 0 and p > 0), default=1.0)
