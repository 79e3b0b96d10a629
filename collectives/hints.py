"""The types the public API is annotated with, so that a type checker sees what a call
takes and gives: op and algorithm names as literals (``op="summ"`` or ``algorithm="rign"``
fail type checking), and the array type of a call's inputs as the type of its results
(NumPy arrays in, NumPy arrays out; CuPy in, CuPy out)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NoReturn, Protocol, TypeVar

from .ops import ReduceOp


class Array(Protocol):
    """What the API takes as an array: anything with a shape and a dtype (NumPy, CuPy, a
    PyTorch CPU tensor, a JAX array)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> Any: ...


ArrayT = TypeVar("ArrayT", bound=Array)
"""The array type of a call's inputs, which is the type of its results."""


class NamedOp(Protocol):
    """Another library's reduction enum (``tf.distribute.ReduceOp.SUM``, torch's
    ``ReduceOp.SUM``): its ``name`` says which."""

    @property
    def name(self) -> str: ...


OpName = Literal["sum", "mean", "max", "min", "prod", "avg", "average", "product", "add",
                 "SUM", "MEAN", "MAX", "MIN", "PROD"]
"""The names ``op=`` takes (``ReduceOp.parse`` takes any case)."""

Op = ReduceOp | OpName | NamedOp
"""``op=``: a ``ReduceOp``, its name, or another library's enum."""

AlgorithmName = Literal[
    "auto", "collective", "one_device", "ring", "rechd", "tree", "shuffle", "xring", "nccl",
    "pscpu", "psgpu", "direct", "reduction_to_one_device", "halving_doubling", "binomial_tree"]
"""One algorithm by name: ``auto`` (chosen per call), the library's five, TensorFlow's
aliases (``collectives.algorithms.NAMES``)."""

TwoLevelName = Literal[
    "one_device/one_device", "one_device/ring", "one_device/rechd", "one_device/tree",
    "one_device/shuffle", "one_device/xring", "one_device/nccl", "one_device/pscpu",
    "one_device/psgpu", "one_device/direct", "one_device/reduction_to_one_device",
    "one_device/halving_doubling", "one_device/binomial_tree", "ring/one_device", "ring/ring",
    "ring/rechd", "ring/tree", "ring/shuffle", "ring/xring", "ring/nccl", "ring/pscpu",
    "ring/psgpu", "ring/direct", "ring/reduction_to_one_device", "ring/halving_doubling",
    "ring/binomial_tree", "rechd/one_device", "rechd/ring", "rechd/rechd", "rechd/tree",
    "rechd/shuffle", "rechd/xring", "rechd/nccl", "rechd/pscpu", "rechd/psgpu", "rechd/direct",
    "rechd/reduction_to_one_device", "rechd/halving_doubling", "rechd/binomial_tree",
    "tree/one_device", "tree/ring", "tree/rechd", "tree/tree", "tree/shuffle", "tree/xring",
    "tree/nccl", "tree/pscpu", "tree/psgpu", "tree/direct", "tree/reduction_to_one_device",
    "tree/halving_doubling", "tree/binomial_tree", "shuffle/one_device", "shuffle/ring",
    "shuffle/rechd", "shuffle/tree", "shuffle/shuffle", "shuffle/xring", "shuffle/nccl",
    "shuffle/pscpu", "shuffle/psgpu", "shuffle/direct", "shuffle/reduction_to_one_device",
    "shuffle/halving_doubling", "shuffle/binomial_tree", "xring/one_device", "xring/ring",
    "xring/rechd", "xring/tree", "xring/shuffle", "xring/xring", "xring/nccl", "xring/pscpu",
    "xring/psgpu", "xring/direct", "xring/reduction_to_one_device", "xring/halving_doubling",
    "xring/binomial_tree", "nccl/one_device", "nccl/ring", "nccl/rechd", "nccl/tree",
    "nccl/shuffle", "nccl/xring", "nccl/nccl", "nccl/pscpu", "nccl/psgpu", "nccl/direct",
    "nccl/reduction_to_one_device", "nccl/halving_doubling", "nccl/binomial_tree",
    "pscpu/one_device", "pscpu/ring", "pscpu/rechd", "pscpu/tree", "pscpu/shuffle", "pscpu/xring",
    "pscpu/nccl", "pscpu/pscpu", "pscpu/psgpu", "pscpu/direct", "pscpu/reduction_to_one_device",
    "pscpu/halving_doubling", "pscpu/binomial_tree", "psgpu/one_device", "psgpu/ring",
    "psgpu/rechd", "psgpu/tree", "psgpu/shuffle", "psgpu/xring", "psgpu/nccl", "psgpu/pscpu",
    "psgpu/psgpu", "psgpu/direct", "psgpu/reduction_to_one_device", "psgpu/halving_doubling",
    "psgpu/binomial_tree", "direct/one_device", "direct/ring", "direct/rechd", "direct/tree",
    "direct/shuffle", "direct/xring", "direct/nccl", "direct/pscpu", "direct/psgpu",
    "direct/direct", "direct/reduction_to_one_device", "direct/halving_doubling",
    "direct/binomial_tree", "reduction_to_one_device/one_device", "reduction_to_one_device/ring",
    "reduction_to_one_device/rechd", "reduction_to_one_device/tree",
    "reduction_to_one_device/shuffle", "reduction_to_one_device/xring",
    "reduction_to_one_device/nccl", "reduction_to_one_device/pscpu",
    "reduction_to_one_device/psgpu", "reduction_to_one_device/direct",
    "reduction_to_one_device/reduction_to_one_device", "reduction_to_one_device/halving_doubling",
    "reduction_to_one_device/binomial_tree", "halving_doubling/one_device",
    "halving_doubling/ring", "halving_doubling/rechd", "halving_doubling/tree",
    "halving_doubling/shuffle", "halving_doubling/xring", "halving_doubling/nccl",
    "halving_doubling/pscpu", "halving_doubling/psgpu", "halving_doubling/direct",
    "halving_doubling/reduction_to_one_device", "halving_doubling/halving_doubling",
    "halving_doubling/binomial_tree", "binomial_tree/one_device", "binomial_tree/ring",
    "binomial_tree/rechd", "binomial_tree/tree", "binomial_tree/shuffle", "binomial_tree/xring",
    "binomial_tree/nccl", "binomial_tree/pscpu", "binomial_tree/psgpu", "binomial_tree/direct",
    "binomial_tree/reduction_to_one_device", "binomial_tree/halving_doubling",
    "binomial_tree/binomial_tree"]
"""Two algorithms joined by ``/``: A inside each group, B across the groups."""

Name = AlgorithmName | TwoLevelName

SpecTuple = tuple[Name] | tuple[Name, int] | tuple[Name, int, int]
"""One range of an all-reduce spec: ``(algorithm[, shards[, limit]])``; ``("xring", 2)`` is
``"xring#2"``, a limit of -1 takes any size."""

# The last member admits no value (no value has type NoReturn). It makes the alias recursive,
# and type checkers name a recursive alias in their messages rather than spell it out: a typo
# in an algorithm's or an op's name then reads `expected "Algorithm"` in a message of about a
# kilobyte, where the ~250 names above, written out once per form and per overload, made
# tens of kilobytes. Every name is still checked, the two-level ones included.
Algorithm = Name | SpecTuple | Sequence[SpecTuple] | tuple[NoReturn, "Algorithm"]
"""``algorithm=`` of the multi-device calls: a name, ``"A/B"``, or a spec's tuple form (a
range, or ranges by increasing limit, as ``collectives.algorithms.spec.parse_spec`` gives
them). The string grammar (``"pscpu:2k:xring"``) is typed as the tuples it stands for."""

SpmdAlgorithm = Algorithm | Literal["native", "mpi", "shm"]
"""``algorithm=`` of a ``Communicator``'s calls: also the transport's own (``"native"``,
MPI's ``"mpi"`` alias and its shared-memory ``"shm"``)."""

BatchSpec = Algorithm | str
"""``algorithm=`` of the batched all-reduce: also any spec string
(``"pscpu:2k:pscpu#2:64k:xring"``), TensorFlow's grammar for its ranges."""

CompressionName = Literal["fp16", "bf16", "float16", "bfloat16", "half", "none"]
"""The wire compressions by name (``collectives.compression.NAMES``; ``"none"``: none)."""

Compression = CompressionName | None
"""``compression=`` of the all-reduces: ``"fp16"`` or ``"bf16"``, or None (uncompressed)."""

CollectiveName = Literal["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter",
                         "gather", "scatter", "all_to_all"]
"""A collective by name (``collectives.Collective``'s values)."""

Calibrate = bool | Literal["cached", "fresh"] | None
"""``calibrate=`` of ``collectives.init``: True (the cache, else measure), ``"cached"``,
``"fresh"``, or None (``$COLLECTIVES_CALIBRATE``, else off)."""

__all__ = ["Algorithm", "AlgorithmName", "Array", "ArrayT", "BatchSpec", "Calibrate",
           "CollectiveName", "Compression", "CompressionName", "NamedOp", "Name", "Op", "OpName",
           "SpecTuple", "SpmdAlgorithm", "TwoLevelName"]
