"""The bench's configuration: what to measure, parsed from the command's words and checked
before anything runs (sizes, dtypes, modes, algorithms)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

import collectives

from ...algorithms.select import CostModel
from ...api.multi_device import pick_algorithm
from ...extras import install_line
from ...ops import BFLOAT16, ReduceOp, check_dtype
from ..reference import COLLECTIVES, REDUCING

MODES = ("devices", "spmd", "mpi")
# The multi-device forms of these copy blocks and take no algorithm.
COPIES = ("gather", "scatter", "all_to_all")
# The numbers exact inputs are made of: bool, integers, floats, complex.
_NUMERIC_KINDS = "biufc"


def kind(collective: str) -> collectives.Collective:
    """The core's collective whose algorithms ``collective`` runs (a batch: all-reduce's)."""
    return collectives.Collective("all_reduce" if collective == "batch_all_reduce" else collective)

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


# --- configuration ----------------------------------------------------------------------------

def parse_size(text: str | int) -> int:
    """Bytes from ``"8"``, ``"4K"``, ``"64M"``, ``"1G"`` (powers of 1024; "KB"/"KiB" also work)."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"size {text!r} is not a byte count such as 8, 4K, 64M or 1G")
    value = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if value != int(value):
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def parse_dtype(name: str | np.dtype) -> np.dtype:
    """A NumPy dtype from its name; ``bfloat16`` (or ``bf16``) comes from ml_dtypes."""
    if isinstance(name, np.dtype):
        return name
    key = str(name).strip().lower()
    if key in ("bfloat16", "bf16"):
        if BFLOAT16 is None:
            raise ValueError(f"dtype bfloat16 needs the ml_dtypes package: {install_line('bench')}")
        return BFLOAT16
    aliases = {"float": "float32", "half": "float16", "double": "float64", "int": "int32"}
    try:
        return np.dtype(aliases.get(key, key))
    except TypeError as exc:
        raise ValueError(f"dtype {name!r} is not a NumPy dtype name (e.g. float32, float16, "
                         "bfloat16, int32)") from exc


@dataclass
class BenchConfig:
    """What to measure: one collective, some algorithms, a sweep of sizes."""

    collective: str = "all_reduce"
    algorithms: tuple[str, ...] = ("auto",)
    participants: int = 4
    mode: str = "devices"
    minbytes: int = 8
    maxbytes: int = 64 << 20
    stepfactor: int = 2
    dtype: str = "float32"
    op: str = "sum"
    warmup: int = 2
    iters: int | None = None
    repeats: int = 5
    check: bool = True
    root: int = 0
    backend: str = "local"  # the multi-device backend whose arrays the devices mode uses
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ValueError (naming the bad setting) before anything runs."""
        if self.collective not in COLLECTIVES:
            raise ValueError(f"collective {self.collective!r} is not one of {', '.join(COLLECTIVES)}")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.participants < 1:
            raise ValueError(f"participants={self.participants} must be at least 1")
        if not 0 <= self.root < self.participants:
            raise ValueError(f"root={self.root} is not one of the {self.participants} participants")
        if self.minbytes < 1 or self.maxbytes < self.minbytes:
            raise ValueError(f"sizes from {self.minbytes} to {self.maxbytes} bytes: the smallest "
                             "(-b) must be at least 1 and at most the largest (-e)")
        if self.stepfactor < 2:
            raise ValueError(f"stepfactor={self.stepfactor} must be at least 2")
        if self.warmup < 0 or self.repeats < 1 or (self.iters is not None and self.iters < 1):
            raise ValueError("need warmup >= 0, repeats >= 1 and iters >= 1")
        if not self.algorithms:
            raise ValueError("no algorithm given")
        if self.backend != "local" and self.mode != "devices":
            raise ValueError(f"backend {self.backend!r} runs in the devices mode only")
        dtype = parse_dtype(self.dtype)
        if dtype.kind not in _NUMERIC_KINDS and dtype != BFLOAT16:
            raise ValueError(f"dtype {self.dtype!r} is not a number type; the bench's exact "
                             "inputs are bool, integers, floats or complex (e.g. float32, int8)")
        if self.mode == "devices" and self.collective in COPIES and self.algorithms != ("auto",):
            raise ValueError(f"the multi-device {self.collective} copies blocks and takes no "
                             f"algorithm; compare algorithms with --mode spmd")
        collective = kind(self.collective)
        for name in self.algorithms:
            if self.mode == "mpi":  # the MPI transport adds names of its own ("native", "shm")
                if collectives.load_backend("mpi").canonical(name) in ("native", "shm"):
                    continue
            elif name in ("native", "shm", "mpi"):
                raise ValueError(f"algorithm {name!r} is the MPI transport's own: run the bench "
                                 "with --mode mpi under mpiexec to time it")
            # names an algorithm and one that has this collective, or raises saying which do
            pick_algorithm(collective, name, self.participants, 1, CostModel())
        if self.collective in REDUCING:
            check_dtype(ReduceOp.parse(self.op), dtype, "inputs")
        elif ReduceOp.parse(self.op) is not ReduceOp.SUM:  # (-o's default: sum)
            raise ValueError(f"op {self.op!r}: {self.collective} reduces nothing, so it takes "
                             "no op; drop -o")

    @property
    def np_dtype(self) -> np.dtype:
        return parse_dtype(self.dtype)

    @property
    def redop(self) -> str:
        return ReduceOp.parse(self.op).value if self.collective in REDUCING else "none"
