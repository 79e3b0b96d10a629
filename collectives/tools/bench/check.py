"""The bench's check: how many output elements differ from the exact expected ones.

The expected outputs come from each collective's record (``run.expected_outputs``); they are
exact (``collectives.tools.reference``), so any difference is a wrong element.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def count_wrong(outputs: Sequence, expected: Sequence) -> int:
    """Elements of ``outputs`` that differ from ``expected`` (participant by participant).

    A participant whose output is missing, or of the wrong size, shape or dtype, counts all
    its expected elements as wrong; NaN never equals anything, so it counts too.
    """
    wrong = 0
    for out, exp in zip(outputs, expected, strict=True):
        if exp is None:
            continue
        if isinstance(out, list):  # a batch: the participant's tensors, in order
            kinds = {np.asarray(t).dtype for t in out}
            out = np.concatenate([np.ravel(t) for t in out]) if out else None
            if kinds - {exp.dtype}:
                out = None
        elif out is not None and (np.shape(out) != exp.shape or out.dtype != exp.dtype):
            out = None
        if out is None or np.size(out) != exp.size:
            wrong += exp.size
            continue
        wrong += int(np.count_nonzero(np.asarray(out).reshape(-1) != exp.reshape(-1)))
    return wrong
