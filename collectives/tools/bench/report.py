"""Rows of results: made from measurements, printed as nccl-tests' table, saved as JSON.

A row is a dict: the out-of-place half at the top level (``time_us``, ``algbw``, ``busbw``,
``wrong``, ``iters``, ``repeats_us``), the in-place half under ``"inplace"`` (None: N/A).
Bandwidths follow nccl-tests' PERFORMANCE.md through ``collectives.tools.reference``'s
per-collective records.
"""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np

import collectives

from .. import reference
from .timing import Measurement

Row = dict


def half(case, m: Measurement, wrong: int | None) -> dict:
    """One half of a row (out of place or in place): time, bandwidths, #wrong, iterations."""
    algbw, busbw = reference.record(case.collective).bandwidth(case.nbytes, m.seconds, case.n)
    return {"time_us": m.seconds * 1e6, "algbw": algbw, "busbw": busbw, "wrong": wrong,
            "iters": m.iters, "repeats_us": [t * 1e6 for t in m.repeats]}


def make_row(config, case, algorithm: str, resolved: str,
             m: Measurement, wrong: int,
             inplace: tuple[Measurement, int] | None = None) -> Row:
    """One result as a dict: the out-of-place measurement at the top level (time_us, algbw,
    busbw, wrong, iters, repeats_us), the in-place one under ``"inplace"`` (None: N/A)."""
    row = {"collective": config.collective, "mode": config.mode, "participants": case.n,
           "size": case.nbytes, "count": case.count, "type": str(case.dtype),
           "redop": config.redop, "algorithm": algorithm, "resolved": resolved,
           **half(case, m, wrong if config.check else None), "inplace": None}
    if inplace is not None:
        row["inplace"] = half(case, inplace[0], inplace[1] if config.check else None)
    return row


_LABELS = (f"#{'size(B)':>11} {'count':>11} {'type':>9} {'redop':>6} {'request':>9} "
           f"{'algorithm':>11} ")
_MEASURED = f"{'time(us)':>11} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7}"
# nccl-tests' two header lines: which half is which, then the columns.
TITLE = f"#{'':<{len(_LABELS) - 1}}{'out-of-place':^{len(_MEASURED)}}  {'in-place':^{len(_MEASURED)}}"
HEADER = f"{_LABELS}{_MEASURED}  {_MEASURED}"


def _format_half(half: dict | None) -> str:
    if half is None:
        return f"{'N/A':>11} {'N/A':>12} {'N/A':>12} {'N/A':>7}"
    wrong = "N/A" if half["wrong"] is None else str(half["wrong"])
    return (f"{half['time_us']:>11.2f} {half['algbw']:>12.3f} {half['busbw']:>12.3f} "
            f"{wrong:>7}")


def format_row(row: Row) -> str:
    """One table line, columns as in HEADER: ``request`` is the algorithm asked for,
    ``algorithm`` what ran."""
    return (f"{row['size']:>12} {row['count']:>11} {row['type']:>9} {row['redop']:>6} "
            f"{row['algorithm']:>9} {row['resolved']:>11} {_format_half(row)}  "
            f"{_format_half(row['inplace'])}")


def machine_info() -> dict:
    """Where the numbers came from."""
    return {"node": platform.node(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version()}


def metadata(command: str, config=None) -> dict:
    """Command, machine, versions and date, for JSON files."""
    meta = {"command": command, "machine": machine_info(), "numpy": np.__version__,
            "collectives": collectives.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if config is not None:
        meta["config"] = {k: v for k, v in asdict(config).items() if k != "extra"}
    return meta


def write_json(path: str, rows: Sequence[Row], meta: dict) -> None:
    """``meta`` plus ``rows`` (a list of row dicts) as one JSON object."""
    import json

    with open(path, "w") as f:
        json.dump({**meta, "rows": list(rows)}, f, indent=1, default=str)
        f.write("\n")
