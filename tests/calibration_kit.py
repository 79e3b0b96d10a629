"""What the calibration tests share: what calibration would measure if the model were exact,
and the least of a communicator that its solver reads."""

from __future__ import annotations

from types import SimpleNamespace

from collectives.algorithms.cost import Fabric, Placement
from collectives.algorithms.sampling import predict
from collectives.algorithms.schedule import Collective
from collectives.api import calibration_links


def priced(plan: dict, fabric: Fabric, placement: Placement) -> dict:
    """The model's time of each all-reduce of ``plan`` (name -> (algorithm, sub-chunks,
    bytes)) on ``placement``: what timing them would measure if the model were exact."""
    return {name: predict(Collective.ALL_REDUCE, algorithm, placement.size, nbytes, fabric,
                          placement, shards=shards).seconds
            for name, (algorithm, shards, nbytes) in plan.items()}


def probe_times(n: int, fabric: Fabric) -> dict:
    """What calibration would measure on n ranks of one host if the model were exact."""
    return priced({**calibration_links.probes(n), **calibration_links.CHECKS}, fabric,
                  Placement(n))


def fake_comm(n: int) -> SimpleNamespace:
    """A communicator of n MPI ranks on one host, as far as the solver looks."""
    return SimpleNamespace(transport=SimpleNamespace(name="mpi"), size=n,
                           placement=Placement(n))
