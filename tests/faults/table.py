"""Every fault case, and the transports and sizes each one runs on."""

from __future__ import annotations

from faults import (
    cases_agreed,
    cases_calls,
    cases_comms,
    cases_first_step,
    cases_inflight,
    cases_inputs,
    cases_kinds,
    cases_lists,
    cases_multi,
    cases_ranks,
)
from faults.kit import Case

SPMD: list[Case] = (cases_ranks.CASES + cases_inputs.CASES + cases_calls.CASES + cases_comms.CASES
                    + cases_inflight.CASES + cases_kinds.CASES + cases_lists.CASES
                    + cases_agreed.CASES + cases_first_step.CASES)
MULTI: list[Case] = cases_multi.CASES + cases_calls.MULTI

# (transport, ranks or devices): thread ranks, MPI ranks (COLLECTIVES_RANKS_PER_NODE=2 for
# "mpi-nodes": two simulated nodes of two ranks), and the multi-device API.
CONFIGS: list[tuple[str, int]] = [("threads", 3), ("mpi", 3), ("multi", 3), ("threads", 2),
                                  ("threads", 4), ("mpi", 2), ("mpi-nodes", 4), ("multi", 4)]


def cases_for(transport: str, size: int) -> list[Case]:
    table = MULTI if transport == "multi" else SPMD
    return [c for c in table if transport in c.where and size in c.sizes]


def find(transport: str, name: str) -> Case:
    for case in MULTI if transport == "multi" else SPMD:
        if case.name == name:
            return case
    raise KeyError(f"no fault case {name!r} for {transport}")


def _unique(cases: list[Case]) -> None:
    seen: set[str] = set()
    for c in cases:
        if c.name in seen:
            raise ValueError(f"two fault cases are named {c.name!r}")
        seen.add(c.name)


_unique(SPMD)
_unique(MULTI)
