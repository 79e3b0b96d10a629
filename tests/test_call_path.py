"""The path of one call through the house, recorded with ``sys.setprofile``: once a call
reaches the runtime that runs it, it never goes back into the API wing (``collectives.api``),
and its arguments are checked once.

* A multi-device call reaches ``collectives.runtime.execute``; its arrays are checked once
  (``same_layout``, the check every multi-device reduction makes of its arrays). Shared
  checking helpers the API calls (``collectives.runtime.validate``) are not the runtime that
  runs a call: the API asks them, then hands the checked call on. Run over NumPy arrays, and
  over CuPy arrays where CuPy (or the NumPy stand-in for it) is importable.
* A Communicator's call reaches ``Engine.run`` (or the hot path of a repeated all-reduce); it
  is validated once on its first call and never on a repeated one, on every rank, for every
  collective.
"""

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


# --- a Communicator's call -------------------------------------------------------------------
# Its runtime is reached at ``Engine.run`` (or the hot path of a repeated all-reduce): from
# there the engine runs the call's stages and its result record (``runtime.results``), and
# nothing goes back into the API wing. One exception, by design: a non-root of a broadcast or
# scatter learns the shape from the root's opening all-reduce, so the first call of a shape is
# chosen then (``Communicator.choose_algorithm``, the runner list of ``api.runners``).
CHOOSER = ("collectives.api.runners", "collectives.api.auto")
CHOOSER_FUNCTIONS = {("collectives.api.communicator", "choose_algorithm")}


def _spmd_calls(comm, x):
    out = np.empty_like(x)
    rows = np.arange(comm.size * 7, dtype=np.float64).reshape(comm.size, 7)
    return {
        "all_reduce": lambda: comm.all_reduce(x, "sum", "ring"),
        "all_reduce mean, out=": lambda: comm.all_reduce(x, "mean", "auto", out=out),
        "all_reduce fp16": lambda: comm.all_reduce(x, "sum", compression="fp16"),
        "reduce": lambda: comm.reduce(x, "max", 0, "tree"),
        "broadcast": lambda: comm.broadcast(x if comm.rank == 0 else None, 0),
        "scatter": lambda: comm.scatter(rows if comm.rank == 0 else None, 0),
        "all_gather": lambda: comm.all_gather(x),
        "reduce_scatter mean": lambda: comm.reduce_scatter(x, "mean"),
        "gather": lambda: comm.gather(x, 0),
        "all_to_all": lambda: comm.all_to_all(np.ones((comm.size * 2, 3))),
    }


def _check_spmd(entered: list[tuple[str, str]], first: bool, from_root: bool) -> None:
    reached = next((i for i, (module, name) in enumerate(entered)
                    if (module, name) == ("collectives.runtime.engine", "run")
                    or module == "collectives.runtime.hot_path"), None)
    assert reached is not None, "the call never reached the engine"
    back = [(m, f) for m, f in entered[reached:] if m.startswith("collectives.api")]
    if first and from_root:
        back = [(m, f) for m, f in back
                if not (m.startswith(CHOOSER) or (m, f) in CHOOSER_FUNCTIONS)]
    assert not back, f"after {entered[reached]} the call went back into the API wing: {back[:5]}"
    validations = [f for m, f in entered
                   if m == "collectives.runtime.call_runner" and f == "_validate"]
    expected = 1 if first else 0  # (a repeated call's arguments are known: no validation)
    assert len(validations) == expected, (
        f"the call was validated {len(validations)} times, not {expected}")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_communicator_call_runs_without_climbing_back(n):
    failures: list[str] = []

    def job(comm):
        x = np.arange(comm.size * 5, dtype=np.float32)
        for what, call in _spmd_calls(comm, x).items():
            for attempt in ("first", "again"):
                entered = _walk(call)
                from_root = what in ("broadcast", "scatter") and comm.rank != 0
                try:
                    _check_spmd(entered, attempt == "first", from_root)
                except AssertionError as exc:
                    failures.append(f"rank {comm.rank}, {what} ({attempt} call): {exc}")

    collectives.run(job, n)
    assert not failures, "\n".join(failures)
