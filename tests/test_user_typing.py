"""mypy as a user runs it: from a folder outside the checkout, with this suite's Python (the
venv the README's command makes, the package installed as that command installs it), no
MYPYPATH, no copied tree, no configuration. It must find the package and its types (a
program that uses them passes, every typo is flagged), and a typo's error must stay short:
one message, not the spelled-out names of every overload's every parameter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a cold mypy run over NumPy's stubs

FINE = '''\
from typing import assert_type

import numpy as np
import numpy.typing as npt

import collectives
from collectives import Communicator, Work

F64 = npt.NDArray[np.float64]
xs: list[F64] = [np.ones(3), np.ones(3)]
assert_type(collectives.all_reduce(xs, op="sum", algorithm="ring"), list[F64])
assert_type(collectives.all_reduce(xs, "mean", "ring/xring", groups=1), list[F64])
assert_type(collectives.all_reduce(xs, "max", [("pscpu", 1, 1024), ("xring", 2, -1)]), list[F64])


def step(comm: Communicator) -> F64:
    x: F64 = np.ones(3)
    handle = comm.all_reduce(x, op="sum", algorithm="tree", async_op=True)
    assert_type(handle, Work[F64])
    return comm.all_reduce(handle.wait(), "max")
'''

# One mistake a line, each marked: the first two are the (an op, a one-level name).
TYPOS = '''\
import numpy as np

import collectives
from collectives import Communicator

xs = [np.ones(3), np.ones(3)]
collectives.all_reduce(xs, op="summ")  # error
collectives.all_reduce(xs, algorithm="rign")  # error
collectives.all_reduce(xs, "sum", "ring/rign")  # error
collectives.all_reduce(xs, "sum", [("xrign", 2, -1)])  # error
collectives.reduce(xs, "avgg", 0)  # error
collectives.batch_all_reduce([xs, xs], op="summ")  # error


def step(comm: Communicator) -> None:
    comm.all_reduce(np.ones(3), op="summ")  # error
    comm.all_reduce(np.ones(3), algorithm="natve")  # error
    comm.reduce_scatter(np.ones(4), "mean", "rign")  # error
'''

LINE = re.compile(r"^(?P<file>[\w.]+):(?P<line>\d+): (?P<kind>error|note): ")


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory) -> dict[str, dict[int, list[str]]]:
    """What mypy prints about each line of each program, run from a folder of its own."""
    pytest.importorskip("mypy")
    where = tmp_path_factory.mktemp("user")
    (where / "fine.py").write_text(FINE)
    (where / "typos.py").write_text(TYPOS)
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(where / "cache"),
                           "--no-error-summary", "--no-pretty", "fine.py", "typos.py"],
                          cwd=where, capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), out[-3000:]  # 2: mypy itself failed
    assert "Cannot find implementation or library stub" not in out, out[-3000:]
    found: dict[str, dict[int, list[str]]] = {"fine.py": {}, "typos.py": {}}
    for line in proc.stdout.splitlines():
        match = LINE.match(line)
        assert match and match["file"] in found, f"unexpected output: {line!r}"
        found[match["file"]].setdefault(int(match["line"]), []).append(line)
    return found


def test_a_program_that_uses_the_api_passes(mypy_output):
    assert mypy_output["fine.py"] == {}, "\n".join(
        line for lines in mypy_output["fine.py"].values() for line in lines)


def test_every_typo_is_flagged_and_nothing_else(mypy_output):
    lines = TYPOS.splitlines()
    marked = {n for n, text in enumerate(lines, 1) if text.endswith("# error")}
    flagged = {n for n, said in mypy_output["typos.py"].items()
               if any(": error: " in line for line in said)}
    missed = [lines[n - 1].strip() for n in sorted(marked - flagged)]
    assert not missed, f"not caught: {missed}"
    assert flagged == marked, f"flagged unmarked lines: {sorted(flagged - marked)}"
    assert len(marked) == 9 and 'op="summ"' in lines[min(marked) - 1]


def test_a_typo_is_a_short_message(mypy_output):
    """A typo's error, with its notes, is under 2 KB (the names written out in every
    overload's signature made about 55 KB for op="summ")."""
    lines = TYPOS.splitlines()
    sizes = {lines[n - 1].strip(): sum(len(line) + 1 for line in said)
             for n, said in mypy_output["typos.py"].items()}
    assert len(sizes) == 9
    too_long = {code: size for code, size in sizes.items() if size >= 2048}
    assert not too_long, too_long


def test_the_programs_run_and_the_typos_fail_at_run_time_too():
    """The programs say what the library does: the fine one runs, and each typo outside
    ``step`` raises the library's own error."""
    import collectives

    scope: dict = {}
    exec(compile(FINE, "fine.py", "exec"), scope)
    assert [r.tolist() for r in collectives.run(scope["step"], size=2)] == [[2.0] * 3] * 2
    setup = TYPOS.split("\n\n\ndef step")[0]
    typos = [line for line in setup.splitlines() if line.endswith("# error")]
    assert len(typos) == 6
    for line in typos:
        with pytest.raises((ValueError, TypeError)):
            exec(compile(line, "typos.py", "exec"), dict(scope))
