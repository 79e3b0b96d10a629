"""What runs a Communicator's call: one ordered list of runners; the first that takes it wins.

A call is described once, when it is validated (``collectives.runtime.calls.Call``: the
collective, shape, dtype, op and the algorithm asked for), and ``choose`` asks the runners
of ``RUNNERS`` in order. A runner's ``skip(comm, call)`` says why it does not run the call
(None: it runs it) and its ``run_as(comm, call)`` what the call then runs as: ``"native"``
(the transport's own collective) or a schedule's canonical name, which
``comm.calls.data_stage`` turns into the stage that moves the data.

1. ``native``: the transport's collective, asked for by one of its names (``"native"``,
   ``"mpi"``, ``"nccl"``, MPI's ``"shm"``), where it has the call's dtype and op;
2. ``schedule``: a schedule asked for by name (``"ring"``, ``"rechd"``, ``"xring"``, a
   two-level ``"A/B"``, ...);
3. ``auto``: the cheapest by the cost model of the transport's collectives (where they run
   the call) and every schedule (``collectives.api.auto``).

Runners look only at what every rank has alike (the call's signature, the transport's
collectives, the communicator's constants), never at one rank's state, so every rank picks
the same runner. The choice is kept with the validated call (``comm.calls.cache``): a
repeated call pays nothing for it, and the hot path (``collectives.runtime.hot_path``) is the
native runner's form bound to an agreed signature. ``comm.explain`` names the runner that
runs a call and why the ones before it were skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..runtime.calls import Call, first_taker
from . import auto


@dataclass(frozen=True)
class Choice:
    """The runner that runs a call, what the call runs as, and why each runner before it did
    not run it (``(runner, reason)``, in order)."""

    runner: str
    run_as: str
    skipped: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        lines = [f"runs on the {self.runner} runner, as {self.run_as}"]
        lines += [f"  {name} skipped: {why}" for name, why in self.skipped]
        return "\n".join(lines)


class Runner(Protocol):
    """One way of running calls (see the module's docstring)."""

    name: str

    def skip(self, comm: Any, call: Call) -> str | None:
        """Why this runner does not run ``call`` (None: it runs it)."""
        ...

    def run_as(self, comm: Any, call: Call) -> str:
        """What ``call`` runs as on this runner: ``"native"`` or a schedule's name (it may
        set the call's ``shards``, ``layout`` and ``algorithm``, as ``auto`` does)."""
        ...


class Native:
    """The transport's own collective, asked for by name."""

    name = "native"

    def skip(self, comm: Any, call: Call) -> str | None:
        native = comm.transport.native
        if call.algorithm not in comm.calls.native_names:
            return (f"not asked for by name ({call.algorithm!r}; the transport's: "
                    f"{', '.join(comm.calls.native_names) or 'none'})")
        if not native.supports(call):
            return (f"the transport's {call.algorithm} cannot run {call.describe()}; "
                    "the cost model picks among the schedules")
        return None

    def run_as(self, comm: Any, call: Call) -> str:
        return "native"


class Schedule:
    """A schedule asked for by name."""

    name = "schedule"

    def skip(self, comm: Any, call: Call) -> str | None:
        if call.algorithm == "auto" or call.algorithm in comm.calls.native_names:
            return f"no schedule asked for by name ({call.algorithm!r})"
        return None

    def run_as(self, comm: Any, call: Call) -> str:
        return call.algorithm


class Auto:
    """The cost model's choice (``collectives.api.auto.choose``)."""

    name = "auto"

    def skip(self, comm: Any, call: Call) -> str | None:
        return None

    def run_as(self, comm: Any, call: Call) -> str:
        return auto.choose(comm, call)


RUNNERS: tuple[Runner, ...] = (Native(), Schedule(), Auto())


def choose(comm: Any, call: Call, runners: tuple[Runner, ...] = RUNNERS) -> Choice:
    """The first of ``runners`` that runs ``call``, and why those before it did not."""
    runner, skipped = first_taker(runners, lambda r: r.skip(comm, call))  # (auto takes all)
    return Choice(runner.name, runner.run_as(comm, call), skipped)
