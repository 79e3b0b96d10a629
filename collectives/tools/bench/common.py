"""What every collective's bench record shares: runners, array kits, exact results.

A record (one module per collective, as nccl-tests' ``testColl``) says what each participant
must hold after the call and how each mode calls it on preallocated buffers; this module holds
the pieces they are built from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import collectives

from .. import reference


@dataclass
class Runner:
    """One way of calling the collective on preallocated buffers: ``call()`` runs it once and
    returns this side's outputs (one per participant it holds); ``reset()`` restores what the
    timed calls overwrote, so that the checked call starts from the original inputs.
    ``out``: the buffers passed as ``out=`` (one per participant), checked beside what the
    call returns, since they are what a caller passing them reads."""

    call: Callable[[], list]
    reset: Callable[[], object]  # (what it returns is ignored)
    out: list | None = None


def zero(buffers: list) -> Callable[[], object]:
    """A reset that zero-fills ``buffers`` (outputs the timed calls wrote)."""
    return lambda: [b.fill(0) for b in buffers]


def tile(period: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Elements lo..hi of the infinite repetition of ``period``."""
    return np.resize(np.roll(period, -(lo % len(period))), hi - lo)


def cached(cache: dict, key, make: Callable[[], np.ndarray]) -> np.ndarray:
    """``cache[key]``, made once (participants share equal expected outputs)."""
    if key not in cache:
        cache[key] = make()
    return cache[key]


def reduced_period(case, cache: dict) -> np.ndarray:
    """One period of the reduction of every participant's exact input: exact inputs repeat
    every ``input_period`` elements, so their reduction does too, and any expected reduced
    range is this period tiled."""
    def make() -> np.ndarray:
        n, length = case.n, reference.input_period(case.n, case.op)
        return reference.reference(
            [reference.exact_input(n, p, length, case.dtype, case.op) for p in range(n)], case.op)

    return cached(cache, ("period", case), make)


class ArrayKit:
    """How the devices mode makes and reads the arrays of a backend: NumPy here; a GPU
    backend's ``bench_kit(n)`` returns one for its arrays, with ``api`` (the module whose
    collectives take them), ``ceiling(case, inputs)`` (a call copying n inputs into n
    outputs, which the bench times) and ``resolve(case, algorithm)`` (what the backend runs
    itself, or None for the library's choice)."""

    api = collectives

    def inputs(self, values: list) -> list:
        return values

    def zeros(self, shape, dtype, participant: int):
        return np.zeros(shape, dtype)

    def copyto(self, dst, src) -> None:
        np.copyto(dst, src)

    def host(self, x):
        return x

    def fence(self) -> None:
        """Nothing to wait for: NumPy calls finish before they return."""

    ceiling = None


NUMPY_KIT = ArrayKit()
