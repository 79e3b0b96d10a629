"""``collectives bench``: time a collective over a sweep of sizes, in the style of nccl-tests.

The tool's names, from its parts: :mod:`.run` (the configuration, the sweep and its modes),
:mod:`.timing` (one measurement), :mod:`.report` (rows, the table, JSON), :mod:`.common`
(runners and array kits) and one record per collective (:mod:`.all_reduce`, :mod:`.reduce`,
:mod:`.broadcast`, :mod:`.all_gather`, :mod:`.reduce_scatter`).
"""

from ..reference import COLLECTIVES, REDUCING
from .common import NUMPY_KIT, ArrayKit, Runner
from .report import HEADER, TITLE, Row, format_row, machine_info, make_row, metadata, write_json
from .run import (
    MODES,
    RECORDS,
    BenchConfig,
    Case,
    bench_devices,
    bench_spmd,
    bus_factor,
    count_wrong,
    expected_output,
    expected_outputs,
    parse_dtype,
    parse_size,
    resolve_algorithm,
    run_bench,
    sweep,
)
from .timing import MAX_ITERS, TARGET_SECONDS, Measurement, measure

__all__ = [
    "COLLECTIVES", "HEADER", "MAX_ITERS", "MODES", "NUMPY_KIT", "RECORDS", "REDUCING",
    "TARGET_SECONDS", "TITLE", "ArrayKit", "BenchConfig", "Case", "Measurement", "Row", "Runner",
    "bench_devices", "bench_spmd", "bus_factor", "count_wrong", "expected_output",
    "expected_outputs", "format_row", "machine_info", "make_row", "measure", "metadata",
    "parse_dtype", "parse_size", "resolve_algorithm", "run_bench", "sweep", "write_json",
]
