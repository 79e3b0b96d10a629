"""The documentation: every Python example in README.md and docs/ runs as written, the site
builds in strict mode (so a broken API reference fails here), every page is in the nav, every
relative link resolves, and install and launch lines work from the checkout.

Examples run one per subprocess, several at a time; the plain ones (no directive, no
environment variables of their own) each in a process forked from one that has imported NumPy
and the library (``tests/run_scripts.py --fork``), which spares each the 0.5 s of CPU those
imports take. An HTML comment on the line before a fence changes how its block runs:

* ``<!-- run: mpiexec -n 2 -->``: under the venv's ``mpiexec`` with that many ranks;
* ``<!-- run: lab -->``: from the repository root, where ``benchmarks/lab.py`` can make a lab
  of hosts (skipped with its reason elsewhere);
* ``<!-- skip: why -->``: not run (for blocks that cannot run standalone; use sparingly).

A block that imports PyTorch is skipped, saying so, where PyTorch is not installed.

PYPI.md, the package's page on PyPI, counts as a page too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "PYPI.md", *sorted((ROOT / "docs").rglob("*.md"))]
MPIEXEC = Path(sys.executable).parent / "mpiexec"
BLOCK_TIMEOUT = 300

FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
DIRECTIVE = re.compile(r"<!--\s*(run|skip):\s*(.*?)\s*-->")
RUN_MPI = re.compile(r"^mpiexec -n (\d+)$")

# Pages whose examples another test runs, with more checks than "it exits 0".
RUN_ELSEWHERE = {
    "docs/tensorflow.md": ("tests/test_tensorflow_docs.py", "test_doc_examples_run_as_written"),
}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@dataclass(frozen=True)
class Example:
    page: str
    index: int  # 1-based among the page's Python blocks
    line: int
    code: str
    directive: tuple[str, str] | None

    @property
    def id(self) -> str:
        return f"{self.page}#{self.index}"

    def command(self, script: Path) -> list[str] | None:
        """How to run it (None: skipped)."""
        if self.page in RUN_ELSEWHERE:
            return None
        if self.directive is None:
            return [sys.executable, str(script)]
        kind, value = self.directive
        if kind == "skip":
            return None
        if value == "lab":
            return [sys.executable, str(script)]
        mpi = RUN_MPI.match(value)
        assert mpi, (f"{self.id}: unknown directive 'run: {value}' (want 'run: mpiexec -n N' or "
                     "'run: lab')")
        return [str(MPIEXEC), "-n", mpi.group(1), sys.executable, str(script)]


def examples() -> list[Example]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for index, match in enumerate(FENCE.finditer(text), start=1):
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            directive = DIRECTIVE.search(before)
            found.append(Example(rel(page), index, text[:match.start()].count("\n") + 1,
                                 match.group(1), directive.groups() if directive else None))
    return found


EXAMPLES = examples()


def _prepare(example: Example, workdir: Path) -> tuple[list[str] | None, Path | str]:
    """The example's command and folder to run it from, or (None, why it is skipped)."""
    workdir.mkdir(parents=True)
    script = workdir / "example.py"
    script.write_text(example.code)
    command = example.command(script)
    if command is None:
        return None, ""
    if re.search(r"^import torch\b", example.code, re.M) and importlib.util.find_spec("torch") is None:
        return None, "needs PyTorch (pip install -e '.[torch]', as the README's test command does)"
    if command[0] == str(MPIEXEC) and not MPIEXEC.exists():
        return None, "no mpiexec beside this Python (pip install -e '.[mpi]')"
    if example.directive == ("run", "lab"):
        reason = _why_no_lab()
        if reason is not None:
            return None, reason
        return command, ROOT
    return command, workdir


def forkable(example: Example) -> bool:
    """Plain python from its own folder, and nothing it must set before importing the library
    (``os.environ``: the preloaded library would not see it)."""
    return example.directive is None and "environ" not in example.code


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


def _run(command: list[str], cwd: Path) -> tuple[int | None, str]:
    try:
        proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT, env=ENV)
    except subprocess.TimeoutExpired as exc:
        return -1, f"timed out after {BLOCK_TIMEOUT} s\n{exc.stdout or ''}{exc.stderr or ''}"
    return proc.returncode, proc.stdout + proc.stderr


def _run_forked(scripts: dict[str, Path], folder: Path) -> dict[str, tuple[int | None, str]]:
    """Each script in a process forked from one that imported NumPy and the library (two at a
    time), by id."""
    labels = {key: f"example{i}" for i, key in enumerate(scripts)}
    plan = folder / "forked.json"
    plan.write_text(json.dumps([{"label": labels[key], "script": str(path),
                                 "timeout": BLOCK_TIMEOUT} for key, path in scripts.items()]))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "run_scripts.py"), str(plan),
                           str(folder), "--fork", "2", "--preload", "numpy,collectives"],
                          cwd=folder, capture_output=True, text=True, env=ENV,
                          timeout=BLOCK_TIMEOUT * len(scripts))
    out = {}
    for key, label in labels.items():
        status = folder / f"{label}.status"
        out[key] = ((int(status.read_text()), (folder / f"{label}.out").read_text() +
                     (folder / f"{label}.err").read_text()) if status.exists() else
                    (-1, f"the process that forks the examples ended (exit {proc.returncode}) "
                         f"before this one finished:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"))
    return out


def _why_no_lab() -> str | None:
    """None where benchmarks/lab.py can make a lab of hosts here, else why not."""
    if not MPIEXEC.exists():
        return "no mpiexec beside this Python (pip install -e '.[mpi]')"
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import lab
    finally:
        sys.path.pop(0)
    return lab.available()


@pytest.fixture(scope="session")
def outcomes(tmp_path_factory) -> dict[str, tuple[int | None, str]]:
    """Every example run once, a few at a time (the machine has few cores; most examples are
    short, the TensorFlow ones are not)."""
    base = tmp_path_factory.mktemp("examples")
    results: dict[str, tuple[int | None, str]] = {}
    forked, others = {}, {}
    for e in EXAMPLES:
        command, where = _prepare(e, base / e.id.replace("/", "_").replace("#", "_"))
        if command is None:
            results[e.id] = (None, str(where))
        elif forkable(e):
            forked[e.id] = Path(command[-1])
        else:
            others[e.id] = (command, where)
    with ThreadPoolExecutor(max_workers=2) as pool:
        batch = pool.submit(_run_forked, forked, base) if forked else None
        futures = {key: pool.submit(_run, *how) for key, how in others.items()}
        results.update({key: future.result() for key, future in futures.items()})
        if batch is not None:
            results.update(batch.result())
    return {e.id: results[e.id] for e in EXAMPLES}


@pytest.mark.parametrize("example", [pytest.param(e, id=e.id) for e in EXAMPLES])
def test_example_runs_as_written(example: Example, outcomes):
    status, output = outcomes[example.id]
    if example.page in RUN_ELSEWHERE:
        pytest.skip(f"run by {'::'.join(RUN_ELSEWHERE[example.page])}")
    if status is None:
        pytest.skip(output or f"{example.id}: {example.directive[1]}")
    assert status == 0, f"{example.page}:{example.line} exited {status}\n{output[-4000:]}"


@pytest.mark.parametrize("page", sorted(RUN_ELSEWHERE))
def test_examples_run_elsewhere_still_are(page):
    test_file, name = RUN_ELSEWHERE[page]
    assert f"def {name}(" in (ROOT / test_file).read_text(), f"nothing runs the examples of {page}"


def test_examples_were_found():
    pages = {e.page for e in EXAMPLES}
    assert {"README.md", "docs/index.md", "docs/mpi.md", "docs/debugging-hangs.md",
            "docs/choosing-an-algorithm.md"} <= pages
    assert sum(1 for e in EXAMPLES if e.directive and e.directive[0] == "run") >= 3
    assert any(e.directive == ("run", "lab") for e in EXAMPLES)


# --- the site -----------------------------------------------------------------------------------

def test_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: a docstring the API reference cannot find, a bad anchor or a
    page missing from the nav is an error."""
    pytest.importorskip("mkdocstrings")
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(ROOT / "mkdocs.yml"), "-d", str(site)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    expected = {
        "api/collectives": ["collectives.all_reduce", "collectives.batch_all_reduce",
                            "collectives.ReduceOp"],
        "api/communicator": ["collectives.Communicator", "reduce_scatter", "barrier"],
        "api/errors": ["CollectiveTimeoutError", "CollectiveMismatchError"],
        "api/spec": ["parse_spec"],
        "api/packing": ["make_plan"],
        "api/backends": ["collectives.backends.mpi.init", "MPICommunicator"],
        "api/tensorflow": ["NcclAllReduce", "MultiWorkerAllReduce"],
        "api/reference": ["exact_inputs", "CollectiveRecord"],
    }
    for page, names in expected.items():
        html = (site / page / "index.html").read_text()
        for name in names:
            assert name in html, (page, name)
    backends = (site / "api/backends/index.html").read_text()
    assert "abort_on_error" in backends  # mpi.init's signature is shown
    assert 'id="backends.mpi.MPICommunicator.free"' in backends  # MPICommunicator has members
    reference = (site / "api/collectives/index.html").read_text()
    assert "Parameters:" in reference and "Returns:" in reference and "Raises:" in reference


def _tiny_site(tmp_path: Path, page: str) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of one page with this project's hooks and link rules."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(page)
    (tmp_path / "src.py").write_text("")
    (tmp_path / "mkdocs.yml").write_text(
        f"site_name: t\ntheme: mkdocs\nhooks: [{ROOT / 'mkdocs_hooks.py'}]\n"
        "validation:\n  links:\n    not_found: warn\n    anchors: warn\n"
        "    unrecognized_links: warn\n")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(tmp_path / "site")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_a_raw_sphinx_role_fails_the_strict_build(tmp_path):
    proc = _tiny_site(tmp_path, "# t\n\nSee :class:`~collectives.Communicator` here.\n")
    assert proc.returncode != 0
    assert "raw Sphinx role" in proc.stderr and ":class:`~collectives.Communicator`" in proc.stderr


def test_a_dead_link_fails_the_strict_build(tmp_path):
    proc = _tiny_site(tmp_path, "# t\n\nSee [the guide](missing.md).\n")
    assert proc.returncode != 0 and "missing.md" in proc.stderr


def test_a_source_link_becomes_its_text_without_a_repository(tmp_path):
    proc = _tiny_site(tmp_path, "# t\n\nSee [`src.py`](../src.py) and [us](#t).\n")
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "site" / "index.html").read_text()
    assert "<code>src.py</code>" in html and "../src.py" not in html


def test_source_links_point_at_the_repository_where_one_is_configured():
    sys.path.insert(0, str(ROOT))
    try:
        import mkdocs_hooks
    finally:
        sys.path.pop(0)
    repo = "https://example.org/x/collectives"
    assert mkdocs_hooks.source_link("../collectives/ops.py", "algorithms.md", repo) == (
        f"{repo}/blob/HEAD/collectives/ops.py")
    assert mkdocs_hooks.source_link("../../backends/local/", "api/transport.md", repo) == (
        f"{repo}/tree/HEAD/backends/local/")
    assert mkdocs_hooks.source_link("mpi.md#timeouts", "index.md", repo) is None
    assert mkdocs_hooks.source_link("../collectives/ops.py", "algorithms.md", None) == ""


def _nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    return [p for item in nav for p in _nav_pages(item)]


def test_every_page_is_in_the_nav():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = _nav_pages(config["nav"])
    on_disk = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    missing = sorted(set(on_disk) - set(in_nav))
    assert not missing, f"add these pages to the nav of mkdocs.yml: {missing}"
    assert sorted(in_nav) == on_disk, "the nav names pages that do not exist"


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page: Path):
    """Links between pages and to sources in the checkout point at files that exist (the
    site build checks anchors inside docs/)."""
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{rel(page)}: links to nothing: {broken}"


# --- install and launch lines -------------------------------------------------------------------

# PyPI's "collectives" is another project: an install names the distribution
# (collective-schedules) or the checkout (pip install -e '.[mpi]'), never the import name.
WRONG_INSTALL = re.compile(r"(?<![\w-])collectives\[[\w,.-]*\]"
                           r"|pip install\s+(?:-\S+\s+)*['\"]?collectives(?![\w.-]|\[)")
SOURCES = sorted(p for folder in ("collectives", "backends", "adapters", "tests", "benchmarks")
                 for p in (ROOT / folder).rglob("*.py"))
BARE_MPIEXEC = re.compile(r"(?<![\w/.$-])mpiexec\s+(?:-\S+\s+\S+\s+)*-n\b")
BARE_PYTHON = re.compile(r"mpiexec\b[^`\n]*?(?<![\w/.])python3?\b")


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


@pytest.mark.parametrize("page", PAGES + [ROOT / "pyproject.toml"], ids=rel)
def test_installs_name_the_distribution(page: Path):
    """Pages install from the checkout (pip install -e '.[mpi]') or by the distribution's
    name (pip install 'collective-schedules[mpi]')."""
    bad = [m.group(0) for m in WRONG_INSTALL.finditer(page.read_text())]
    assert not bad, f"{rel(page)}: {bad}; write pip install 'collective-schedules[EXTRAS]'"


def test_code_names_the_distribution_in_hints():
    """Docstrings, messages and skip reasons of every module say the same."""
    bad = [f"{rel(path)}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}"
           for path in SOURCES for text in [path.read_text()]
           for m in WRONG_INSTALL.finditer(text)]
    assert not bad, "\n".join(bad)


def test_the_grep_finds_the_wrong_name():
    name = "collect" + "ives"  # (spelled apart, so that this file passes its own grep)
    for wrong in (f"pip install '{name}[tensorflow]'", f"pip install {name}",
                  f'pip install -q "{name}[mpi,bench]"', f"install {name}[mpi] first"):
        assert WRONG_INSTALL.search(wrong), wrong
    for right in ("pip install 'collective-schedules[tensorflow]'", "pip install -e '.[mpi]'",
                  "pip install collective-schedules", "import collectives",
                  "pip install collectives-schedules-docs"):
        assert not WRONG_INSTALL.search(right), right


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "PYPI.md"], ids=rel)
def test_mpiexec_lines_run_the_venv(page: Path):
    """A bare ``mpiexec ... python`` runs the system's MPI and Python unless a venv is active:
    name .venv/bin/mpiexec and .venv/bin/python, or say to activate the venv."""
    bad = []
    for paragraph in _paragraphs(DIRECTIVE.sub("", page.read_text())):
        if "activate" in paragraph:
            continue
        for line in paragraph.splitlines():
            if BARE_MPIEXEC.search(line) or BARE_PYTHON.search(line):
                bad.append(line.strip())
    assert not bad, f"{rel(page)}: {bad}"


# --- the API reference's docstrings ---------------------------------------------------------------

def _documented_api() -> list[tuple[str, object]]:
    """(name, griffe function) of every public function of ``collectives`` and every method the
    Communicator page lists."""
    griffe = pytest.importorskip("griffe")
    package = griffe.load("collectives", search_paths=[str(ROOT)], docstring_parser="numpy")
    found = []
    import collectives

    for name in collectives.__all__:
        obj = package[name]
        target = obj.final_target if obj.is_alias else obj
        if target.kind.value == "function":
            found.append((f"collectives.{name}", target))
    page = (ROOT / "docs" / "api" / "communicator.md").read_text()
    listed = re.findall(r"^\s+- (\w+)$", page, re.M)
    communicator = package["Communicator"].final_target
    for name in listed:
        member = communicator.all_members[name]
        member = member.final_target if member.is_alias else member
        if member.kind.value == "function":
            found.append((f"Communicator.{name}", member))
    return found


def test_public_functions_have_numpy_sections():
    """Every public function and Communicator method says, in NumPy style, what each parameter
    is, what it returns and what it raises (where it takes, returns or raises anything)."""
    problems = []
    documented = _documented_api()
    assert len(documented) >= 35
    for name, function in documented:
        sections = {s.kind.value: s for s in function.docstring.parse("numpy")} if function.docstring else {}
        params = [p.name for p in function.parameters if p.name not in ("self", "cls")]
        if params:
            listed = sections["parameters"].value if "parameters" in sections else []
            given = {item.name for item in listed}
            missing = [p for p in params if p not in given and not any(p in g for g in given)]
            if missing:
                problems.append(f"{name}: parameters without a description: {missing}")
        if str(function.returns) not in ("None", "") and "returns" not in sections:
            problems.append(f"{name}: no Returns section")
        if name.split(".")[-1] not in ("free", "adapt", "choose_algorithm") and "raises" not in sections:
            problems.append(f"{name}: no Raises section")
    assert not problems, "\n".join(problems)


def test_ci_runs_the_readme_commands():
    """README's two commands: one sets up and runs the benchmark, one sets up and runs the
    whole suite, and .ci/run runs exactly the latter; the quick subset is named beside it."""
    readme = (ROOT / "README.md").read_text()
    setups = [line for line in readme.splitlines()
              if line.startswith("python3 -m venv --upgrade-deps .venv")]
    assert len(setups) == 2 and "collectives bench" in setups[0] and setups[1].endswith("pytest")
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.startswith("python3 -m venv")]
    assert ci == [setups[1]]
    assert '.venv/bin/python -m pytest -m "not slow"' in readme
    markers = (ROOT / "pyproject.toml").read_text()
    assert '"slow: ' in markers


def test_architecture_lists_every_module():
    """docs/architecture.md's "Every module" names each module of the package, in its folder."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = text.split("## Every module", 1)[1]
    missing = []
    for top in ("collectives", "backends", "adapters"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            folder = path.parent.relative_to(ROOT).as_posix()
            section = listed.split(f"**`{folder}/`**", 1)
            if len(section) < 2 or f"- `{path.name}`:" not in section[1].split("**`", 1)[0]:
                missing.append(path.relative_to(ROOT).as_posix())
    assert not missing, f"docs/architecture.md does not list {missing}"


DRAWN = re.compile(r"^```\n\$ collectives draw ([^\n]*)\n(.*?)^```$", re.S | re.M)


def test_every_drawn_schedule_is_what_the_command_prints(capsys):
    """docs/algorithms.md says its pictures were printed by the code: each ``$ collectives
    draw ...`` block holds that command's output, as it prints it today."""
    import shlex

    from collectives.tools.cli import main

    blocks = DRAWN.findall((ROOT / "docs" / "algorithms.md").read_text())
    assert len(blocks) >= 20
    for args, shown in blocks:
        capsys.readouterr()
        assert main(["draw", *shlex.split(args)]) in (0, None), args
        assert capsys.readouterr().out == shown, f"collectives draw {args}: run it again"
