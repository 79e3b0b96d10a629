"""The optional dependencies: the exact ``pip install`` that brings each one, and importing
one with a one-line error naming that install where it is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

DISTRIBUTION = "collective-schedules"  # PyPI's "collectives" is another project


def install_line(*extras: str) -> str:
    """The command that installs the library with ``extras``, as a user types it.

    Parameters
    ----------
    *extras
        Names of the extras ("mpi", "bench", ...); none gives the core alone.

    Returns
    -------
    str
        For example ``pip install 'collective-schedules[mpi]'``.
    """
    if not extras:
        return f"pip install {DISTRIBUTION}"
    return f"pip install '{DISTRIBUTION}[{','.join(extras)}]'"


class MissingDependencyError(ModuleNotFoundError):
    """An optional package is not installed; the message names the ``pip install`` that
    brings it (a ``ModuleNotFoundError``, so ``except ImportError`` still catches it)."""


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module``, an optional dependency that extra ``extra`` installs.

    Parameters
    ----------
    module
        The module to import ("mpi4py", "tensorflow", "matplotlib.pyplot").
    extra
        The extra of this distribution that installs it.
    purpose
        What needs it, to start the message ("the MPI transport").

    Returns
    -------
    types.ModuleType
        The imported module.

    Raises
    ------
    MissingDependencyError
        Where the package is not installed: one line naming the ``pip install``.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.partition(".")[0]
        if exc.name is not None and exc.name.partition(".")[0] != top:
            raise  # something the package itself imports is missing: its own message
        raise MissingDependencyError(f"{purpose} needs {top}, which is not installed: "
                                     f"{install_line(extra)}", name=top) from None
