"""Let a Python environment import this checkout as if it were installed, without building it
(``benchmarks/gpu_run.sh`` uses it where pip cannot build: no network, an old setuptools).

    python benchmarks/gpu_checkout.py SITE_PACKAGES

writes into ``SITE_PACKAGES``: a ``.pth`` that puts the checkout on the path and installs a
finder for the packages whose folders lie beside ``collectives/`` (``collectives.backends``
is ``backends/``, ``collectives.adapters`` is ``adapters/``, as ``pyproject.toml``'s
``package-dir`` says), and a dist-info with the backends' entry points. Being a finder, it
holds whatever the working directory is (pytest and ``python -c`` put the checkout first).
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib

FINDER = '''"""The collectives checkout at {root}, as installed (written by
benchmarks/gpu_checkout.py): packages whose folders are not under collectives/."""

import importlib.abc
import importlib.util
import sys

FOLDERS = {folders!r}


class CheckoutFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        folder = FOLDERS.get(name)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            name, folder + "/__init__.py", submodule_search_locations=[folder])


sys.meta_path.insert(0, CheckoutFinder())
'''


def install(site: Path, root: Path) -> Path:
    """Write the finder, the ``.pth`` and the dist-info into ``site``; the dist-info's path."""
    project = tomllib.loads((root / "pyproject.toml").read_text())
    folders = {package: str(root / folder) for package, folder
               in project["tool"]["setuptools"]["package-dir"].items()
               if package != "collectives"}
    (site / "collectives_checkout.py").write_text(FINDER.format(root=root, folders=folders))
    (site / "collectives_checkout.pth").write_text(f"{root}\nimport collectives_checkout\n")
    version = next(line.split('"')[1] for line in
                   (root / "collectives" / "version.py").read_text().splitlines()
                   if line.startswith("__version__"))
    meta = site / f"collective_schedules-{version}.dist-info"
    meta.mkdir(exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['project']['name']}\n"
                                   f"Version: {version}\n")
    (meta / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in names.items())
        + "\n" for group, names in project["project"]["entry-points"].items()))
    (meta / "INSTALLER").write_text("benchmarks/gpu_checkout.py\n")
    (meta / "RECORD").write_text("")
    return meta


if __name__ == "__main__":
    print(install(Path(sys.argv[1]), Path(__file__).resolve().parents[1]))
