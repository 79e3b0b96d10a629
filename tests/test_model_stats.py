"""The intervals behind ``benchmarks/model_check.py``'s verdicts: a cell is judged only where
the noise of its interleaved repeats lets a paired bootstrap resolve the mark."""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))

import model_stats  # noqa: E402


def _repeats(center: float, spread: float, n: int, seed: int) -> list[float]:
    return list(center * (1 + spread * np.random.default_rng(seed).standard_normal(n)))


def test_a_clear_pick_a_clear_miss_and_an_open_cell():
    quiet = {"ring": _repeats(1.0, 0.01, 9, 1), "tree": _repeats(1.5, 0.01, 9, 2),
             "native": _repeats(2.0, 0.01, 9, 3)}
    predicted = {"ring": 1.0, "tree": 1.2, "native": 2.0}
    good = model_stats.judge(quiet, predicted, "ring")
    assert good["picked"] == "yes" and good["best"] == "ring"
    lo, hi = good["ratio_interval"]
    assert lo == 1.0 and hi <= model_stats.WITHIN
    bad = model_stats.judge(quiet, predicted, "tree")
    assert bad["picked"] == "no" and bad["ratio_interval"][0] > model_stats.WITHIN
    # the error: ring exact, tree 20% under its 1.5; the median over the two schedules
    assert abs(good["error"] - np.median([abs(1 / np.median(quiet["ring"]) - 1),
                                          abs(1.2 / np.median(quiet["tree"]) - 1)])) < 1e-12
    noisy = {"ring": _repeats(1.0, 0.3, 7, 4), "tree": _repeats(1.05, 0.3, 7, 5)}
    open_ = model_stats.judge(noisy, {"ring": 1.0, "tree": 1.0}, "tree")
    assert open_["picked"] == "unresolved"
    assert open_["ratio_interval"][0] <= model_stats.WITHIN < open_["ratio_interval"][1]


def test_the_summary_counts_only_resolved_cells():
    quiet = {"ring": _repeats(1.0, 0.01, 9, 1), "tree": _repeats(1.5, 0.01, 9, 2)}
    noisy = {"ring": _repeats(1.0, 0.3, 7, 4), "tree": _repeats(1.05, 0.3, 7, 5)}
    cells = [{**model_stats.judge(quiet, {"ring": 1.0, "tree": 1.5}, "ring"), "nbytes": 1 << 20},
             {**model_stats.judge(quiet, {"ring": 1.0, "tree": 1.5}, "tree"), "nbytes": 4096},
             {**model_stats.judge(noisy, {"ring": 1.0, "tree": 1.0}, "tree"), "nbytes": 4096}]
    t = model_stats.summarize(cells)
    assert (t["cells"], t["resolved"], t["within"], t["missed"]) == (3, 2, 1, 1)
    assert t["large"]["cells"] == 1 and t["small"]["cells"] == 2
    assert t["large"]["resolved"] == 1 and t["large"]["within_mark"] == 1


def test_the_pick_against_native():
    quiet = {"ring": _repeats(1.0, 0.01, 9, 1), "native": _repeats(1.5, 0.01, 9, 2),
             "tree": _repeats(2.0, 0.01, 9, 3)}
    faster = model_stats.versus_native(quiet, "ring")
    assert faster["native_verdict"] == "yes" and faster["native_interval"][1] < 1
    slower = model_stats.versus_native(quiet, "tree")
    assert slower["native_verdict"] == "no" and slower["native_interval"][0] > 1.10
    assert model_stats.versus_native(quiet, "native")["native_ratio"] == 1.0
    assert model_stats.versus_native({"ring": quiet["ring"]}, "ring") == {}
    cells = [{**model_stats.judge(quiet, {"ring": 1.0, "tree": 2.0}, pick), "nbytes": 4096,
              **model_stats.versus_native(quiet, pick)} for pick in ("ring", "tree")]
    t = model_stats.summarize(cells)
    assert (t["native_cells"], t["native_within"], t["native_slower"]) == (2, 1, 1)
