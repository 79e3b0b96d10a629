"""What a collective call is: its validated arguments, its signature and its check value.

Every call is first described by a ``Call``: the collective, shape, dtype, op, root,
algorithm, shards and groups, validated once and cached by the raw arguments (a training loop
makes the same calls every step, so validation and parsing are paid once). The call's
*signature* is what every rank must agree on; its *check value* is a 30-bit digest of the
signature, identical in every process, that rides with the data so that ranks which disagree
never pair their messages up silently.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import algorithms
from ..algorithms.base import Layout
from ..algorithms.schedule import Collective
from ..algorithms.spec import TRANSPORT_WORDS, not_this_transports, parse_spec, pick_range
from ..ops import ReduceOp, check_dtype, result_dtype

CHECK_BITS = 30


def check_of(signature: tuple) -> int:
    """A signature's check value: its ``CHECK_BITS``-bit digest, the same in every process."""
    return zlib.crc32(repr(signature).encode()) & ((1 << CHECK_BITS) - 1)


class BatchTag(str):
    """A batch's tag (``Call.batch``): the list's description and digest, as text (which is
    what signatures compare), and ``issued``: how many calls the batch issues before it waits
    on any (1 blocking, each bucket one at a time; every bucket, asynchronous or as buckets;
    ``agreement.ISSUED_SEVERAL``: not known yet). Ranks whose tags differ there no longer pair
    their calls once a mismatch stops them.
    ``differs``: what a mismatch of tags means, and its fix, for callers other than a batch
    (a DDP hook's tag carries its ``mean``)."""

    issued: int
    differs: str

    def __new__(cls, text: str, issued: int = 1, differs: str = "") -> BatchTag:
        tag = super().__new__(cls, text)
        tag.issued, tag.differs = issued, differs
        return tag

    def __reduce__(self) -> tuple:  # (agreements pickle signatures: the fields travel too)
        return BatchTag, (str(self), self.issued, self.differs)

    # Equal where the text and ``issued`` are (so that the calls cached by signature keep a
    # blocking batch's buckets apart from an asynchronous one's); the check value and the
    # agreement compare the text alone (``repr``): ranks whose batches differ only there
    # still pair their calls one for one.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, str):
            return NotImplemented
        return str.__eq__(self, other) and self.issued == getattr(other, "issued", 1)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:  # (the text's: equal objects, the plain text too, hash alike)
        return str.__hash__(self)


def pairing_key(signature: tuple) -> tuple:
    """``signature`` as ranks pair calls by it: a batch's tag as its text alone. A transport's
    state kept per signature that must match across ranks (MPI's persistent requests, made
    in the same order on every rank) is kept under this key: a blocking batch's bucket on one
    rank and an asynchronous one's on another are one call to pair."""
    if len(signature) != len(FIELDS):
        return signature
    batch = signature[FIELDS.index("batch")]
    if not isinstance(batch, BatchTag):
        return signature
    at = FIELDS.index("batch")
    return (*signature[:at], str(batch), *signature[at + 1:])


def calls_issued(signature: tuple) -> int:
    """How many calls the call of ``signature`` comes with, issued before it is waited on:
    a batch's buckets (``BatchTag.issued``), else 1."""
    batch = signature[FIELDS.index("batch")] if len(signature) == len(FIELDS) else None
    return batch.issued if isinstance(batch, BatchTag) else 1


@dataclass(eq=False)
class Call:
    """A validated collective call (cached: treat as read-only)."""

    collective: Collective
    shape: tuple[int, ...]
    dtype: np.dtype
    op: ReduceOp | None
    root: int
    algorithm: str  # canonical name, "auto", or a transport's own (e.g. "native")
    shards: int
    layout: Layout | None
    axis: int | None = None
    batch: BatchTag | None = None  # the batch whose bucket this is (CallRunner.part_of)
    # a compressed all-reduce's input and op ("fp16 of float32, mean"): its wire call alone
    # (a float16 SUM) would pair silently with a plain float16 call of another rank
    compression: str | None = None
    # what the user called, where that is not the collective it runs as (a barrier is a
    # one-element all-reduce): its name in logs and errors
    shown_as: str | None = None
    # the dtype the caller passed, where it travels as another (an integer MEAN's inputs, as
    # float64: ``collectives.widened``): what the ranks agree on, and what errors name
    passed: np.dtype | None = None
    # the leading axis stands for rows that differ between ranks (0: all_to_all(splits=...),
    # whose sizes the ranks exchanged first): no zero-size call, whatever its shape says
    rows_vary: bool = False
    final: np.dtype = field(init=False)  # the result's dtype (integer MEAN: float64)
    count: int = field(init=False)
    nbytes: int = field(init=False)
    signature: tuple = field(init=False)
    check: int = field(init=False)
    run_as: str = field(init=False, default="")  # what runs it: "native" or a schedule's name
    choice: Any = field(init=False, default=None, repr=False)  # the runner's (api.runners)
    plans: dict = field(init=False, default_factory=dict, repr=False)  # this rank's, by shards

    @property
    def always_agrees(self) -> bool:
        """Whether every call of this signature is agreed, not only the first: a zero-size
        call moves no data, so no check value rides with it to catch a peer that calls
        otherwise (it returned at once, beside peers that waited out their timeout)."""
        return self.count == 0 and not self.rows_vary

    def __post_init__(self) -> None:
        self.count = math.prod(self.shape)
        self.nbytes = self.count * self.dtype.itemsize
        self.final = result_dtype(self.op, self.dtype) if self.op is not None else self.dtype
        self.signature = (self.collective.value, self.shape, str(self.passed or self.dtype),
                          self.op.value if self.op else None, self.root, self.algorithm,
                          self.shards, None if self.layout is None else self.layout.groups,
                          self.axis, self.batch, self.compression)
        self.check = check_of(self.signature)

    def describe(self) -> str:
        """``all_reduce(float32[1000], op=sum)``: for error messages and logs (made once: a
        transport may name every call it watches)."""
        text = self.__dict__.get("_description")
        if text is None:
            text = self.__dict__["_description"] = self._describe()
        return text

    def _describe(self) -> str:
        if self.shown_as is not None:
            return self.shown_as
        dtype = str(self.passed or self.dtype)
        op = self.op.value if self.op is not None else None
        wire = None
        if self.compression is not None:  # (the caller's dtype and op, not the wire's)
            wire, dtype, op = compression_parts(self.compression)
        parts = [f"{dtype}[{','.join(map(str, self.shape))}]"]
        if op is not None:
            parts.append(f"op={op}")
        if self.collective in (Collective.REDUCE, Collective.BROADCAST, Collective.GATHER,
                               Collective.SCATTER):
            parts.append(f"root={self.root}")
        if self.algorithm != "auto":
            parts.append(f"algorithm={self.algorithm}")
        if wire is not None:
            parts.append(f"compression={wire}")
        return f"{self.collective.value}({', '.join(parts)})"

    def describe_fully(self) -> str:
        """``describe()`` with what else tells two calls apart (shards, groups, compression,
        what the call is part of: a batch, a hook): what a mismatch names on each side."""
        extra = []
        if self.shards:
            extra.append(f"shards={self.shards}")
        if self.layout is not None:
            extra.append(f"groups={self.layout.groups}")
        if self.compression is not None:
            extra.append(f"compression: {self.compression}")
        if self.batch is not None:
            extra.append(f"part of {self.batch}")
        return self.describe() + (f" ({'; '.join(extra)})" if extra else "")


def compression_text(wire: np.dtype, dtype: np.dtype, op: ReduceOp) -> str:
    """A compressed all-reduce's ``Call.compression``: "float16 of float32, mean", the wire's
    dtype, the caller's and its op (what ranks agree on, and what errors name)."""
    return f"{wire} of {dtype}, {op.value}"


def compression_parts(text: str) -> tuple[str, str, str]:
    """``compression_text``'s wire dtype, the caller's dtype and op, as names."""
    wire, _, passed = text.partition(" of ")
    dtype, _, op = passed.partition(", ")
    return wire, dtype, op


def described_fully(subject: Any) -> str:
    """What a mismatch names one side by: a call's ``describe_fully``, else whatever stands
    for a call (a message's description, or its name)."""
    for name in ("describe_fully", "describe"):
        describe = getattr(subject, name, None)
        if describe is not None:
            return describe()
    return str(subject)


FIELDS = ("collective", "shape", "dtype", "op", "root", "algorithm", "shards", "groups", "axis",
          "batch", "compression")
# the order a mismatch is named in: the lists first, then the collective and the root (whose
# disagreement may make the shapes differ too), then the rest
NAMED_FIRST = ("batch", "compression", "collective", "root")
CHECK_ORDER = [FIELDS.index(name) for name in NAMED_FIRST] + [
    i for i, name in enumerate(FIELDS) if name not in NAMED_FIRST]


def differences(signatures: list[tuple], collective: str) -> str | None:
    """The first field on which ranks' signatures differ, by rank (for mismatch errors), or
    None where none does. The tensor lists of a batch come first: where they differ, so may
    a bucket's shape or dtype, but the lists say what the caller passed; then the collective
    and the root, whose disagreement may make the shapes differ too. A broadcast's
    non-roots may not know the shape and dtype (None): only known ones count."""
    forms = [len(s) for s in signatures if s is not None]
    if collective == "broadcast" and len(set(forms)) > 1:  # its opening (the root tells the
        # shape and dtype: ``from_root.Opening``) and a prepared one's Call
        prepared = [r for r, s in enumerate(signatures) if s is not None and len(s) == len(FIELDS)]
        plain = [r for r, s in enumerate(signatures) if s is not None and len(s) != len(FIELDS)]
        return (f"ranks called {collective} in two forms: prepared ({collective}_init) on "
                f"rank(s) {', '.join(map(str, prepared))}, plain on rank(s) "
                f"{', '.join(map(str, plain))}; every rank must call it in the same form")
    for i in CHECK_ORDER:
        name = FIELDS[i]
        seen = [s[i] if s is not None and i < len(s) else None for s in signatures]
        known = [v for v in seen if v is not None] if name in ("shape", "dtype") else seen
        if len(set(map(repr, known))) > 1:
            if name == "batch":  # (the bucket of a batch: the lists differ)
                by_rank = ", ".join(f"rank {r}: {v or f'a plain {collective}'}"
                                    for r, v in enumerate(seen))
                # (a caller's own words, where every rank's tag is that caller's)
                said = {v.differs if isinstance(v, BatchTag) else "" for v in seen}
                if len(said) == 1 and "" not in said:
                    return said.pop().format(by_rank=by_rank)
                if not all(seen) or len(said) > 1:  # (a plain call, or another caller's)
                    return (f"ranks are in different calls at this point ({by_rank}); every "
                            "rank must make the same calls in the same order (one that "
                            "skipped a step, or made another call first, is out of step)")
                return (f"ranks called batch_all_reduce (or buckets) with different tensor lists "
                        f"or buckets ({by_rank}); every rank must pass the same shapes and "
                        "dtypes in the same order, and the same bucket_bytes and packing "
                        "arguments")
            by_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(seen))
            # (groups a call does not name come from the transport: init's groups=, or
            # COLLECTIVES_RANKS_PER_NODE, which may be set differently on different ranks)
            where = (" (where a call names none, its transport's: init's groups= or "
                     "COLLECTIVES_RANKS_PER_NODE, alike on every rank)" if name == "groups"
                     else "")
            if collective in ("broadcast", "scatter") and name in ("shape", "dtype"):
                where = (" (a non-root that passes x or out= gives them the root's shape and "
                         "dtype; or passes None)" if collective == "broadcast" else
                         " (a non-root that passes x gives it the root's shape and dtype, and "
                         "out= those of one row; or passes None)")
            return (f"ranks called {collective} with different {name} ({by_rank}); every rank "
                    f"must pass the same {name}{where}")
    return None


def resolve_algorithm(algorithm: Any, count: int, shards: int, extra_names=()) -> tuple[str, int]:
    """``(canonical name, shards)`` for one array of ``count`` elements.

    ``algorithm`` takes every spec form (a name, ``"A/B"``, ``"alg#shards"``, tuples, lists of
    ranges, the ``"pscpu:2k:xring"`` grammar): the range is chosen by the element count, as a
    batch would choose it. ``extra_names`` are a transport's own algorithms (e.g. "native").
    """
    if not isinstance(algorithm, (str, tuple, list)):
        raise TypeError(f"algorithm must be a name such as 'ring' or 'nccl/xring', or an "
                        f"all-reduce spec (a tuple, a list of tuples, 'pscpu:2k:xring'), not "
                        f"{type(algorithm).__name__} {algorithm!r}")
    return _resolve(algorithm, count, shards, tuple(extra_names))


def _resolve(algorithm: Any, count: int, shards: int, extra_names: tuple) -> tuple[str, int]:
    if isinstance(algorithm, str):
        text = algorithm.strip().lower()
        if text in extra_names:
            return text, shards
        if text in TRANSPORT_WORDS:
            raise not_this_transports(algorithm, extra_names)
        if ":" not in text and "#" not in text:
            return algorithms.canonical(algorithm), shards
    chosen = pick_range(parse_spec(algorithm, extra_names=extra_names, argument="algorithm"),
                        count)
    name = chosen.algorithm.strip().lower()
    name = name if name in extra_names else algorithms.canonical(name)
    if shards and chosen.shards != 1 and shards != chosen.shards:
        raise ValueError(f"shards={shards} conflicts with the all-reduce spec {algorithm!r}, "
                         "which sets its own; put them in the spec (e.g. 'xring#2')")
    return name, shards or chosen.shards  # a spec's shards count as given (TensorFlow's)


def check_op_for(op: Any, dtype: np.dtype, argument: str) -> ReduceOp:
    parsed = ReduceOp.parse(op)
    check_dtype(parsed, dtype, argument)
    return parsed


def first_taker(runners: Sequence[Any], why_not: Callable[[Any], str | None]
                ) -> tuple[Any, tuple[tuple[str, str], ...]]:
    """The first of ``runners`` that takes a call (``why_not(runner)`` None), and why each
    before it did not: ``(runner.name, reason)``, in order. Every list of runners (the
    Communicator's, a backend's) ends with one that takes every call."""
    skipped: list[tuple[str, str]] = []
    for runner in runners:
        why = why_not(runner)
        if why is None:
            return runner, tuple(skipped)
        skipped.append((runner.name, why))
    raise AssertionError(f"no runner of {[r.name for r in runners]} takes the call")
