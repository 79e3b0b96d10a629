"""Judging the suite's reports: every rank's problems, and the same bits on every rank."""

from __future__ import annotations


def judge(reports: list[dict]) -> list[str]:
    """Problems across the ranks' reports (``reports[rank]``, as the bodies return them)."""
    problems = []
    names = sorted(set().union(*(r.keys() for r in reports)))
    for name in names:
        seen = [r.get(name) for r in reports]
        for rank, entry in enumerate(seen):
            if entry is None:
                problems.append(f"{name}: rank {rank} has no result")
            elif entry[0] is not None:
                problems.append(f"{name}: rank {rank}: {entry[0]}")
        digests = {e[1] for e in seen if e is not None and e[0] is None and e[1] is not None}
        if len(digests) > 1:
            problems.append(f"{name}: ranks hold different bits")
    return problems
