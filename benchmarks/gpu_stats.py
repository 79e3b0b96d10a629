"""Interleaved repeats and bootstrap intervals for the GPU peer benchmarks.

A row times several ways of doing the same work. Each repeat runs every way once, in an order
that rotates from repeat to repeat (so a slow moment of the card or the host falls on every
way alike), each as ``calls`` back-to-back calls whose clock stops after ``fence`` (the
device has finished). A ratio's interval comes from a paired bootstrap over the repeats (all
ways of a repeat resampled together), as ``model_stats.py`` does for ``model_check.py``: the
medians of the resampled repeats, their ratio, and its 5th and 95th percentiles. Every
repeat's time stays in the JSON (``repeats_us``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

LEVEL = 0.90  # the intervals' coverage
DRAWS = 2000  # bootstrap resamples
MIN_REPEATS = 7


def interleaved(ways: dict[str, Callable[[], object]], fence: Callable[[], None], repeats: int,
                calls: int, warmup: int = 2) -> dict[str, list[float]]:
    """Seconds per call of each way, one entry per repeat (see the module's docstring); a way
    that raises is dropped from later repeats, its error kept under ``"<name>_error"``."""
    repeats = max(repeats, MIN_REPEATS)
    names = list(ways)
    times: dict[str, list[float]] = {n: [] for n in names}
    errors: dict[str, str] = {}
    for name in names:
        try:
            for _ in range(warmup):
                ways[name]()
            fence()
        except Exception as exc:  # noqa: BLE001 - a way that fails is reported, not fatal
            errors[name] = f"{type(exc).__name__}: {exc}"[:300]
    live = [n for n in names if n not in errors]
    for r in range(repeats):
        for name in live[r % len(live):] + live[:r % len(live)] if live else []:
            if name in errors:
                continue
            try:
                fence()
                start = time.perf_counter()
                for _ in range(calls):
                    ways[name]()
                fence()
                times[name].append((time.perf_counter() - start) / calls)
            except Exception as exc:  # noqa: BLE001
                errors[name] = f"{type(exc).__name__}: {exc}"[:300]
    out: dict = {n: t for n, t in times.items() if n not in errors and t}
    out.update({f"{n}_error": e for n, e in errors.items()})
    return out


def with_best(times: dict, name: str, ways: list[str]) -> dict:
    """``times`` with ``name`` added: the repeats of the fastest of ``ways`` (the lowest
    median of those timed), so that a ratio to it (``auto`` over the best way) is paired
    repeat by repeat. (Not each repeat's minimum over the ways: that minimum of several noisy
    times lies below every way's own, and would make even the best way look slower.)"""
    timed = [w for w in ways if w in times]
    if not timed:
        return times
    best = min(timed, key=lambda w: float(np.median(times[w])))
    return {**times, name: list(times[best])}


def ratio(times: dict, top: str, bottom: str, seed: int = 0) -> dict | None:
    """``top``'s median over ``bottom``'s, with its paired-bootstrap interval (None where
    either was not timed)."""
    if top not in times or bottom not in times:
        return None
    a, b = np.asarray(times[top], float), np.asarray(times[bottom], float)
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    pick = np.random.default_rng(seed).integers(0, n, size=(DRAWS, n))
    boot = np.median(a[pick], axis=1) / np.median(b[pick], axis=1)
    lo, hi = np.quantile(boot, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return {"ratio": float(np.median(a) / np.median(b)), "interval": [float(lo), float(hi)],
            "repeats": n}


def row(label: dict, times: dict, ratios: list[tuple[str, str]]) -> dict:
    """A JSON row: ``label``'s fields, each way's median (``<way>_us``) and every repeat
    (``repeats_us``), errors, and each ``(top, bottom)`` ratio with its interval."""
    out = dict(label)
    out["repeats_us"] = {n: [round(t * 1e6, 3) for t in v] for n, v in times.items()
                         if not n.endswith("_error")}
    for name, values in times.items():
        if name.endswith("_error"):
            out[name] = values
        else:
            out[f"{name}_us"] = float(np.median(values)) * 1e6
    for top, bottom in ratios:
        got = ratio(times, top, bottom)
        if got is not None:
            out[f"{top}/{bottom}"] = got
    return out


def brief(r: dict) -> str:
    """One line for the log: medians and ratios with their intervals."""
    parts = [f"{k}={v}" for k, v in r.items()
             if not isinstance(v, (dict, float, list)) and not k.endswith("_error")]
    parts += [f"{k[:-3]}={v:.1f}us" for k, v in r.items() if k.endswith("_us")
              and isinstance(v, float)]
    parts += [f"{k}={v['ratio']:.2f}[{v['interval'][0]:.2f},{v['interval'][1]:.2f}]"
              for k, v in r.items() if isinstance(v, dict) and "interval" in v]
    parts += [f"{k}: {v}" for k, v in r.items() if k.endswith("_error")]
    return " ".join(parts)
