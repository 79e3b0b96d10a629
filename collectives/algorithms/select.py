"""``algorithm="auto"``: the candidate with the least predicted time, and why it won.

Every candidate (each algorithm with the collective, the ring with sub-chunks, two-level
compositions over the hosts, or over groups of a single host's participants, and a
transport's own collective where it is measured) is priced by the cost model
(``collectives.algorithms.cost``, ``collectives.algorithms.sampling``) with the
transport's ``collectives.algorithms.cost.Fabric`` and
``collectives.algorithms.cost.Placement``. Pricing reads one rank's plan or a bounded
sample of plans, so a choice costs about the same at 4 or 4,096 participants, and every rank
makes the same choice from the same arguments. Decisions are cached per collective, count,
quarter-octave of bytes, dtype, fabric and placement.

``CostModel`` and ``LinkModel`` are the older, simpler constants a transport may
still give; they become a fabric (``fabric_of``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from functools import lru_cache

from .. import algorithms
from .base import Layout
from .cost import Fabric, Link, Placement, Prediction, human_bytes, human_time
from .native_prices import predict_native
from .sampling import predict
from .schedule import Collective

CANDIDATES = ("tree", "rechd", "ring", "shuffle", "one_device")
TWO_LEVEL_CANDIDATES = ("ring/ring", "rechd/ring", "ring/rechd", "shuffle/ring", "tree/tree")
DIRECT_UP_TO = 256  # shuffle and one_device talk to everyone: never the cheapest beyond this
# Predictions this close are a tie, which goes to the candidate whose busiest round has the
# fewest messages: flows converging on one link contend in ways the model does not price
# (the lab measured the direct shuffle 10-50% slower than the ring at an equal prediction).
TIE = 0.01
# A schedule must be predicted this much cheaper than the transport's own collective where
# that was measured (timed on this job) to run instead: a margin for the model's error in
# favour of the measured time (the one-host check saw schedules predicted 10-20% cheaper
# than MPI's all-reduce run 1.1-1.7x slower on a crowded host).
NATIVE_MARGIN = 0.15
RING_SHARDS = (2, 4)  # up to 1,024 participants (each sub-chunk multiplies the ring's rounds)


@dataclass(frozen=True)
class CostModel:
    """Simple constants: seconds per round, per byte moved, per byte reduced, per message.
    ``shared_memory`` backends run every schedule tile by tile at the same memory traffic,
    so there the cost is the bookkeeping: fewer steps and messages win."""

    latency: float = 5e-6
    seconds_per_byte: float = 1 / 5e9
    reduce_seconds_per_byte: float = 1 / 10e9
    message_overhead: float = 10e-6
    shared_memory: bool = False

    def as_fabric(self) -> Fabric:
        if self.shared_memory:
            step = Link(self.latency, 0.0)
            return Fabric(step, step, step, gamma=0.0, overhead=self.latency, serial=True,
                          source="shared-memory bookkeeping")
        link = Link(self.latency, self.seconds_per_byte)
        return Fabric(link, link, link, gamma=self.reduce_seconds_per_byte,
                      overhead=self.message_overhead / 2, source="transport constants")


@dataclass(frozen=True)
class LinkModel:
    """Two cost models: between participants of one host (``intra``) and across hosts."""

    intra: CostModel = CostModel(latency=5e-6, seconds_per_byte=1 / 8e9)
    inter: CostModel = CostModel(latency=30e-6, seconds_per_byte=1 / 1.25e9)

    def as_fabric(self) -> Fabric:
        near = Link(self.intra.latency, self.intra.seconds_per_byte)
        return Fabric(near, near, Link(self.inter.latency, self.inter.seconds_per_byte),
                      gamma=self.intra.reduce_seconds_per_byte,
                      overhead=self.intra.message_overhead / 2, source="transport constants")


def fabric_of(model) -> Fabric:
    """A fabric from a ``Fabric``, ``CostModel`` or ``LinkModel``."""
    return model if isinstance(model, Fabric) else model.as_fabric()


@dataclass(frozen=True)
class Candidate:
    name: str
    shards: int = 0
    layout: Layout | None = None


@dataclass
class Decision:
    """What ``auto`` runs (``name``, ``shards``, ``layout``: the groups of a two-level
    choice) and every candidate's prediction, best first."""

    name: str
    shards: int
    layout: Layout | None
    predictions: list = field(default_factory=list)
    context: str = ""
    runner: str = ""  # which runner runs the call, and why others did not (api.runners)

    @property
    def best(self) -> Prediction:
        """The winner's prediction."""
        return self.predictions[0]

    def __str__(self) -> str:
        return explain(self)


def _groupings(size: int, placement: Placement, fabric: Fabric,
               groups: Layout | None = None) -> list[Layout]:
    """Groups for two-level candidates: those given, the hosts, or on one host groups of
    about sqrt(n)."""
    if groups is not None:
        return [groups]
    hosts = placement.hosts
    if hosts is not None and len(hosts.groups) > 1:
        return [hosts]
    if fabric.serial or size < 16:
        return []
    out = []
    k = 1 << round(size.bit_length() / 2)
    for per in (k, k * 2):
        if 1 < per < size and size % per == 0:
            out.append(Layout([range(i, i + per) for i in range(0, size, per)]))
    return out


def candidates(collective: Collective, size: int, placement: Placement, fabric: Fabric,
               groups: Layout | None = None) -> list[Candidate]:
    out = []
    for name in CANDIDATES:
        if not algorithms.supports(collective, name):
            continue
        if size > DIRECT_UP_TO and name in ("shuffle", "one_device"):
            continue
        out.append(Candidate(name))
    reducing = collective in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER)
    hosts = placement.hosts
    if reducing and not fabric.serial and hosts is not None and hosts.runs and size <= 1024:
        for shards in RING_SHARDS:  # sub-rings rotate inside hosts: other neighbours
            if shards <= hosts.runs:
                out.append(Candidate("ring", shards, hosts))
    if collective in (Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER):
        for layout in _groupings(size, placement, fabric, groups):
            names = TWO_LEVEL_CANDIDATES if layout.uniform else ("tree/tree", "rechd/ring")
            out.extend(Candidate(name, 0, layout) for name in names)
    return out


def _representative(nbytes: int) -> int:
    """The bytes a decision is made at: the top three bits (four steps per octave)."""
    nbytes = max(int(nbytes), 1)
    drop = max(nbytes.bit_length() - 3, 0)
    return nbytes >> drop << drop


def decide(collective: Collective, size: int, nbytes: int, model, placement: Placement | None
           = None, *, dtype: str = "float32", natives: tuple = (),
           payload: int | None = None, groups: Layout | None = None) -> Decision:
    """Price every candidate and pick the cheapest (ties, within ``TIE``, go to the fewest
    concurrent messages, then to the earlier candidate; a schedule predicted less than
    ``NATIVE_MARGIN`` cheaper than a measured native collective leaves the call to it).
    ``nbytes``: what the plans' positions span (an all-gather's whole result); ``payload``:
    the call's own bytes, which measured ``natives`` are looked up at; ``groups``: the
    groups two-level candidates use (default: the hosts)."""
    fabric = fabric_of(model)
    placement = placement or Placement(size, None, not fabric.serial)
    rep = _representative(nbytes)
    scale = _representative(payload) if payload is not None else None
    with _DECIDING:
        decision = _decide(collective, size, rep, fabric, placement, str(dtype), tuple(natives),
                           scale, groups)
    shown = payload if payload is not None else nbytes
    if _representative(shown) != shown:  # say the call's own size, and the one priced
        context = decision.context.replace(f"{human_bytes(scale or rep)} (",
                                           f"{human_bytes(shown)} (priced at {human_bytes(scale or rep)}, ",
                                           1)
        decision = replace(decision, context=context)
    return decision


# Thread ranks make their first call of a size at the same moment and all miss the cache at
# once: one decides, the others wait for its answer (16 thread ranks each pricing every
# candidate again: a 16-rank all-reduce matrix took 25.1 s of CPU time, 22.8 s with the lock).
_DECIDING = threading.Lock()


@lru_cache(maxsize=4096)
def _decide(collective, size, nbytes, fabric, placement, dtype, natives, payload,
            groups) -> Decision:
    if size == 1:  # nothing moves: the simplest algorithm with this collective
        name = "one_device" if algorithms.supports(collective, "one_device") else "shuffle"
        return Decision(name, 0, None, [Prediction(name, collective, 1, nbytes, 0.0)])
    predictions = []
    p: Prediction | None
    for c in candidates(collective, size, placement, fabric, groups):
        layout = c.layout if "/" in c.name or c.shards else None
        p = predict(collective, c.name, size, nbytes, fabric, placement, shards=c.shards,
                    layout=layout, dtype=dtype)
        p.shards, p.layout = c.shards, layout
        predictions.append(p)
    for method in natives:
        p = predict_native(method, collective, size, nbytes, fabric, placement, dtype=dtype,
                           payload=payload)
        if p is not None:
            predictions.append(p)
    order = {id(p): i for i, p in enumerate(predictions)}
    predictions.sort(key=lambda p: (p.seconds, order[id(p)]))
    tied = [p for p in predictions if p.seconds <= predictions[0].seconds * (1 + TIE)]
    best = min(tied, key=lambda p: (p.fan_out, order[id(p)]))
    timed = [p for p in predictions if p.note == "measured"]
    if best.note != "measured" and timed and best.seconds > timed[0].seconds * (1 - NATIVE_MARGIN):
        best = timed[0]  # the model's error is allowed a margin against a measured time
    predictions.remove(best)
    predictions.insert(0, best)
    context = (f"{collective.value} of {human_bytes(payload or nbytes)} ({dtype}) over {size} "
               f"participants{_where(placement)}; constants: {fabric.source}" +
               "".join(f"; calibration flagged: {flag}" for flag in fabric.flags))
    return Decision(best.algorithm, best.shards, best.layout, predictions, context)


def _where(placement: Placement) -> str:
    hosts = placement.hosts
    kind = "processes" if placement.processes else "threads or devices of one process"
    if hosts is None or len(hosts.groups) == 1:
        return f" ({kind}, one host)"
    per = f"{hosts.uniform}" if hosts.uniform else "uneven"
    return f" ({kind}; {len(hosts.groups)} hosts x {per})"


def explain(decision: Decision) -> str:
    """Every candidate's predicted time, and why the winner won."""
    lines = [f"auto for {decision.context}:"] if decision.context else []
    for p in decision.predictions:
        mark = "  <- runs" if p is decision.best else ""
        detail = ("measured" if p.note == "measured" else
                  f"latency {human_time(p.latency)}, transfer {human_time(p.transfer)}, "
                  f"reduction {human_time(p.reduction)}")
        lines.append(f"  {p.label:26} {human_time(p.seconds):>10}  ({detail}){mark}")
    if decision.predictions:
        lines.append(why(decision.predictions))
    if decision.runner:
        lines.append(decision.runner)
    return "\n".join(lines)


def why(predictions: list) -> str:
    """One sentence: what the winner saves over the runner-up."""
    if len(predictions) < 2:
        return f"{predictions[0].label} is the only candidate."
    a, b = predictions[0], predictions[1]
    gap = b.seconds - a.seconds
    if gap < max(1e-9, 1e-4 * b.seconds) and "measured" not in (a.note, b.note):  # a tie
        return (f"{a.label} and {b.label} are priced alike ({human_time(a.seconds)}): "
                f"{a.label}, the first of the tie in the candidates' order, runs.")
    head = (f"{a.label} wins by {human_time(gap)} ({gap / b.seconds:.0%}) over {b.label}")
    if a.note == "measured" and b.seconds < a.seconds:
        return (f"{a.label} runs: the transport's own collective, timed on this job; "
                f"{b.label} is predicted only {-gap / a.seconds:.0%} cheaper, within the "
                f"{NATIVE_MARGIN:.0%} margin the model's error is allowed against a measured time.")
    if "measured" in (a.note, b.note):
        return head + (": the transport's own collective, timed on this job at these sizes"
                       if a.note == "measured" else ": the other is a measured native time")
    diffs = {"latency (rounds, messages)": b.latency - a.latency,
             "moving bytes": b.transfer - a.transfer, "reducing": b.reduction - a.reduction}
    reason, saved = max(diffs.items(), key=lambda kv: kv[1])
    where = b.rounds and max(b.rounds, key=lambda r: r[1] * r[2].seconds)[2].who
    return (f"{head}: {b.label} spends {human_time(saved)} more on {reason}" +
            (f" (its slowest rounds wait for {where})" if where else "") + ".")


def choose(collective: Collective, size: int, nbytes: int, model) -> str:
    """The canonical name of the cheapest algorithm for this call (no groups, no natives)."""
    fabric = fabric_of(model)
    decision = decide(collective, size, nbytes, fabric, Placement(size, None, not fabric.serial))
    flat = [p for p in decision.predictions if "/" not in p.algorithm and not p.shards]
    return flat[0].algorithm
