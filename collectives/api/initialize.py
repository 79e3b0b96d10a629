"""``collectives.init()``: the communicator of this process, whatever launched it.

``init("auto")`` is MPI when the launcher's environment says this process is one of several
MPI ranks (the variables of MPICH/Hydra's PMI, PMIx and Open MPI, read without initialising
MPI), else one local rank. Calling it again returns the same communicator.

Backends whose ranks are processes check that every rank runs the same version of the library
(``collectives.version.check_versions``) with their own means, before the communicator exists, so that the
program's first call is call 1 in every message about it. Such a backend's ``init`` takes
``agreed_settings=``, a function whose settings (here: the calibration) every rank must hold
alike; where one rank's differ or are bad, every rank raises, before the communicator exists.
A backend whose ``init`` has no such parameter is taken to have one process (the embedded
one); a backend of several processes must take it, or ranks that ask for calibration
differently wait for one another forever.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..extras import install_line
from ..hints import Calibrate
from ..registry import load_backend

if TYPE_CHECKING:
    from .communicator import Communicator

logger = logging.getLogger("collectives")

# The job size as MPI launchers give it to every rank they start: MPICH's Hydra (PMI), PMIx,
# Open MPI. A batch system's own variables (SLURM_NTASKS, ...) are not enough: a job step may
# run one plain Python process.
LAUNCHER_SIZE = ("PMI_SIZE", "PMIX_SIZE", "OMPI_COMM_WORLD_SIZE", "OMPI_UNIVERSE_SIZE")

ENV_CALIBRATE = "COLLECTIVES_CALIBRATE"  # "1", "cached" or "fresh": init(calibrate=...)

_ACTIVE: dict[str, Any] = {}


def launched_by_mpi(env: Mapping[str, str] | None = None) -> bool:
    """Whether a launcher started this process as one of several MPI ranks."""
    env = os.environ if env is None else env
    for name in LAUNCHER_SIZE:
        text = env.get(name, "").strip()
        if text.isdigit() and int(text) > 1:
            return True
    return False


def init(backend: str = "auto", *, calibrate: Calibrate = None,
         **options: Any) -> Communicator:
    """The communicator of this process, whatever launched it.

    Idempotent per backend: a second call returns the first communicator (with other
    ``options`` it raises ValueError rather than ignore them).

    Parameters
    ----------
    backend
        ``"auto"`` (MPI under an MPI launcher, else one local rank; said at info level),
        ``"mpi"``, ``"local"`` (one rank), or another installed backend (``"nccl"``).
    calibrate
        Measure the cost model's constants for ``auto`` on this job: True (from the cache
        of this host set when there, else measured, a few seconds, and cached),
        ``"cached"`` (only from the cache) or ``"fresh"`` (measured again); None:
        ``$COLLECTIVES_CALIBRATE``, else off. The measurement runs on a communicator of its
        own, so the returned one's calls count from the first.
    **options
        For the backend's ``init``: ``timeout=``, ``check=``, ...

    Returns
    -------
    Communicator
        This process's rank among all of the launch's.

    Raises
    ------
    ValueError
        ``backend`` names no installed backend (the message suggests the nearest), or
        ``calibrate`` is none of the above.
    ImportError
        The backend needs a package that is not installed (the message names the
        ``pip install``).
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a name such as 'auto', 'mpi' or 'local', not "
                        f"{type(backend).__name__}")
    name = backend.strip().lower()
    if name == "auto":
        if launched_by_mpi():
            name = "mpi"
            logger.info("collectives.init: an MPI launcher started this process; using MPI")
        else:
            logger.info("collectives.init: no MPI launcher in the environment; one local rank")
            name = "local"
    if name in _ACTIVE:
        first, first_options = _ACTIVE[name]
        if options != first_options:  # (returning the first one would ignore them quietly)
            raise ValueError(f"collectives.init({name!r}) already made this process's "
                             f"communicator with {_spelled(first_options)}; pass the same "
                             f"options, or call collectives.load_backend({name!r}).init("
                             f"{_spelled(options)}) for another communicator")
        return first
    try:
        module = load_backend(name)
    except ValueError:
        from difflib import get_close_matches
        from importlib.metadata import entry_points

        known = sorted({ep.name for ep in entry_points(group="collectives.backends")} | {"local"})
        hint = get_close_matches(name, known, n=1)
        maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ValueError(f"backend={backend!r} is not installed{maybe}; installed: "
                         f"{', '.join(known)}, or 'auto'") from None
    except ImportError as exc:
        extra = {"mpi": "mpi", "cupy": "cuda", "nccl": "cuda,mpi"}.get(name)
        how = f": {install_line(extra)}" if extra else ""
        raise ImportError(f"backend={backend!r} needs a package that is missing ({exc}){how}"
                          ) from None
    if not callable(getattr(module, "init", None)):  # (the multi-device backends: cupy)
        raise ValueError(
            f"backend={backend!r} makes no communicator: it runs the multi-device calls on "
            "its arrays (collectives.all_reduce([x0, x1, ...])); for one rank per GPU use "
            "init('nccl')" if name == "cupy" else
            f"backend={backend!r} makes no communicator (its module has no init())")
    from .calibration import apply, mode_of

    setting = calibrate if calibrate is not None else os.environ.get(ENV_CALIBRATE, "")

    def agreed_settings() -> dict[str, str]:
        return {f"calibrate= or ${ENV_CALIBRATE}": mode_of(setting) or "off"}

    # (calibration runs collective calls: where some ranks asked for it and others did not,
    # or spelled "off" as "0" that calibrated, those that did waited for the others forever)
    if "agreed_settings" in inspect.signature(module.init).parameters:
        comm = module.init(**options, agreed_settings=agreed_settings)
    else:  # (one process: nobody to agree with)
        agreed_settings()
        comm = module.init(**options)
    mode = mode_of(setting)
    if mode:
        scratch = module.init(**options)  # its calls, not the user's, measure
        try:
            comm.fabric = apply(scratch, mode)
        finally:
            scratch.free()
    _ACTIVE[name] = comm, options
    return comm


def _spelled(options: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in options.items()) or "no options"
