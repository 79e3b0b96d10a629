"""The path of one call through the house, recorded with ``sys.setprofile``: once a
multi-device call reaches the runtime that runs it (``collectives.runtime.execute``), it never
goes back into the API wing (``collectives.api``), and its arrays are checked once
(``same_layout``, the check every multi-device call over a list of arrays makes of them;
broadcast, of one array, reads it once with ``as_array`` and checks each ``out`` once).

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


def _check(entered: list[tuple[str, str]], reached_at: str = RUNS,
           checks: dict[str, int] | None = None) -> None:
    """The call reached ``reached_at`` (a module prefix) and never went back into the API
    wing after it; each check of ``collectives.runtime.validate`` in ``checks`` (by default
    ``same_layout``, once) ran exactly that many times."""
    reached = next((i for i, (module, _) in enumerate(entered)
                    if module.startswith(reached_at)), None)
    assert reached is not None, f"the call never reached {reached_at}"
    back = [f"{m}.{f}" for m, f in entered[reached:] if m.startswith("collectives.api")]
    assert not back, f"after {entered[reached]} the call went back into the API wing: {back[:5]}"
    for name, times in (checks or {"same_layout": 1}).items():
        made = [f for m, f in entered if m == "collectives.runtime.validate" and f == name]
        assert len(made) == times, f"{name} ran {len(made)} times, not {times}"


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


def _moves(arrays, values: list, algorithm: str) -> None:
    """Broadcast, all-gather and reduce-scatter of ``values`` (one per device), each checked
    with ``_check``. Broadcast checks no list of arrays (no ``same_layout``): its value is
    read once (``as_array``) and each ``out`` array checked once (``check_out``)."""
    n = len(values)
    out = [arrays.empty_like(values[0]) for _ in range(n)]
    collectives.broadcast(values[0], n, algorithm, out=out)  # (imports and caches warm)
    _check(_walk(lambda: collectives.broadcast(values[0], n, algorithm, out=out)),
           checks={"as_array": 1, "check_out": n, "same_layout": 0})
    _check(_walk(lambda: collectives.broadcast(values[0], n, algorithm)),
           checks={"as_array": 1, "check_out": 0, "same_layout": 0})
    _check(_walk(lambda: collectives.all_gather(values, 0, algorithm)))
    _check(_walk(lambda: collectives.reduce_scatter(values, "sum", algorithm)))


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("algorithm", ["ring", "one_device", "auto"])
def test_numpy_multi_device_moves_run_without_climbing_back(n, algorithm):
    _moves(np, [np.full(1009, float(d), np.float32) for d in range(n)], algorithm)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is None,
                    reason="CuPy is not installed (nor the NumPy stand-in for it)")
@pytest.mark.parametrize("algorithm", ["ring", "one_device"])
def test_cupy_multi_device_moves_are_checked_once_by_the_backend(algorithm):
    """Broadcast, all-gather and reduce-scatter over CuPy arrays the library's algorithms run:
    the backend checks them and hands them to the runtime's forms, never to the core's API."""
    from collectives.backends.cupy.probe import GpuUnavailableError, require_gpu

    try:
        require_gpu()
    except (ImportError, GpuUnavailableError) as exc:
        pytest.skip(str(exc))
    import cupy

    _moves(cupy, [cupy.full(1009, float(d), cupy.float32) for d in range(3)], algorithm)
