"""The bench's check: how many output elements differ from the exact expected ones.

The expected outputs come from each collective's record (``run.expected_outputs``); they are
exact (``collectives.tools.reference``), so any difference is a wrong element.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def count_wrong(outputs: Sequence, expected: Sequence, buffers: Sequence | None = None) -> int:
    """Elements of ``outputs`` that differ from ``expected`` (participant by participant);
    with ``buffers`` (the ``out=`` buffers a call was given, one per participant), an element
    counts where it is wrong in either (a call could return right values and leave its
    ``out=`` unwritten).

    A participant whose output is missing, or of the wrong size, shape or dtype, counts all
    its expected elements as wrong; NaN never equals anything, so it counts too.
    """
    wrong = 0
    theirs = [None] * len(expected) if buffers is None else buffers
    for out, buffer, exp in zip(outputs, theirs, expected, strict=True):
        if exp is None:
            continue
        differs = np.zeros(exp.size, bool)
        for got in (out,) if buffer is None else (out, buffer):
            mask = _differs(got, exp)
            if mask is None:  # (all of it wrong)
                differs[:] = True
                break
            differs |= mask
        wrong += int(np.count_nonzero(differs))
    return wrong


def _differs(out, exp: np.ndarray) -> np.ndarray | None:
    """Which elements of ``out`` differ from ``exp`` (flat), or None where ``out`` is missing
    or of the wrong size, shape or dtype."""
    if isinstance(out, list):  # a batch: the participant's tensors, in order
        kinds = {np.asarray(t).dtype for t in out}
        out = np.concatenate([np.ravel(t) for t in out]) if out else None
        if kinds - {exp.dtype}:
            return None
    elif out is not None and (np.shape(out) != exp.shape or out.dtype != exp.dtype):
        return None
    if out is None or np.size(out) != exp.size:
        return None
    return np.asarray(out).reshape(-1) != exp.reshape(-1)
