"""Helpers shared by the scenario scripts that ``tests/test_mpi.py`` runs under ``mpiexec``.

Each script prints one ``SUMMARY`` line on rank 0 and exits non-zero on any failure, so a
script can also be run by hand: ``.venv/bin/mpiexec -n 4 .venv/bin/python tests/mpi_scenarios/matrix.py``.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time

import numpy as np

# Scripts run from a source checkout without installing it.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mpi4py import MPI  # noqa: E402

from collectives.ops import ReduceOp, divide_for_mean, result_dtype  # noqa: E402

WORLD = MPI.COMM_WORLD


def exact_inputs(n: int, count: int, dtype, op: ReduceOp, shape=None) -> list[np.ndarray]:
    """Every rank's input: small integers whose reduction is exact in every dtype and order."""
    dtype = np.dtype(dtype)
    i = np.arange(count)
    out = []
    for p in range(n):
        if dtype.kind == "b":
            x = (i * 3 + p) % 3 == 0
        elif op.wire_op is ReduceOp.PROD:
            x = np.where((i + p) % (n + 1) == 0, 2, 1)  # at most one 2 per position
            if dtype.kind in "fic":
                x = x * np.where((i * 5 + p) % 3 == 0, -1, 1)
        elif op in (ReduceOp.MAX, ReduceOp.MIN):
            x = (i * 7 + p * 3) % 11 - (5 if dtype.kind in "fic" else 0)
        else:
            x = (i * 5 + p * 3) % 4  # sums stay below 16: exact in int8 and float16
        x = np.asarray(x)
        if dtype.kind == "c":
            x = x + 1j * ((i + p) % 3 if op.wire_op is not ReduceOp.PROD else 0)
        x = x.astype(dtype)
        out.append(x.reshape(shape) if shape is not None else x)
    return out


def random_inputs(n: int, count: int, dtype, seed: int) -> list[np.ndarray]:
    """Random floats: sums round, so only the same order of additions gives the same bits."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(count).astype(dtype) for _ in range(n)]


def reference(values: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    """The float64 (complex128, bool) reduction, cast to the wire dtype; MEAN divided after,
    exactly as the library divides (one division of the exact total)."""
    dtype = np.dtype(values[0].dtype)
    wide = np.complex128 if dtype.kind == "c" else (np.bool_ if dtype.kind == "b" else np.float64)
    stack = np.stack([v.astype(wide) for v in values])
    wire = op.wire_op
    if wire is ReduceOp.SUM:
        total = stack.sum(axis=0)
    elif wire is ReduceOp.PROD:
        total = stack.prod(axis=0)
    elif wire is ReduceOp.MAX:
        total = stack.max(axis=0)
    else:
        total = stack.min(axis=0)
    total = total.astype(dtype)
    if op is ReduceOp.MEAN:
        return np.asarray(divide_for_mean(total, len(values))).astype(result_dtype(op, dtype))
    return total


def digest(x) -> str:
    """Shape, dtype and bytes of a result, hashed (None stays None)."""
    if x is None:
        return "None"
    x = np.ascontiguousarray(x)
    h = hashlib.blake2b(x.view(np.uint8).tobytes(), digest_size=12).hexdigest()
    return f"{x.dtype}{tuple(x.shape)}:{h}"


class Report:
    """Failures collected on every rank, summarised on rank 0."""

    def __init__(self, name: str):
        self.name = name
        self.failures: list[str] = []
        self.cases = 0
        self.start = time.monotonic()

    def check(self, ok: bool, what: str) -> bool:
        self.cases += 1
        if not ok:
            self.failures.append(f"rank {WORLD.rank}: {what}")
        return ok

    def finish(self, extra: str = "") -> None:
        """Gather failures to rank 0, print the summary there, exit non-zero on failure."""
        failures = WORLD.gather(self.failures, root=0)
        cases = WORLD.gather(self.cases, root=0)
        code = 0
        if WORLD.rank == 0:
            flat = [f for fs in failures for f in fs]
            for f in flat[:40]:
                print("FAIL", f, flush=True)
            if len(flat) > 40:
                print(f"... and {len(flat) - 40} more failures", flush=True)
            status = "PASS" if not flat else "FAIL"
            print(f"SUMMARY {self.name} {status} ranks={WORLD.size} checks={sum(cases)} "
                  f"failures={len(flat)} seconds={time.monotonic() - self.start:.1f} {extra}",
                  flush=True)
            code = 1 if flat else 0
        code = WORLD.bcast(code, root=0)
        sys.stdout.flush()
        if code:
            WORLD.Barrier()
            sys.exit(code)
