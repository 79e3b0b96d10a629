"""The ``collectives`` command as a newcomer meets it, and the package it comes in: version,
help, argument errors, progress with and without rich, ``--plot``, ``--mode mpi`` through the
backend registry, and what a built wheel holds."""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import as_text

import collectives

ROOT = Path(__file__).resolve().parent.parent
DIST = "collective-schedules"
PACKAGING = ("pyproject.toml", "README.md", "PYPI.md", "LICENSE", "MANIFEST.in")
FAST = ["-b", "64", "-e", "128", "-w", "1", "-i", "2", "-r", "2"]
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def cli_code(blocked: tuple[str, ...]) -> str:
    """``collectives ARGS``, where importing ``blocked`` modules fails as if they were not
    installed."""
    return ("import sys\n"
            f"for name in {list(blocked)!r}:\n"
            "    sys.modules[name] = None  # import raises ModuleNotFoundError\n"
            "from collectives.tools.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")


@pytest.fixture
def cli(python):
    """``collectives ARGS`` (``python -c``, see ``cli_code``) as ``python`` runs it."""
    def run(*args: str, blocked: tuple[str, ...] = (), cwd=None,
            timeout: float = 60) -> subprocess.CompletedProcess:
        return python("-c", cli_code(blocked), *args, blocked=blocked, cwd=cwd, timeout=timeout)
    return run


def rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


@pytest.fixture
def in_terminal(forks):
    """``collectives ARGS`` with stderr on a pseudo-terminal (as in an interactive shell);
    returns the exit status, stdout and what the terminal showed."""
    def run(*args: str, blocked: tuple[str, ...] = ()) -> tuple[int, str, str]:
        status, out, shown = forks.run(("-c", cli_code(blocked), *args), timeout=60, tty=True,
                                       unloaded=blocked)
        return status, as_text(out), shown.decode(errors="replace")
    return run


# --- version and packaging ------------------------------------------------------------------------

def test_version_is_defined_once(cli):
    proc = cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"collectives {collectives.__version__}"
    # pyproject takes the version from the package: the installed metadata agrees with it
    assert importlib.metadata.version(DIST) == collectives.__version__
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]


@pytest.mark.slow  # builds a wheel
def test_wheel_holds_py_typed_and_the_package_version(tmp_path):
    """Build a wheel from a copy of the sources: py.typed ships, the version and the
    distribution name are the ones the package and pyproject give. (Built with this
    environment's setuptools, and with no C compiler: the compiled kernels are optional, and
    the install that runs this suite compiled them already.)"""
    src = tmp_path / "src"
    for name in ("collectives", "backends", "adapters"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in PACKAGING:
        shutil.copy(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CC": "false"})
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
    assert 'Requires-Dist: ml_dtypes>=0.7; extra == "bench"' in metadata  # -d bfloat16 works
    # TensorFlow's CPU build, or its full build instead
    assert 'Requires-Dist: tensorflow-cpu>=2.16; extra == "tensorflow"' in metadata
    assert 'Requires-Dist: tensorflow>=2.16; extra == "tensorflow-full"' in metadata
    # who, under what licence (its full text ships), for whom
    assert headers["Author"] == "collectives authors"
    assert headers["License-Expression"] == "Apache-2.0" and headers["License-File"] == "LICENSE"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    classifiers = [line.split(": ", 1)[1] for line in metadata.splitlines()
                   if line.startswith("Classifier: ")]
    assert "Typing :: Typed" in classifiers and "Topic :: System :: Distributed Computing" in classifiers
    # PyPI's page is PYPI.md, which stands alone
    assert metadata.split("\n\n", 1)[1].strip() == (ROOT / "PYPI.md").read_text().strip()


def test_the_pypi_description_works_outside_a_checkout():
    """Its links are absolute and its installs name the distribution: nothing assumes the
    reader holds the repository."""
    text = (ROOT / "PYPI.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert all(re.match(r"https?://", link) for link in links), links
    for line in text.splitlines():
        assert ".venv/" not in line and "-e ." not in line and "-e '." not in line, line
    assert "pip install collective-schedules" in text
    assert "pip install 'collective-schedules[tensorflow-full]'" in text


@pytest.mark.slow  # builds an sdist (with this environment's setuptools)
def test_the_sdist_holds_the_package_and_not_the_tests(tmp_path):
    src = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    for name in tracked + [f for f in PACKAGING if f not in tracked]:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir",
                           str(tmp_path / "dist"), str(src)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    assert {"LICENSE", "PYPI.md", "pyproject.toml", "collectives/__init__.py",
            "backends/mpi/__init__.py", "adapters/tensorflow/__init__.py",
            "collectives/_kernels.c", "collectives/_integer_kernels.c", "collectives/_kernels.h",
            "backends/mpi/_hot.c"} <= set(names)  # what the extensions compile from
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "docs/"))]


# --- help and argument errors ---------------------------------------------------------------------

@pytest.mark.parametrize("args", [("--help",), ("bench", "--help"), ("draw", "--help"),
                                  ("probe", "--help"), ("simulate", "--help")])
def test_help_is_plain_text(args, cli):
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
        # each command is listed once, with what it does
        assert sum(line.split()[0] == "bench" for line in text.splitlines() if line.strip()) == 1
        assert sum(line.split()[0] == "draw" for line in text.splitlines() if line.strip()) == 1


def test_every_option_says_what_it_does():
    from collectives.tools.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(sub.choices) >= {"bench", "draw", "probe", "simulate", "timeline"}
    for name, command in sub.choices.items():
        bare = [a.option_strings or [a.dest] for a in command._actions if not a.help]
        assert not bare, f"collectives {name}: options without help: {bare}"


# Each: one line on stderr naming the command, exit status 2, nothing measured or printed.
BAD_INVOCATIONS = {
    "unknown option": ("bench", "--bogus"),
    "mpi outside a launch": ("bench", "--mode", "mpi"),
    "two-level without groups": ("draw", "ring/ring"),
    "sizes beyond memory": ("bench", "-b", "1T", "-e", "1T"),
    "smallest above largest": ("bench", "-b", "1T"),
    "json into no folder": ("bench", "--json", "/missing/dir/x.json"),
    "plot into no folder": ("bench", "--plot", "/missing/dir/x.png"),
    "objects": ("bench", "-c", "broadcast", "-d", "object"),
    "participants beyond memory": ("bench", "-n", "10000"),
    "an algorithm for copies": ("bench", "-c", "gather", "-a", "ring"),
    "an unknown algorithm": ("draw", "rung"),
    "probe json into no folder": ("probe", "--json", "/missing/dir/x.json"),
    # (these passed the old check, os.access's, and failed after the work, with a traceback)
    "json where no file can be made": ("bench", "--json", "/proc/x.json"),
    "json an empty path": ("bench", "--json", ""),
    "plot without a format": ("bench", "--plot", "/tmp/no-suffix"),
    "probe json into a folder": ("probe", "--json", "/tmp"),
    "simulate two-level without groups": ("simulate", "ring/ring", "-n", "8"),
    "simulate a missing fabric": ("simulate", "ring", "--fabric", "/missing/fabric.json"),
    "simulate a size that is not one": ("simulate", "ring", "-b", "lots"),
    "simulate a zero bandwidth": ("simulate", "ring", "--link", "net=5us:0GB/s"),
    "simulate hosts that do not add up": ("simulate", "ring", "-n", "16", "--nodes", "3x4"),
    "simulate two-level on one host": ("simulate", "ring/ring", "-n", "8", "--nodes", "1x8"),
    "probe into a cache it cannot write": ("probe-cache",),
    "an op for a collective without one": ("bench", "-c", "broadcast", "-o", "max"),
    "mpi's own algorithm outside mpi": ("bench", "-a", "native"),
}
LAUNCH_VARIABLES = ("PMI_SIZE", "PMI_RANK", "PMIX_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                    "OMPI_UNIVERSE_SIZE")


@pytest.mark.parametrize("args", BAD_INVOCATIONS.values(), ids=BAD_INVOCATIONS.keys())
def test_bad_invocations_fail_in_one_line_before_any_work(args, python):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    if args[:1] == ("probe-cache",):  # (a cache folder that is a file: after the probe, a
        args = ("probe", "-n", "2")  # traceback, the measurement lost)
        env["COLLECTIVES_CACHE_DIR"] = "/etc/passwd"
    proc = python("-m", "collectives.tools.cli", *args, timeout=60, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"collectives {args[0]}: error: ")
    assert lines[0].endswith(f"(see 'collectives {args[0]} --help')")


def test_unknown_option_names_the_subcommand(cli):
    proc = cli("bench", "--bogus")
    assert "collectives bench: error: unrecognized arguments: --bogus" in proc.stderr


def test_a_closed_pipe_ends_quietly():
    """``collectives draw ... | head -1``: no BrokenPipeError traceback, exit 141 as after
    SIGPIPE."""
    proc = subprocess.Popen([sys.executable, "-m", "collectives.tools.cli", "draw", "ring", "-n",
                             "64"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"ring: all_reduce over 64")
    proc.stdout.close()  # the reader goes away with ~190 KB still to come
    status = proc.wait(timeout=60)
    assert (status, proc.stderr.read()) == (141, b"")


@pytest.mark.parametrize("mode", ["devices", "spmd"])
def test_ctrl_c_ends_the_bench_in_one_line(mode):
    # (SIGINT's default action restored: a shell runs background jobs with SIGINT ignored,
    # and the child would inherit that)
    proc = subprocess.Popen([sys.executable, "-m", "collectives.tools.cli", "bench", "--mode",
                             mode, "-n", "2", "-b", "4K", "-e", "64M"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stdout:  # the first row: the sweep is under way
        if not line.startswith("#"):
            break
    proc.send_signal(signal.SIGINT)
    status = proc.wait(timeout=60)
    stderr = proc.stderr.read()
    assert status == 130, stderr
    assert stderr.strip() == "collectives bench: interrupted"


@pytest.mark.parametrize("command", ["draw ring", "bench"])
@pytest.mark.parametrize("count", ["0", "-2", "two"])
def test_participant_count_errors_are_one_argparse_line(command, count, cli):
    proc = cli(*command.split(), "-n", count)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith(f"collectives {command.split()[0]}: error: argument -n/--participants")
    assert ("must be at least 1" in error) if count != "two" else ("not an integer" in error)


def test_draw_still_draws_and_proves(cli):
    proc = cli("draw", "ring", "-n", "3")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("ring: all_reduce over 3 participants, 4 rounds")
    assert sum(line.startswith("  round ") for line in lines) == 4
    assert lines[-1].startswith("checked: ")


# --- progress -------------------------------------------------------------------------------------

def test_plain_progress_in_a_terminal_without_rich(in_terminal):
    status, stdout, shown = in_terminal("bench", *FAST, blocked=("rich",))
    assert status == 0, shown
    assert "Traceback" not in shown
    assert "[1/2] 64 B auto" in shown and "[2/2] 128 B auto" in shown
    assert len(rows(stdout)) == 2  # the table still goes to stdout


def test_rich_progress_in_a_terminal(in_terminal):
    pytest.importorskip("rich")
    status, stdout, shown = in_terminal("bench", *FAST)
    assert status == 0, shown
    assert "Traceback" not in shown and len(rows(stdout)) == 2


# --- --plot ---------------------------------------------------------------------------------------

def test_plot_alone_writes_a_default_file(tmp_path, cli):
    pytest.importorskip("matplotlib")
    proc = cli("bench", "-c", "all_gather", *FAST, "--plot", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    png = tmp_path / "all_gather_busbw.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "# Plot              : all_gather_busbw.png" in proc.stdout


def test_plot_reads_sizes_as_4K_1M_64M_and_says_what_auto_ran():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from collectives.tools.bench import command

    assert [command.human_size(b) for b in (8, 4096, 1 << 20, 64 << 20, 3 << 29)] == [
        "8", "4K", "1M", "64M", "1.5G"]
    rows = [{"algorithm": "auto", "resolved": name, "size": size, "busbw": 1.0,
             "collective": "all_reduce", "mode": "devices", "participants": 4}
            for name, size in (("rechd", 8), ("rechd", 64 << 10), ("ring", 128 << 10),
                               ("ring", 64 << 20))]
    assert command.legend_label("auto", rows) == "auto: rechd 8-64K, ring 128K-64M"
    ring = [dict(r, algorithm="ring", resolved="ring") for r in rows]
    assert command.legend_label("ring", ring) == "ring"
    figures = []
    import matplotlib.pyplot as plt

    real_close = plt.close
    plt.close = lambda fig: figures.append(fig)  # keep the figure to read its axis
    try:
        command.write_plot(os.devnull, rows + ring, "collectives bench")
    finally:
        plt.close = real_close
    (fig,) = figures
    ax = fig.axes[0]
    fig.canvas.draw()
    labels = {t.get_text() for t in ax.get_xticklabels() if t.get_text()}
    assert {"4K", "1M", "64M"} <= labels and not any("^" in t for t in labels), labels
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "auto: rechd 8-64K, ring 128K-64M", "ring"]
    real_close(fig)


def test_plot_without_matplotlib_fails_before_the_sweep(tmp_path, cli):
    proc = cli("bench", *FAST, "--plot", "out.png", blocked=("matplotlib",), cwd=tmp_path)
    assert proc.returncode == 2
    assert "--plot needs matplotlib" in proc.stderr and "Traceback" not in proc.stderr
    assert "pip install 'collective-schedules[bench]'" in proc.stderr
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


def test_mpi_mode_without_mpi4py_says_what_to_install(cli):
    proc = cli("bench", "--mode", "mpi", *FAST, blocked=("mpi4py",))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--mode mpi needs mpi4py" in proc.stderr
    assert "pip install 'collective-schedules[mpi]'" in proc.stderr


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


# --- optional packages ----------------------------------------------------------------------------

@pytest.mark.parametrize("code, missing, extra", [
    ("from collectives.backends import mpi\nmpi.init()", "mpi4py", "mpi"),
    ("import collectives\ncollectives.init('mpi')", "mpi4py", "mpi"),
    ("from collectives.adapters import tensorflow as ctf\nctf.NcclAllReduce()", "tensorflow",
     "tensorflow"),
])
def test_a_missing_optional_package_says_the_install_in_one_line(code, missing, extra, python):
    blocked = f"import sys\nsys.modules[{missing!r}] = None\n"
    proc = python("-c", blocked + code, blocked=(missing,), timeout=60)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("collectives.extras.MissingDependencyError: ")
    assert last.endswith(f"needs {missing}, which is not installed: "
                         f"pip install 'collective-schedules[{extra}]'"), last
    assert "During handling" not in proc.stderr  # no chained ModuleNotFoundError


def test_the_missing_package_error_is_an_import_error():
    from collectives.extras import MissingDependencyError, require

    with pytest.raises(ImportError, match=r"pip install 'collective-schedules\[bench\]'"):
        require("a_package_that_is_not_there", "bench", "this")
    assert issubclass(MissingDependencyError, ModuleNotFoundError)
