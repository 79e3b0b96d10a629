"""What every rank agrees on before a communicator over MPI makes its first call.

One gather of MPI's own (outside the communicator's numbered calls, so the program's first call
is call 1 in every message about it) carries each rank's library version, its clock probe
(``collectives.timeline.clock``) and what is wrong with its arguments. A bad argument then
raises on every rank alike: raised on its rank alone, it left the others in MPI's gather, which
has no timeout. The MPI and NCCL transports' ``init`` both start here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collectives import __version__
from collectives.runtime.validate import argument_problem, raise_gathered_problems
from collectives.timeline import clock
from collectives.version import check_versions


def agree_to_start(comm: Any, check_arguments: Callable[[], None], call: str) -> list:
    """Gather over ``comm`` (an mpi4py communicator), raise on every rank where any rank's
    ``check_arguments()`` failed or the versions differ; return each rank's clock probe, in
    rank order, for ``clock.align``. ``call``: the function named in the error."""
    gathered = comm.allgather((__version__, clock.probe(), argument_problem(check_arguments)))
    raise_gathered_problems([problem for _, _, problem in gathered], call)
    check_versions([version for version, _, _ in gathered])
    return [probe for _, probe, _ in gathered]
