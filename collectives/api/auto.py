"""What ``algorithm="auto"`` runs on a communicator, and why (``comm.explain``).

The transport gives the constants (its ``fabric``, measured or given; else its ``cost_model``
and ``link``) and where ranks run (its ``nodes``: the hosts; ``processes``: separate processes
or threads of one); the model prices every candidate, the transport's own collective among
them where its times were measured, and the cheapest runs. A transport whose own collective
was never timed keeps its rule (``native.preferred``). ``COLLECTIVES_DEBUG=info`` logs each
new decision's prices on rank 0. ``ChoiceOps`` gives a Communicator its ``fabric`` and
``explain``.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from ..algorithms import select
from ..algorithms.base import Layout
from ..algorithms.cost import Fabric, Placement
from ..algorithms.schedule import Collective
from ..hints import CollectiveName, Op, SpmdAlgorithm
from ..runtime.from_root import Like
from ..runtime.validate import Groups
from ..widened import FLOAT64, integer_mean
from .comm_parts import CommParts
from .spmd_spread import SCALAR_REDUCE_SCATTER

SELECT = logging.getLogger("collectives.select")
GATHERED = (Collective.ALL_GATHER, Collective.GATHER)


def transport_fabric(transport: Any) -> Fabric:
    """The transport's constants: its ``fabric``, else its ``cost_model`` within a host and
    its ``link`` (or the default) across hosts."""
    fabric = transport.fabric
    if fabric is not None:
        return fabric
    base = select.fabric_of(transport.cost_model)
    across = select.fabric_of(transport.link or select.LinkModel())
    return Fabric(base.proc, base.host, across.net, gamma=base.gamma, gammas=base.gammas,
                  overhead=base.overhead, round_overhead=base.round_overhead,
                  serial=base.serial, source=base.source)


def transport_placement(transport: Any) -> Placement:
    """Where the transport's ranks run: its hosts (``nodes``, else ``layout``'s groups)."""
    size = transport.size
    processes = bool(transport.processes)
    nodes = transport.nodes
    hosts = Layout(nodes) if nodes else transport.layout
    if hosts is None or len(hosts.groups) <= 1 or hosts.size != size:
        return Placement(size, None, processes)
    return Placement(size, hosts, processes)


def decide(comm: Any, call: Any) -> select.Decision | str:
    """The decision for an ``auto`` call, or ``"native"`` where the transport's own rule says
    so (its collective never timed)."""
    native = comm.transport.native
    natives: tuple = ()
    if native is not None and comm.size == 1 and native.supports(call):
        return "native"  # one rank: a copy whichever runs it, and the native one is hot
    if native is not None and comm.size > 1 and native.supports(call):
        if comm.fabric.timings("native", call.collective, comm.size):
            natives = ("native",)
        elif native.preferred(call):
            return "native"
    if native is not None and comm.size > 1:  # the transport's other methods (MPI's "shm"),
        natives += tuple(own_methods(comm, call))  # where they run and were timed
    nbytes = call.nbytes * (comm.size if call.collective in GATHERED else 1)
    groups = call.layout if call.layout is not None and len(call.layout.groups) > 1 else None
    return select.decide(call.collective, comm.size, max(nbytes, 1), comm.fabric,
                         comm.placement, dtype=str(call.dtype), natives=natives,
                         payload=max(call.nbytes, 1), groups=groups)


def own_methods(comm: Any, call: Any) -> list[str]:
    """The transport's own methods besides "native" (its ``methods``, e.g. MPI's "shm") that can
    run ``call`` and whose times the communicator's constants hold: ``auto``'s candidates."""
    native = comm.transport.native
    found = []
    for method in native.methods:
        if not comm.fabric.timings(method, call.collective, comm.size):
            continue
        if native.supports(replace(call, algorithm=method)):
            found.append(method)
    return found


def choose(comm: Any, call: Any) -> str:
    """What runs an ``auto`` call: "native" or a schedule (its groups and shards set on
    ``call``); a transport's other method (MPI's "shm") runs as "native", with ``call``
    naming it."""
    decision = decide(comm, call)
    if isinstance(decision, str):
        return decision
    if decision.name in comm.calls.native_names:
        # the transport's own method, by its name: the model priced MPI's own apart from the
        # shared-memory one, so "native" runs MPI's, not what the transport's rule would pick
        call.algorithm = decision.name
        return "native"
    if decision.layout is not None:
        call.layout = decision.layout
    if decision.shards:
        call.shards = decision.shards
    if comm.rank == 0 and SELECT.isEnabledFor(logging.INFO):
        SELECT.info("%s", select.explain(decision))
    return decision.name


def explain(comm: Any, collective: CollectiveName | Collective, x: Any, op: Any = "sum", *,
            root: int = 0, groups: Any = None, algorithm: Any = "auto") -> select.Decision:
    """What runs this call, and why: the runner that takes it and why those before it did
    not; for ``auto``, every candidate's price (``str()`` of it: a table and a sentence)."""
    names = [c.value for c in Collective]
    if not isinstance(collective, Collective) and collective not in names:
        raise ValueError(f"collective={collective!r} is not a collective explain knows; pass "
                         f"one of {', '.join(repr(n) for n in names)}")
    collective = Collective(collective)
    reducing = collective in (Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER)
    passed = comm.adapt(x, "x")
    if collective is Collective.REDUCE_SCATTER and len(passed.shape) == 0:
        raise ValueError(SCALAR_REDUCE_SCATTER)  # (as the call itself would)
    # (an integer MEAN travels as float64, ``collectives.widened``: priced so, from its shape
    # alone: the call needs no data)
    x = (Like(tuple(passed.shape), FLOAT64) if reducing and integer_mean(op, passed.dtype)
         else passed)
    call = comm.calls.validated(collective, x, op if reducing else None, algorithm, root=root,
                                groups=groups, passed=passed)
    runner = str(call.choice) if call.choice is not None else ""
    if call.choice is not None and call.choice.runner != "auto":
        return select.Decision(call.run_as, call.shards, call.layout, [],
                               runner=f"{call.describe()} over {comm.size} ranks {runner}")
    decision = decide(comm, call)
    if isinstance(decision, str):
        return select.Decision(decision, 0, None, [], (
            f"{call.describe()} over {comm.size} ranks: runs {decision} by the transport's own "
            "rule (its collective was never timed here; `collectives probe` times it)"),
            runner=runner)
    return replace(decision, runner=runner)


class ChoiceOps(CommParts):
    """The constants ``auto`` chooses with and ``explain`` (mixed into Communicator)."""

    _fabric: Fabric

    @property
    def fabric(self) -> Fabric:
        """The cost model's constants ``auto`` chooses with: the transport's, or measured by
        ``collectives.init(calibrate=...)`` or ``collectives probe``.

        Setting it forgets the choices made with the old constants. Set it on every rank
        alike: choices are made from it, not agreed.
        """
        return self._fabric

    @fabric.setter
    def fabric(self, fabric: Fabric) -> None:
        self._fabric = fabric
        self.calls.forget()  # calls chose with the old constants

    def explain(self, collective: CollectiveName | Collective, x: Any, op: Op = "sum", *,
                root: int = 0, groups: Groups = None,
                algorithm: SpmdAlgorithm = "auto") -> select.Decision:
        """What runs this call and why; local, nothing moves.

        ``print(comm.explain("all_reduce", x))`` names the runner (``collectives.api.runners``:
        the transport's collective asked for by name, a schedule asked for by name, or the cost
        model) and why those before it were skipped; for ``auto`` it lists every candidate's
        predicted time and says why the winner won.

        Parameters
        ----------
        collective
            The collective's name (``"all_reduce"``, ``"reduce"``, ``"broadcast"``,
            ``"all_gather"``, ``"reduce_scatter"``, ...) or a `Collective`.
        x
            This rank's array, as the call would take it.
        op
            The reduction, for the reducing collectives.
        root
            The root of a rooted collective.
        groups
            The groups of a two-level candidate: a group size or a partition of the ranks.
        algorithm
            What the call asks for, as the collective takes it (default ``"auto"``).

        Returns
        -------
        Decision
            ``name``, ``shards`` and ``layout`` of the choice and every candidate's
            prediction, best first; its ``str()`` is a table and a sentence.

        Raises
        ------
        ValueError
            An unknown ``collective`` or ``op``, or an ``x`` the call would refuse.
        TypeError
            ``x`` is not an array, or its dtype cannot take ``op``.
        """
        return explain(self, collective, x, op, root=root, groups=groups, algorithm=algorithm)
