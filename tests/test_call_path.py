"""The path of one call through the house, recorded with ``sys.setprofile``: once a
multi-device call reaches the runtime that runs it (``collectives.runtime.execute``), it never
goes back into the API wing (``collectives.api``), and its arrays are checked once
(``same_layout``, the check every multi-device reduction makes of its arrays).

Shared checking helpers the API calls (``collectives.runtime.validate``) are not the runtime
that runs a call: the API asks them, then hands the checked call on. Run over NumPy arrays
here, and over CuPy arrays where CuPy (or the NumPy stand-in for it) is importable."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

import collectives

RUNS = "collectives.runtime.execute"


def _walk(call) -> list[tuple[str, str]]:
    """Every function of the library that ``call()`` enters, in order: (module, name)."""
    entered: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.startswith("collectives"):
                entered.append((module, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return entered


def _check(entered: list[tuple[str, str]]) -> None:
    reached = next((i for i, (module, _) in enumerate(entered) if module.startswith(RUNS)), None)
    assert reached is not None, "the call never reached the runtime that runs it"
    back = [f"{m}.{f}" for m, f in entered[reached:] if m.startswith("collectives.api")]
    assert not back, f"after {entered[reached]} the call went back into the API wing: {back[:5]}"
    checks = [f for m, f in entered if m == "collectives.runtime.validate" and f == "same_layout"]
    assert len(checks) == 1, f"the arrays were checked {len(checks)} times"


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("algorithm", ["ring", "one_device", "auto"])
def test_a_numpy_multi_device_reduction_runs_without_climbing_back(n, algorithm):
    values = [np.full(1009, float(d), np.float32) for d in range(n)]
    collectives.all_reduce(values, "sum", algorithm)  # (imports and caches warm)
    _check(_walk(lambda: collectives.all_reduce(values, "sum", algorithm)))
    _check(_walk(lambda: collectives.reduce(values, "max", 0, algorithm)))


@pytest.mark.skipif(importlib.util.find_spec("cupy") is None,
                    reason="CuPy is not installed (nor the NumPy stand-in for it)")
@pytest.mark.parametrize("algorithm", ["ring", "one_device"])
def test_a_cupy_multi_device_reduction_is_checked_once_by_the_backend(algorithm):
    """The CuPy backend checks the arrays and, where NCCL does not run the call, hands it to
    the runtime directly (it checked them once: the core does not check them again)."""
    from collectives.backends.cupy.probe import GpuUnavailableError, require_gpu

    try:
        require_gpu()
    except (ImportError, GpuUnavailableError) as exc:
        pytest.skip(str(exc))
    import cupy

    values = [cupy.full(1009, float(d), cupy.float32) for d in range(3)]
    collectives.all_reduce(values, "sum", algorithm)
    _check(_walk(lambda: collectives.all_reduce(values, "sum", algorithm)))
    _check(_walk(lambda: collectives.reduce(values, "sum", 0, algorithm)))
