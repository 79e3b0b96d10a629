"""Run a scenario script across lab hosts after checking that MPI sees the hosts as nodes.

Usage: ``mpiexec ... python on_hosts.py SCRIPT [ARGS...]`` (``tests/test_multihost.py`` builds
the command with ``benchmarks/lab.py``). Every rank checks that ``COLLECTIVES_RANKS_PER_NODE`` is
unset, so node groups can only come from ``Split_type(COMM_TYPE_SHARED)``, and that
``collectives.backends.mpi.node_groups`` groups the ranks exactly by their hostnames. Rank 0
prints ``HOSTS`` (each rank's hostname) and ``NODE_GROUPS``; then SCRIPT runs in this process as
``__main__``. For scripts that report through ``_common.Report``, rank 0 also prints every failed
check of every rank (``CHECK-FAILED`` lines; the script's own summary lists only the first 40).
"""

from __future__ import annotations

import os
import runpy
import socket
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from collectives.backends import mpi  # noqa: E402
from mpi4py import MPI  # noqa: E402

WORLD = MPI.COMM_WORLD


def groups_by_hostname(hostnames: list[str]) -> tuple[tuple[int, ...], ...]:
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hostnames):
        by_host.setdefault(host, []).append(rank)
    return tuple(sorted(tuple(ranks) for ranks in by_host.values()))


def check_nodes() -> None:
    problems = []
    if "COLLECTIVES_RANKS_PER_NODE" in os.environ:
        problems.append(f"rank {WORLD.rank}: COLLECTIVES_RANKS_PER_NODE is set")
    hostnames = WORLD.allgather(socket.gethostname())
    groups = mpi.node_groups(WORLD)
    if groups != groups_by_hostname(hostnames):
        problems.append(f"rank {WORLD.rank}: node_groups {groups} do not follow the hostnames "
                        f"{hostnames}")
    problems = [p for ps in WORLD.allgather(problems) for p in ps]
    if WORLD.rank == 0:
        print("HOSTS", " ".join(hostnames), flush=True)
        print("NODE_GROUPS", groups, flush=True)
        for p in problems:
            print("FAIL", p, flush=True)
    if problems:
        sys.exit(1)


def list_every_failure(script_dir: str) -> None:
    sys.path.insert(0, script_dir)
    try:
        from _common import Report
    except ImportError:
        return
    finish = Report.finish

    def finish_listing_everything(self, extra: str = "") -> None:
        everyone = WORLD.gather(self.failures, root=0)  # rank 0 prints: lines stay whole
        if WORLD.rank == 0:
            print("".join(f"CHECK-FAILED {f}\n" for fs in everyone for f in fs), end="", flush=True)
        finish(self, extra)

    Report.finish = finish_listing_everything


if __name__ == "__main__":
    script = os.path.abspath(sys.argv[1])
    check_nodes()
    list_every_failure(os.path.dirname(script))
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
