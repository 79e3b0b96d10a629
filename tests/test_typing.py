"""The typed API: mypy reads a program that uses it as its users do (tests/typing/typed_usage.py)
and finds nothing, reads a file of mistakes (tests/typing/typos.py) and flags every line marked
``# error`` and no other, and the literal names the annotations offer are exactly the names
the library takes.

mypy reads the package as it is installed (``collectives.backends`` and
``collectives.adapters`` inside ``collectives``) from a tree of links to the checkout's files
that the test lays out, so that it checks these files whatever the venv holds;
tests/test_user_typing.py runs mypy as a user does, on the package the README's install made.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import collectives
from collectives import algorithms, hints
from collectives.ops import ReduceOp

ROOT = Path(__file__).resolve().parent.parent
TYPING = Path(__file__).resolve().parent / "typing"
ERROR = re.compile(r"^(?P<file>[\w.]+):(?P<line>\d+): error: (?P<message>.*)$")


def installed_tree(where: Path) -> Path:
    """``where/collectives`` laid out as pip installs it, made of links to the checkout."""
    package = where / "collectives"
    package.mkdir(parents=True)
    for item in (ROOT / "collectives").iterdir():
        if item.name != "__pycache__":
            os.symlink(item, package / item.name)
    os.symlink(ROOT / "backends", package / "backends")
    os.symlink(ROOT / "adapters", package / "adapters")
    return where


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory) -> dict[str, dict[int, str]]:
    pytest.importorskip("mypy")
    tmp = tmp_path_factory.mktemp("typing")
    site = installed_tree(tmp / "site")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini",
                           "--cache-dir", str(tmp / "cache"), "--no-error-summary",
                           "typed_usage.py", "typos.py"],
                          cwd=TYPING, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MYPYPATH": str(site)})
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 2: mypy itself failed
    found: dict[str, dict[int, str]] = {"typed_usage.py": {}, "typos.py": {}}
    for line in proc.stdout.splitlines():
        match = ERROR.match(line)
        if match:
            found.setdefault(match["file"], {})[int(match["line"])] = match["message"]
    return found


@pytest.mark.slow
def test_a_program_using_the_api_type_checks(mypy_errors):
    assert mypy_errors["typed_usage.py"] == {}, "\n".join(
        f"typed_usage.py:{n}: {m}" for n, m in sorted(mypy_errors["typed_usage.py"].items()))


@pytest.mark.slow
def test_every_mistake_fails_type_checking(mypy_errors):
    lines = (TYPING / "typos.py").read_text().splitlines()
    marked = {n for n, text in enumerate(lines, 1) if text.rstrip().endswith("# error")}
    assert len(marked) >= 10
    flagged = set(mypy_errors["typos.py"])
    missed = [lines[n - 1].strip() for n in sorted(marked - flagged)]
    assert not missed, f"not caught: {missed}"
    assert flagged - marked == set(), f"flagged unmarked lines: {sorted(flagged - marked)}"
    assert "summ" in lines[min(marked) - 1]  # the first: op="summ"


def test_the_typed_program_runs():
    proc = subprocess.run([sys.executable, str(TYPING / "typed_usage.py")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "typed usage ran"


def _literals(alias) -> set[str]:
    values: set[str] = set()
    for arg in typing.get_args(alias):
        values |= _literals(arg) if typing.get_args(arg) else {arg} if isinstance(arg, str) else set()
    return values


def test_the_literal_names_are_the_library_names():
    names = set(algorithms.NAMES)
    assert _literals(hints.AlgorithmName) == names | {"auto", "collective"}
    assert _literals(hints.TwoLevelName) == {f"{a}/{b}" for a in names for b in names}
    for name in _literals(hints.AlgorithmName) | _literals(hints.TwoLevelName):
        algorithms.canonical(name)  # each is a name the library takes
    for op in _literals(hints.OpName):
        ReduceOp.parse(op)
    assert {m.value for m in ReduceOp} <= _literals(hints.OpName)
    with pytest.raises(ValueError):
        ReduceOp.parse("summ")
    from collectives import compression

    assert _literals(hints.CompressionName) == set(compression.NAMES) | {"none"}
    assert _literals(hints.CollectiveName) == {c.value for c in collectives.Collective}


def test_work_is_generic_and_multi_device_handles_are_work():
    import numpy as np

    handle = collectives.all_reduce([np.ones(2), np.ones(2)], async_op=True)
    assert isinstance(handle, collectives.Work) and handle.is_completed()
    assert [float(r[0]) for r in handle.wait()] == [2.0, 2.0]
    assert collectives.Work[int] is not None  # subscriptable at run time too



@pytest.mark.slow
def test_the_library_passes_its_own_checker(tmp_path):
    """mypy (pinned in the test extra), with pyproject.toml's configuration, over the whole
    package as it is installed (backends and adapters inside it): no error."""
    pytest.importorskip("mypy")
    site = installed_tree(tmp_path / "site")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                           str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
                           "-p", "collectives"], cwd=site, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "Success: no issues found" in proc.stdout, proc.stdout[-2000:]
