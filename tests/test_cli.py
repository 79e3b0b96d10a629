"""The ``collectives`` command as a newcomer meets it, and the package it comes in: version,
help, argument errors, progress with and without rich, ``--plot``, ``--mode mpi`` through the
backend registry, and what a built wheel holds."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import pty
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

import collectives

ROOT = Path(__file__).resolve().parent.parent
DIST = "collective-schedules"
FAST = ["-b", "64", "-e", "128", "-w", "1", "-i", "2", "-r", "2"]
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def cli(*args: str, blocked: tuple[str, ...] = (), stderr=subprocess.PIPE, cwd=None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    """``collectives ARGS`` in a fresh interpreter, where importing ``blocked`` modules fails
    as if they were not installed."""
    code = ("import sys\n"
            f"for name in {list(blocked)!r}:\n"
            "    sys.modules[name] = None  # import raises ModuleNotFoundError\n"
            "from collectives.tools.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                          stderr=stderr, text=True, timeout=timeout, cwd=cwd)


def rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


def in_terminal(*args: str, blocked: tuple[str, ...] = ()) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal (as in an interactive shell); returns the exit
    status, stdout and what the terminal showed."""
    master, slave = pty.openpty()
    shown: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc = cli(*args, blocked=blocked, stderr=slave)
    finally:
        os.close(slave)
    reader.join(timeout=10)
    os.close(master)
    return proc.returncode, proc.stdout, b"".join(shown).decode(errors="replace")


# --- version and packaging ------------------------------------------------------------------------

def test_version_is_defined_once():
    proc = cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"collectives {collectives.__version__}"
    # pyproject takes the version from the package: the installed metadata agrees with it
    assert importlib.metadata.version(DIST) == collectives.__version__
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]


def test_wheel_holds_py_typed_and_the_package_version(tmp_path):
    """Build a wheel from a copy of the sources: py.typed ships, the version and the
    distribution name are the ones the package and pyproject give."""
    src = tmp_path / "src"
    for name in ("collectives", "backends", "adapters"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                           str(tmp_path / "dist"), str(src)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "collectives/py.typed" in names
    assert "collectives/backends/mpi/__init__.py" in names and "collectives/tools/reference.py" in names
    headers = dict(line.split(": ", 1) for line in metadata.split("\n\n")[0].splitlines()
                   if ": " in line)
    assert headers["Name"] == DIST and headers["Version"] == collectives.__version__
    # no transport that does not exist yet
    assert "nccl" not in headers["Summary"].lower() and "cuda" not in headers["Summary"].lower()
    extras = [line.split(": ")[1] for line in metadata.splitlines()
              if line.startswith("Provides-Extra")]
    assert {"bench", "mpi", "docs", "test", "cuda", "cuda12", "cuda13"} <= set(extras)
    # the GPU backends ship; their CUDA wheels come only with the cuda extra
    assert {"collectives/backends/cupy/__init__.py", "collectives/backends/nccl/__init__.py"
            } <= set(names)
    # CuPy 14 at least (13's NCCL unique ids are tuples of signed chars); "cuda" is cuda12
    assert 'Requires-Dist: cupy-cuda12x>=14; extra == "cuda12"' in metadata
    assert 'Requires-Dist: cupy-cuda13x>=14; extra == "cuda13"' in metadata
    assert 'Requires-Dist: nvidia-nccl-cu13>=2.27; extra == "cuda13"' in metadata
    assert f'Requires-Dist: {DIST}[cuda12]; extra == "cuda"' in metadata
    assert 'Requires-Dist: ml_dtypes>=0.3; extra == "bench"' in metadata  # -d bfloat16 works


# --- help and argument errors ---------------------------------------------------------------------

@pytest.mark.parametrize("args", [("--help",), ("bench", "--help"), ("draw", "--help")])
def test_help_is_plain_text(args):
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "``" not in text and ":func:" not in text  # no reST markup
    assert text.count("usage: collectives") == 1
    if args == ("--help",):
        for expected in ("bench", "draw", "examples:", "collectives bench -n 4", "--version"):
            assert expected in text
        # the description is whole: every paragraph of it is printed, none cut mid-sentence
        assert "prove it correct" in text and "lists a command's options." in text


@pytest.mark.parametrize("command", ["draw ring", "bench"])
@pytest.mark.parametrize("count", ["0", "-2", "two"])
def test_participant_count_errors_are_one_argparse_line(command, count):
    proc = cli(*command.split(), "-n", count)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith(f"collectives {command.split()[0]}: error: argument -n/--participants")
    assert ("must be at least 1" in error) if count != "two" else ("not an integer" in error)


def test_draw_still_draws_and_proves():
    proc = cli("draw", "ring", "-n", "3")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("ring: all_reduce over 3 participants, 4 rounds")
    assert sum(line.startswith("  round ") for line in lines) == 4
    assert lines[-1].startswith("checked: ")


# --- progress -------------------------------------------------------------------------------------

def test_plain_progress_in_a_terminal_without_rich():
    status, stdout, shown = in_terminal("bench", *FAST, blocked=("rich",))
    assert status == 0, shown
    assert "Traceback" not in shown
    assert "[1/2] 64 B auto" in shown and "[2/2] 128 B auto" in shown
    assert len(rows(stdout)) == 2  # the table still goes to stdout


def test_rich_progress_in_a_terminal():
    pytest.importorskip("rich")
    status, stdout, shown = in_terminal("bench", *FAST)
    assert status == 0, shown
    assert "Traceback" not in shown and len(rows(stdout)) == 2


# --- --plot ---------------------------------------------------------------------------------------

def test_plot_alone_writes_a_default_file(tmp_path):
    pytest.importorskip("matplotlib")
    proc = cli("bench", "-c", "all_gather", *FAST, "--plot", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    png = tmp_path / "all_gather_busbw.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "# Plot              : all_gather_busbw.png" in proc.stdout


def test_plot_without_matplotlib_fails_before_the_sweep(tmp_path):
    proc = cli("bench", *FAST, "--plot", "out.png", blocked=("matplotlib",), cwd=tmp_path)
    assert proc.returncode == 2
    assert "--plot needs matplotlib" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "out.png").exists()  # nothing was measured


# --- MPI through the backend registry -------------------------------------------------------------

def test_the_core_imports_no_transport():
    for path in sorted((ROOT / "collectives").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] in ("mpi4py", "cupy", "nccl") for n in names), path
    code = ("import sys, collectives, collectives.tools.cli, collectives.tools.bench, "
            "collectives.tools.reference\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mpi4py'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


def test_mpi_mode_without_mpi4py_says_what_to_install():
    proc = cli("bench", "--mode", "mpi", *FAST, blocked=("mpi4py",))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--mode mpi needs mpi4py" in proc.stderr and "pip install -e '.[mpi]'" in proc.stderr


@pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the mpich wheel's mpiexec beside this Python "
                                                 "(pip install -e '.[mpi]')")
def test_mpi_mode_prints_what_ran_from_rank_0():
    proc = subprocess.run(
        [str(MPIEXEC), "-n", "2", sys.executable, "-m", "collectives.tools.cli", "bench", "--mode", "mpi",
         "-b", "4K", "-e", "4K", "-a", "auto,ring,tree", "-w", "1", "-i", "2", "-r", "1"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = rows(proc.stdout)
    # request, algorithm (what ran: MPI's own Allreduce for a small auto all-reduce)
    assert [(r[4], r[5]) for r in table] == [("auto", "native"), ("ring", "ring"), ("tree", "tree")]
    assert all(r[9] == "0" and r[13] == "0" for r in table)  # #wrong out of place and in place
    assert "participants 2" in proc.stdout
