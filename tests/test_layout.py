"""The layout holds: the core's wings import only downward, backends and adapters only the
public and runtime interfaces, no module imports itself back through a circle, no private
name is read outside the module that defines it, every module says its one job in under 400
lines, and pyproject installs every package.

The wings, from the bottom: the base (``collectives.errors``, ``ops``, ``arrays``, ...) <-
``collectives.algorithms`` (what moves where) <- ``collectives.runtime`` (how one call runs)
<- ``collectives.api`` (what users call) <- ``collectives`` itself (the public names) <-
``collectives.tools`` (bench, draw). Backends and adapters build on the public names and
the wings under the API. Every import counts, those inside functions too (a late import is
still an arrow), except those under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
# where each installed package's sources sit in the checkout
SOURCES = {"collectives": ROOT / "collectives", "collectives.backends": ROOT / "backends",
           "collectives.adapters": ROOT / "adapters"}
BASE = {"collectives.errors", "collectives.ops", "collectives.arrays", "collectives.kernels",
        "collectives.compression", "collectives.widened", "collectives.overlap",
        "collectives.foreign", "collectives.foreign_calls", "collectives.array_kinds",
        "collectives.log",
        "collectives.registry", "collectives.version", "collectives.extras", "collectives.hints",
        "collectives.result_pool", "collectives.timeline", "collectives.output_path"}
ORDER = ["base", "algorithms", "runtime", "api", "public", "tools"]
# what each wing may import besides itself
ALLOWED = {wing: set(ORDER[:i]) for i, wing in enumerate(ORDER)}
ALLOWED["backends"] = {"base", "algorithms", "runtime", "public"}
ALLOWED["adapters"] = {"base", "algorithms", "runtime", "public", "backends"}
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by its dotted name."""
    found = {}
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            if package == "collectives" and name.startswith(("collectives.backends",
                                                              "collectives.adapters")):
                continue
            found[name] = path
    return found


MODULES = _modules()
with open(ROOT / "pyproject.toml", "rb") as _f:
    # compiled modules: leaves that import nothing of the package
    EXTENSIONS = {e["name"] for e in tomllib.load(_f)["tool"]["setuptools"].get("ext-modules", [])}


def wing(module: str) -> str:
    if module == "collectives":
        return "public"
    if module in BASE or module.startswith("collectives.timeline."):  # the timeline, whole
        return "base"
    for name in ("backends", "adapters", "algorithms", "runtime", "api", "tools"):
        if module == f"collectives.{name}" or module.startswith(f"collectives.{name}."):
            return name
    raise AssertionError(f"{module} belongs to no wing: put it in one (or add it to BASE, "
                         "the few modules every wing shares)")


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Ids of the import nodes under ``if TYPE_CHECKING:`` (never executed)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def imports(module: str) -> list[tuple[int, str]]:
    """(line, imported module of the package) for every import in ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # ``from X import y`` imports module X.y where y is one, else X
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names if f"{base}.{a.name}" not in EXTENSIONS]
        else:
            continue
        for target in targets:
            while target and target not in MODULES and "." in target:
                target = target.rpartition(".")[0]  # an attribute path: its module
            if target in MODULES and target != module:
                found.append((node.lineno, target))
    return found


def test_every_module_belongs_to_a_wing():
    assert "collectives.api.communicator" in MODULES and "collectives.backends.mpi" in MODULES
    for module in MODULES:
        wing(module)


def test_wings_import_only_downward():
    """A module imports its own wing and the wings below it; backends and adapters the public
    names and the wings under the API (never its modules, nor the tools)."""
    upward = []
    for module in MODULES:
        mine = wing(module)
        for line, target in imports(module):
            theirs = wing(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                upward.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} ({mine}) "
                              f"imports {target} ({theirs})")
    assert not upward, "imports across wings the wrong way:\n" + "\n".join(upward)


def test_no_import_circles():
    """No module imports itself back, through any chain of imports (late ones included)."""
    graph = {m: sorted({t for _, t in imports(m)}) for m in MODULES}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert not circles, f"modules that import each other: {circles}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_says_its_job_in_under_400_lines(module):
    path = MODULES[module]
    text = path.read_text()
    assert ast.get_docstring(ast.parse(text)), f"{path.relative_to(ROOT)} opens with no docstring"
    lines = text.count("\n")
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES})"


def test_no_private_name_is_shared_across_modules():
    """A private name (``_x``) that one module defines, as a function, method or attribute, is
    read as an attribute only in that module: what a class's files share goes through public,
    documented names (a Communicator split over several files once shared ``_start``,
    ``_call`` and ``_engine``). By name, so a private name defined in two modules may be read
    in either."""
    defined: dict[str, set[str]] = {}
    read: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name, store = node.name, True
            elif isinstance(node, ast.Attribute):
                name, store = node.attr, isinstance(node.ctx, ast.Store)
            else:
                continue
            if name.startswith("_") and not name.startswith("__"):
                (defined if store else read).setdefault(name, set()).add(module)
    shared = [f"{name}: defined in {sorted(defined[name])}, read in {sorted(where - defined[name])}"
              for name, where in sorted(read.items())
              if name in defined and where - defined[name]]
    assert not shared, "private names read outside their module:\n" + "\n".join(shared)


def test_pyproject_installs_every_package():
    with open(ROOT / "pyproject.toml", "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    packages = {m for m, path in MODULES.items() if path.name == "__init__.py"}
    assert listed == packages, (f"pyproject.toml's packages lack {sorted(packages - listed)} "
                                f"and list {sorted(listed - packages)} that do not exist")


def test_dir_shows_the_public_names_only():
    import collectives

    shown = {name for name in dir(collectives) if not name.startswith("_")}
    assert shown == set(collectives.__all__) | {"adapters", "algorithms", "backends", "errors",
                                                "timeline"}
    assert "runtime" not in shown and "api" not in shown  # the wings are not the public API
