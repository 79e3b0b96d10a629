"""``collectives bench``: time a collective over a sweep of sizes, in the style of nccl-tests.

The tool's names, from its parts: ``config`` (what to measure), ``run`` (the sweep and its modes),
``timing`` (one measurement), ``check`` (wrong elements), ``report`` (rows, the table, JSON),
``common`` (runners and array kits), ``command`` (the command line) and one record per
collective (``all_reduce``, ``reduce``, ``broadcast``, ``all_gather``, ``reduce_scatter``,
``gather``, ``scatter``, ``all_to_all``, ``batch_all_reduce``).
"""

from ..reference import COLLECTIVES, REDUCING
from .check import count_wrong
from .common import NUMPY_KIT, ArrayKit, Runner
from .config import COPIES, MODES, BenchConfig, kind, parse_dtype, parse_size
from .report import HEADER, TITLE, Row, format_row, machine_info, make_row, metadata, write_json
from .run import (
    RECORDS,
    Case,
    bench_devices,
    bench_spmd,
    bus_factor,
    expected_output,
    expected_outputs,
    resolve_algorithm,
    run_bench,
    sweep,
)
from .timing import MAX_ITERS, TARGET_SECONDS, Measurement, measure

__all__ = [
    "COLLECTIVES", "COPIES", "HEADER", "MAX_ITERS", "MODES", "NUMPY_KIT", "RECORDS", "REDUCING",
    "TARGET_SECONDS", "TITLE", "ArrayKit", "BenchConfig", "Case", "Measurement", "Row", "Runner",
    "bench_devices", "bench_spmd", "bus_factor", "count_wrong", "expected_output",
    "expected_outputs", "format_row", "kind", "machine_info", "make_row", "measure", "metadata",
    "parse_dtype", "parse_size", "resolve_algorithm", "run_bench", "sweep", "write_json",
]
