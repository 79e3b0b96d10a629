"""The one list of runners that chooses how a Communicator's call runs (collectives.api.runners):
the first that takes a call runs it, every rank picks the same one, and ``comm.explain`` says
which ran and why the ones before it were skipped."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import collectives
from collectives.api import runners


@pytest.mark.parametrize("size", [1, 3, 5])
def test_each_algorithm_request_goes_to_its_runner_on_every_rank(size):
    def body(comm):
        x = np.arange(1009, dtype=np.float32)
        seen = {}
        for algorithm in ("auto", "ring", "rechd", "xring"):
            comm.all_reduce(x, "sum", algorithm)
            text = str(comm.explain("all_reduce", x, algorithm=algorithm))
            seen[algorithm] = (comm.last_algorithm, text)
        return seen

    per_rank = collectives.run(body, size=size)
    assert all(r == per_rank[0] for r in per_rank)  # the same runner, for the same reasons
    seen = per_rank[0]
    ran, text = seen["auto"]
    assert f"runs on the auto runner, as {ran}" in text
    assert "native skipped: not asked for by name" in text
    assert "schedule skipped: no schedule asked for by name ('auto')" in text
    for algorithm, canonical in (("ring", "ring"), ("rechd", "rechd"), ("xring", "ring")):
        ran, text = seen[algorithm]
        assert ran == canonical
        assert f"runs on the schedule runner, as {canonical}" in text
        assert "native skipped" in text and "auto" not in text.split("runs on")[1]


def test_the_first_runner_that_takes_a_call_wins_and_the_skipped_say_why():
    class Never:
        name = "never"

        def skip(self, comm, call):
            return "it never runs anything"

        def run_as(self, comm, call):
            raise AssertionError("a skipped runner ran")

    class Always:
        name = "always"

        def skip(self, comm, call):
            return None

        def run_as(self, comm, call):
            return "tree"

    def body(comm):
        call = comm.calls.validated(collectives.Collective.ALL_REDUCE, np.ones(4), "sum", "ring")
        return runners.choose(comm, call, (Never(), Always(), runners.Auto()))

    choice = collectives.run(body, size=2)[0]
    assert (choice.runner, choice.run_as) == ("always", "tree")
    assert choice.skipped == (("never", "it never runs anything"),)


def test_mpi_native_by_name_and_a_dtype_it_lacks():
    """On MPI, "native" runs MPI's collective where it has the dtype; float16 (no MPI type)
    goes on to the cost model, and explain says why."""
    pytest.importorskip("mpi4py")
    program = textwrap.dedent("""
        import numpy as np, collectives
        comm = collectives.init("mpi")
        for dtype in (np.float32, np.float16):
            x = np.ones(10, dtype)
            comm.all_reduce(x, "sum", "native")
            print(dtype.__name__, comm.last_algorithm, "|",
                  str(comm.explain("all_reduce", x, algorithm="native")).replace("\\n", "|"))
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["float32"].startswith("native |")
    assert "runs on the native runner, as native" in lines["float32"]
    assert "runs on the auto runner" in lines["float16"]
    assert "native skipped: the transport's native cannot run" in lines["float16"]
