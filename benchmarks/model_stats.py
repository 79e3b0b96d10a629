"""Intervals for ``model_check.py``: which cells the noise lets us judge, and how.

Every method of a cell is timed in the same interleaved repeats, so a repeat is one draw of
every method at one moment. A paired bootstrap resamples repeats (all methods of a repeat
together) and recomputes each method's median; from those come, per cell,

* the pick's ratio: the median of the method the model picked over the least median among
  the candidates, with its interval: the cell counts as **picked within 10%** where the
  interval's top is at most 1.10, **missed** where its bottom is above 1.10, and is
  **unresolved** otherwise (the noise does not tell);
* the prediction error: the median over the schedules of ``|predicted / median - 1|``, with
  its interval, judged against ``ERROR_MARK`` the same way;
* against the transport's own collective (``versus_native``): the pick's median over
  ``native``'s, with its interval: **slower** than native by more than 10% only where the
  interval's bottom is above 1.10, **not slower** where its top is at most 1.10.
"""

from __future__ import annotations

import numpy as np

LEVEL = 0.90       # the intervals' coverage
DRAWS = 2000       # bootstrap resamples
WITHIN = 1.10      # "picked within 10%"
ERROR_MARK = 0.20  # the target for the prediction error


def _draws(times: dict, names: list[str], draws: int, seed: int) -> np.ndarray:
    """Per resample, each name's median over resampled repeats: shape (draws, len(names))."""
    rows = np.array([times[n] for n in names], dtype=float)  # (names, repeats)
    repeats = rows.shape[1]
    pick = np.random.default_rng(seed).integers(0, repeats, size=(draws, repeats))
    return np.median(rows[:, pick], axis=2).T


def _interval(values: np.ndarray) -> tuple[float, float]:
    lo, hi = np.quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(lo), float(hi)


def verdict(lo: float, hi: float, mark: float) -> str:
    """``"yes"`` (the interval lies at or below ``mark``), ``"no"`` (above it), or
    ``"unresolved"``."""
    return "yes" if hi <= mark else "no" if lo > mark else "unresolved"


def judge(times: dict, predicted: dict, pick: str, seed: int = 0,
          draws: int = DRAWS) -> dict:
    """The cell's verdicts: ``times`` each method's repeats (equal counts, interleaved),
    ``predicted`` the model's seconds per candidate, ``pick`` the model's choice."""
    candidates = [n for n in predicted if n in times]
    if pick not in candidates:
        candidates.append(pick)
    schedules = [n for n in candidates if n in predicted and not measured_native(n)]
    boot = _draws(times, candidates, draws, seed)
    col = {n: i for i, n in enumerate(candidates)}
    medians = {n: float(np.median(times[n])) for n in candidates}
    best = boot[:, [col[n] for n in candidates]].min(axis=1)
    ratio = boot[:, col[pick]] / best
    lo, hi = _interval(ratio)
    point = medians[pick] / min(medians[n] for n in candidates)
    out = {"ratio": point, "ratio_interval": (lo, hi), "picked": verdict(lo, hi, WITHIN),
           "repeats": len(times[pick]),
           "best": min(candidates, key=medians.get)}
    if schedules:
        guesses = np.array([predicted[n] for n in schedules])
        errors = np.abs(guesses / boot[:, [col[n] for n in schedules]] - 1)
        cell = np.median(errors, axis=1)
        elo, ehi = _interval(cell)
        point_err = float(np.median([abs(predicted[n] / medians[n] - 1) for n in schedules]))
        out.update(error=point_err, error_interval=(elo, ehi),
                   error_verdict=verdict(elo, ehi, ERROR_MARK))
    return out


def versus_native(times: dict, pick: str, seed: int = 0, draws: int = DRAWS) -> dict:
    """The pick's median over ``native``'s (the same paired bootstrap), its interval and
    verdict: ``"yes"`` (not more than 10% slower), ``"no"`` (slower), ``"unresolved"``;
    empty where native was not timed."""
    if "native" not in times or pick not in times:
        return {}
    boot = _draws(times, [pick, "native"], draws, seed)
    lo, hi = _interval(boot[:, 0] / boot[:, 1])
    return {"native_ratio": float(np.median(times[pick]) / np.median(times["native"])),
            "native_interval": (lo, hi), "native_verdict": verdict(lo, hi, WITHIN)}


def measured_native(name: str) -> bool:
    """The transport's own methods ("native", "shm"): their prediction is calibration's own
    timing, not the model's."""
    return name in ("native", "shm")


def summarize(cells: list[dict], small_below: int = 1 << 20) -> dict:
    """The counts over ``cells`` (``judge``'s dicts with ``"nbytes"``): resolved, picked
    within 10%, missed; the prediction error's verdicts and medians, from 1 MiB up and
    below."""
    picked = [c["picked"] for c in cells]
    resolved = [v for v in picked if v != "unresolved"]
    against = [c["native_verdict"] for c in cells if "native_verdict" in c]
    out = {"cells": len(cells), "resolved": len(resolved), "within": picked.count("yes"),
           "missed": picked.count("no"), "native_cells": len(against),
           "native_within": against.count("yes"), "native_slower": against.count("no")}
    for part, keep in (("large", lambda c: c["nbytes"] >= small_below),
                       ("small", lambda c: c["nbytes"] < small_below)):
        chosen = [c for c in cells if keep(c) and "error" in c]
        judged = [c for c in chosen if c["error_verdict"] != "unresolved"]
        out[part] = {
            "cells": len(chosen), "resolved": len(judged),
            "within_mark": sum(c["error_verdict"] == "yes" for c in judged),
            "median_error": float(np.median([c["error"] for c in chosen])) if chosen else None,
            "median_error_resolved": (float(np.median([c["error"] for c in judged]))
                                      if judged else None)}
    return out
