"""Predict a plan's time: the alpha-beta-gamma model of every round, over the links it crosses.

A plan says, per round, what each participant sends, receives and reduces. The model prices
that with the constants of a ``Fabric``, measured (``collectives probe``) or given:

* each message crosses one **link class**: ``proc`` (participants in one process: threads,
  devices), ``host`` (processes on one host: shared memory) or ``net`` (across hosts), as a
  ``Placement`` says; a class has a latency ``alpha`` and an inverse bandwidth ``beta``;
* a participant's round costs ``round_overhead``, plus ``overhead`` per message it posts or
  matches (serialised on its CPU), plus the largest ``alpha`` among the classes it uses, plus,
  per class, the larger of the bytes it sends and receives times ``beta``, plus ``gamma``
  (of the dtype) per byte it reduces;
* a class's ``two_way`` is what the bytes moving the other way in the same round (the smaller
  direction) cost, as a fraction of ``beta``: 0 where the link is full duplex (a network
  link), up to 1 where both directions are copies through one memory (processes on one host:
  a round that sends and receives at once takes longer than its larger direction alone);
* where a host runs more busy processes than it has cores, a participant also waits for its
  peers to be scheduled: ``crowding`` seconds per round, plus ``crowding_message`` per peer
  it receives from in the round (messages from one peer wait once), each per busy process
  beyond the ``cores``, per core; measured by ``collectives probe`` (``Fabric.crowd``);
* the ``net`` bytes are those of the participant's **host**: a host's ranks share its link, so
  a round moves what all of them send (or receive) across it together;
* a round ends when its slowest participant does, and each round needs the previous one's
  data: the call's time is the sum over rounds of the slowest participant's time, the
  critical path through the rounds. (Serial fabrics, where one thread runs every
  participant's steps, add the participants' times instead.)

One round's price is ``collectives.algorithms.round_price``'s (``round_part``). Which
participants are priced (every one up to 64, else one rank's plan and the plans' symmetry, or
a few whole hosts) is ``collectives.algorithms.sampling``'s job, so a prediction for 65,536
participants costs about one plan's rounds.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from .base import Layout
from .fabric_file import fields
from .schedule import Collective

PROC, HOST, NET = 0, 1, 2
CLASSES = ("proc", "host", "net")


@dataclass(frozen=True)
class Link:
    """One link class: ``alpha`` seconds per message, ``beta`` seconds per byte, and
    ``two_way``: what bytes moving the other way in the same round cost, as a fraction of
    ``beta`` (0: full duplex, as a network link; 1: one direction at a time, as copies
    through one memory)."""

    alpha: float
    beta: float
    two_way: float = 0.0

    def moved(self, sent: float, received: float) -> float:
        """The bytes a round's ``sent`` and ``received`` cost ``beta`` each: the larger
        direction, plus ``two_way`` of the smaller."""
        return max(sent, received) + self.two_way * min(sent, received)

    def __str__(self) -> str:
        rate = f"{1 / self.beta / 1e9:.2f} GB/s" if self.beta > 0 else "unlimited"
        both = f" (the other way {self.two_way:.2f} of it)" if self.two_way else ""
        return f"alpha {self.alpha * 1e6:.1f} us, {rate}{both}"


@dataclass(frozen=True)
class Fabric:
    """The constants of the model. ``gammas``: ``(dtype name, seconds per byte)`` pairs where
    measured (others use ``gamma``); ``measured``: ``(method, collective, size, ((nbytes,
    seconds), ...))`` timings of a transport's own collectives (MPI's), which the model
    interpolates rather than predicts; ``native_overhead``: seconds per round of a native
    collective's own (C) code, for sizes and counts never measured; ``call_overhead``:
    seconds a call costs before and after its rounds (the same for every algorithm);
    ``cores``, ``crowding`` and ``crowding_message``: the cores of a host (0: unknown), the
    seconds a round and each peer received from wait per busy process beyond them, per core
    (``crowd``); ``checks``: the schedules a
    calibration timed beside its probes, ``(class, name, nbytes, measured, predicted)``;
    ``flags``: the checks that contradicted the probes, in words (``comm.explain`` says them)."""

    proc: Link = Link(2e-6, 1 / 8e9)
    host: Link = Link(5e-6, 1 / 5e9)
    net: Link = Link(30e-6, 1 / 1.25e9)
    gamma: float = 1 / 4e9
    gammas: tuple = ()
    overhead: float = 0.0
    round_overhead: float = 0.0
    serial: bool = False
    nic_shared: bool = True
    native_overhead: float = 2e-6
    call_overhead: float = 0.0
    measured: tuple = ()
    cores: int = 0
    crowding: float = 0.0
    crowding_message: float = 0.0
    source: str = field(default="defaults", compare=False)
    raw: tuple = field(default=(), compare=False)  # what a calibration measured, by name
    checks: tuple = field(default=(), compare=False)
    flags: tuple = field(default=(), compare=False)  # what a calibration found suspect, in words
    # the link classes a calibration measured (others keep what it started from: the
    # transport's defaults); None: these constants are no calibration's
    probed: tuple | None = field(default=None, compare=False)

    def crowd(self, placement: Placement) -> tuple[float, float]:
        """Seconds a participant waits for peers to be scheduled on a host of ``placement``
        with more busy processes than ``cores``, per round and per peer it receives from in
        the round: ``crowding`` and ``crowding_message`` times the processes beyond the cores,
        per core (0 for threads of one process, or where the cores are unknown)."""
        extra = placement.busiest - self.cores
        if not self.cores or extra <= 0 or self.serial or not placement.processes:
            return 0.0, 0.0
        return self.crowding * extra / self.cores, self.crowding_message * extra / self.cores

    def link(self, cls: int) -> Link:
        """The link of class ``cls`` (``PROC``, ``HOST`` or ``NET``: 0, 1, 2)."""
        return (self.proc, self.host, self.net)[cls]

    def gamma_for(self, dtype: str) -> float:
        """Seconds per byte reduced in ``dtype`` (its measured ``gammas``, else ``gamma``)."""
        for name, value in self.gammas:
            if name == dtype:
                return value
        return self.gamma

    def timings(self, method: str, collective: Collective, size: int) -> tuple | None:
        """Measured ``((nbytes, seconds), ...)`` of ``method`` for this collective and count."""
        for m, c, n, points in self.measured:
            if m == method and c == collective.value and n == size:
                return points
        return None

    def to_json(self) -> str:
        """The constants as JSON, as ``collectives probe --json`` writes them."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Fabric:
        """The fabric ``to_json`` (or ``collectives probe --json``) wrote. Fields an older
        file lacks keep their defaults.

        Raises
        ------
        ValueError
            ``text`` is not JSON, or a field is missing, unknown or of the wrong kind (the
            message names it): read as it was, a wrong field broke ``auto`` later with a
            bare TypeError.
        """
        data = fields(text, CLASSES)
        try:
            for name in CLASSES:
                data[name] = Link(**data[name])
            return cls(**data)
        except TypeError as exc:  # (a field a Fabric or a Link does not have)
            raise ValueError(f"a fabric's fields are not a Fabric's: {exc}") from None

    def describe(self) -> str:
        """The constants, one line per link class, then gamma and the overheads."""
        probed = self.probed
        lines = [f"{name:5} {self.link(i)}" + (
                 "  (not measured here: the transport's default)"
                 if probed is not None and name not in probed else "")
                 for i, name in enumerate(CLASSES)]
        gammas = ", ".join(f"{n} {1 / g / 1e9:.2f} GB/s" for n, g in self.gammas)
        lines.append(f"gamma {1 / self.gamma / 1e9:.2f} GB/s reduced" +
                     (f" ({gammas})" if gammas else ""))
        lines.append(f"overhead {self.overhead * 1e6:.1f} us per message, "
                     f"{self.round_overhead * 1e6:.1f} us per round, "
                     f"{self.call_overhead * 1e6:.1f} us per call")
        if self.crowding or self.crowding_message:
            lines.append(f"crowding {self.crowding * 1e6:.1f} us per round and "
                         f"{self.crowding_message * 1e6:.1f} us per peer received from, per "
                         f"busy process beyond {self.cores} cores, per core")
        return "\n".join(lines)


@dataclass(frozen=True)
class Placement:
    """Where participants run: ``hosts`` groups them by host (None: all on one), and
    ``processes`` says whether participants on one host are separate processes (``host``
    links) or threads and devices of one process (``proc`` links)."""

    size: int
    hosts: Layout | None = None
    processes: bool = True

    @classmethod
    def nodes(cls, count: int, per: int, processes: bool = True) -> Placement:
        """``count`` hosts of ``per`` consecutive participants."""
        if count <= 1:
            return cls(per * max(count, 1), None, processes)
        return cls(count * per, Layout([range(i, i + per) for i in range(0, count * per, per)]),
                   processes)

    @property
    def local(self) -> int:
        return HOST if self.processes else PROC

    @property
    def busiest(self) -> int:
        """The most participants on one host."""
        if self.hosts is None:
            return self.size
        return max(len(g) for g in self.hosts.groups)


class Part(NamedTuple):
    """One round's time, by what it is spent on, and what is slowest in it."""

    latency: float    # alpha and overheads
    transfer: float   # bytes over links
    reduction: float  # bytes reduced
    who: str          # the bottleneck
    messages: int = 0  # the most messages one participant posts or matches in the round

    @property
    def seconds(self) -> float:
        return self.latency + self.transfer + self.reduction


@dataclass
class Prediction:
    """A call's predicted time. ``rounds``: runs of equal rounds, ``(first, count, part)``."""

    algorithm: str
    collective: Collective
    size: int
    nbytes: int
    seconds: float
    latency: float = 0.0
    transfer: float = 0.0
    reduction: float = 0.0
    rounds: list = field(default_factory=list)
    shards: int = 0
    layout: Layout | None = None  # the groups of a two-level algorithm (or the ring's rotations)
    note: str = ""

    @property
    def fan_out(self) -> int:
        """The most messages one participant handles in one round (concurrent flows)."""
        return max((part.messages for _, _, part in self.rounds), default=0)

    @property
    def label(self) -> str:
        out = self.algorithm
        if self.shards > 1:
            out += f"#{self.shards}"
        if self.layout is not None and "/" in self.algorithm:
            groups = self.layout.groups
            each = f"{self.layout.uniform}" if self.layout.uniform else "uneven"
            out += f" ({len(groups)}x{each})"
        return out

    def critical_path(self, limit: int = 12) -> str:
        """The rounds, equal neighbours merged: ``rounds 0-6 (7x): 12.0 us each, ...``."""
        lines = []
        for first, count, part in self.rounds[:limit]:
            span = f"round {first}" if count == 1 else f"rounds {first}-{first + count - 1}"
            lines.append(f"  {span:>18} {f'({count}x)' if count > 1 else '':>9} "
                         f"{_time(part.seconds):>10} each: latency {_time(part.latency)}, "
                         f"transfer {_time(part.transfer)}, reduction {_time(part.reduction)}"
                         f"; slowest: {part.who}")
        if len(self.rounds) > limit:
            rest = sum(c for _, c, _ in self.rounds[limit:])
            left = sum(c * p.seconds for _, c, p in self.rounds[limit:])
            lines.append(f"  ... {rest} more rounds, {_time(left)}")
        return "\n".join(lines)


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def human_time(seconds: float) -> str:
    return _time(seconds)


def human_bytes(n: float, digits: int = 4) -> str:
    """``n`` bytes in GiB, MiB or KiB, to ``digits`` significant digits (B below 1 KiB)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.{digits}g} {unit}"
    return f"{n:.0f} B"

