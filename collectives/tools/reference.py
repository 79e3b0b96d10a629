"""What a correct collective returns: exact inputs, a float64 NumPy reference, byte counts.

The tests, the MPI scenarios and ``collectives bench`` all check results against this one
module, so they agree on what "right" means:

* ``exact_inputs`` makes inputs of small integers whose reduction is exact in every dtype
  (int8 to float64, float16, bfloat16, complex) and in any order of operations, so results
  can be compared bit for bit whatever the algorithm;
* ``reference`` reduces in float64 (complex128 for complex, bool for bool) with NumPy, and
  ``expected_outputs`` says what every participant holds after each collective;
* ``RECORDS`` holds, per collective, what nccl-tests keeps in its ``struct testColl``: the
  buffer counts of a call and the bus-bandwidth factor.

MEAN is what the library defines: SUM, then one division by the number of participants in
the input's dtype (integer MEAN divides into float64, as NumPy's true division does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..ops import BFLOAT16, ReduceOp, result_dtype

COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "gather",
               "scatter", "all_to_all", "batch_all_reduce")
REDUCING = ("all_reduce", "reduce", "reduce_scatter", "batch_all_reduce")

# Sums stay at or below this, so they are exact in int8 (127), float16 (2048) and bfloat16 (256).
_SUM_LIMIT = 127


# --- exact inputs -----------------------------------------------------------------------------

def _sum_modulus(n: int) -> int:
    """SUM/MEAN inputs are 0..m-1: m = 4 while n <= 42, fewer values for more participants."""
    return max(2, min(4, 1 + _SUM_LIMIT // max(n, 1)))


def input_period(n: int, op: ReduceOp | str = "sum") -> int:
    """Every participant's ``exact_inputs`` repeat after this many elements (so does their
    reduction): a long reduction can be checked by reducing one period."""
    op = ReduceOp.parse(op)
    # The bool pattern repeats after lcm(3, n + 1), complex imaginary parts after 3.
    if op.wire_op is ReduceOp.PROD:
        return math.lcm(n + 1, 3)
    if op in (ReduceOp.MAX, ReduceOp.MIN):
        return math.lcm(44, 3, n + 1)
    return math.lcm(_sum_modulus(n) ** 2, 3, n + 1)


def _pattern(n: int, p: int, length: int, dtype: np.dtype, op: ReduceOp, seed: int) -> np.ndarray:
    i = np.arange(length)
    kind = "f" if BFLOAT16 is not None and dtype == BFLOAT16 else dtype.kind
    if kind == "b":
        # every third element True everywhere, else True on at most one participant:
        # MAX (any) and MIN (all) both give a mix of True and False
        x = (i % 3 == 0) | ((i + p + seed) % (n + 1) == 0)
    elif op.wire_op is ReduceOp.PROD:
        x = np.where((i + p + seed) % (n + 1) == 0, 2, 1)  # at most one 2 per element
        if kind in "fi":  # not complex: a product of negative values flips the signs of zeros
            x = x * np.where((i * 5 + p) % 3 == 0, -1, 1)
    elif op in (ReduceOp.MAX, ReduceOp.MIN):
        # a base value per element plus 0..3 by participant: with any number of participants
        # the maximum and the minimum still vary from element to element
        x = ((i * 7 + seed) % 11 + (i + p * 3) % 4) % 11 - (5 if kind in "fic" else 0)
    else:
        # participant 0 is shifted every m elements, so the sum varies from element to element
        # even when the other participants cover every residue equally
        m = _sum_modulus(n)
        x = (i * 5 + p * 3 + seed + (p == 0) * (i // m)) % m
    x = np.asarray(x)
    if kind == "c":
        x = x + 1j * ((i + p) % 3 if op.wire_op is not ReduceOp.PROD else 0)
    return x.astype(dtype)


def exact_input(n: int, participant: int, count: int, dtype, op: ReduceOp | str = "sum", *,
                seed: int = 0, shape: Sequence[int] | None = None) -> np.ndarray:
    """Participant ``participant``'s input among ``n``: ``count`` elements (reshaped to
    ``shape`` if given) of small integers.

    Whatever the order of operations, the reduction over ``n`` participants is exact:
    sums stay at or below 127 (int8, float16 and bfloat16 hold them exactly), products are of
    +-1 (complex: 1) with at most one 2 per element, MAX/MIN inputs lie in -5..5 (0..10 unsigned), and
    complex inputs have small integer imaginary parts. ``seed`` shifts the pattern.
    """
    if not 0 <= participant < n:
        raise ValueError(f"participant={participant} is not one of the {n} participants")
    op, dtype = ReduceOp.parse(op), np.dtype(dtype)
    period = _pattern(n, participant, input_period(n, op), dtype, op, seed)
    x = np.resize(period, count)  # repeats the period: the same as computing every element
    return x.reshape(shape) if shape is not None else x


def exact_inputs(n: int, count: int, dtype, op: ReduceOp | str = "sum", seed: int = 0, *,
                 shape: Sequence[int] | None = None) -> list[np.ndarray]:
    """``exact_input`` of each of the ``n`` participants, in order."""
    return [exact_input(n, p, count, dtype, op, seed=seed, shape=shape) for p in range(n)]


def random_inputs(n: int, count: int, dtype, seed: int) -> list[np.ndarray]:
    """Random normal floats: their sums round, so only the same order of additions gives the
    same bits (for checking that every participant got identical results, not for ``reference``)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(count).astype(dtype) for _ in range(n)]


# --- the reference ----------------------------------------------------------------------------

def _wide(dtype: np.dtype) -> type:
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return np.float64
    return {"c": np.complex128, "b": np.bool_}.get(dtype.kind, np.float64)


def reference(values: Sequence[np.ndarray], op: ReduceOp | str) -> np.ndarray:
    """``op`` over ``values`` (one array per participant) as a correct collective computes it.

    The combination runs in float64 (complex128, bool) and is cast back to the input dtype,
    which is exact for ``exact_inputs``; MEAN then divides that sum once by ``len(values)``,
    as the library does, so the result has the library's dtype and, for exact inputs, its bits.
    """
    op = ReduceOp.parse(op)
    dtype = np.dtype(values[0].dtype)
    stack: np.ndarray = np.stack([np.asarray(v).astype(_wide(dtype)) for v in values])
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
        return np.asarray(np.true_divide(total, len(values))).astype(result_dtype(op, dtype))
    return total


def scatter_blocks(rows: int, n: int) -> list[tuple[int, int]]:
    """reduce_scatter's split of axis 0: participant ``i`` keeps rows ``floor(i R / n)`` to
    ``floor((i + 1) R / n)``."""
    return [(i * rows // n, (i + 1) * rows // n) for i in range(n)]


def expected_outputs(collective: str, inputs: Sequence[np.ndarray], op: ReduceOp | str = "sum",
                     *, root: int = 0, axis: int = 0) -> list[np.ndarray | None]:
    """What each participant holds after ``collective`` over ``inputs`` (one per participant):
    None where it receives nothing (every participant but the root of a reduce or a gather).

    Gather stacks the inputs along a new leading axis on the root; scatter gives participant
    ``p`` row ``p`` of the root's input; all-to-all gives participant ``j`` block ``j`` of
    every input's leading axis (cut into ``n`` equal blocks), in participant order.
    """
    n = len(inputs)
    if collective == "broadcast":
        return [np.array(inputs[root], copy=True) for _ in range(n)]
    if collective == "all_gather":
        gathered = np.concatenate([np.atleast_1d(x) for x in inputs], axis=axis)
        return [gathered] * n
    if collective == "gather":
        return [np.stack(inputs) if p == root else None for p in range(n)]
    if collective == "scatter":
        return [np.array(inputs[root][p], copy=True) for p in range(n)]
    if collective == "all_to_all":
        rows = inputs[0].shape[0] // n
        return [np.concatenate([x[j * rows:(j + 1) * rows] for x in inputs]) for j in range(n)]
    if collective not in REDUCING or collective == "batch_all_reduce":
        raise ValueError(f"collective {collective!r} is not one of {', '.join(COLLECTIVES[:-1])}")
    full = reference(inputs, op)
    if collective == "all_reduce":
        return [full] * n
    if collective == "reduce":
        return [full if p == root else None for p in range(n)]
    return [full[lo:hi] for lo, hi in scatter_blocks(full.shape[0], n)]


# --- per-collective records (nccl-tests' struct testColl) --------------------------------------

@dataclass(frozen=True)
class Counts:
    """Element counts of one call, as nccl-tests' ``getCollByteCount`` gives them: the send and
    receive buffers, the count argument of the call, and where the input sits inside the output
    buffer when the call runs in place."""

    send: int
    recv: int
    param: int
    send_inplace_offset: int
    recv_inplace_offset: int


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective's sizes and bus bandwidth (nccl-tests' PERFORMANCE.md).

    ``layout`` is "same" (send and receive buffers hold ``count`` elements), "gather" (each
    sends a block, receives all n), "scatter" (each sends n blocks, receives one) or
    "exchange" (each sends n blocks and receives n: all-to-all).
    """

    name: str
    reduces: bool
    rooted: bool
    layout: str

    def counts(self, count: int, n: int, rank: int = 0) -> Counts:
        """The counts of a call over ``count`` elements in all (the larger buffer) on ``n``
        participants, for participant ``rank``. nccl-tests also rounds blocks down to a
        multiple of 4; here blocks are whole elements, at least one."""
        if self.layout == "same":
            return Counts(count, count, count, 0, 0)
        block = max(1, count // n)
        if self.layout == "gather":
            return Counts(block, block * n, block, block * rank, 0)
        if self.layout == "exchange":
            return Counts(block * n, block * n, block, 0, 0)
        return Counts(block * n, block, block, 0, block * rank)

    def nbytes(self, count: int, n: int, itemsize: int) -> int:
        """nccl-tests' size column: the larger of the send and receive buffers, in bytes."""
        c = self.counts(count, n)
        return max(c.send, c.recv) * itemsize

    def bus_factor(self, n: int) -> float:
        """busbw / algbw: 2(n-1)/n for all_reduce (and a batch of them), (n-1)/n for
        all_gather, reduce_scatter, gather, scatter and all_to_all, 1 for broadcast and reduce."""
        if self.name in ("all_reduce", "batch_all_reduce"):
            return 2 * (n - 1) / n
        if self.layout in ("gather", "scatter", "exchange"):
            return (n - 1) / n
        return 1.0

    def bandwidth(self, nbytes: int, seconds: float, n: int) -> tuple[float, float]:
        """(algbw, busbw) in GB/s for ``nbytes`` (the size column) moved in ``seconds``."""
        algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        return algbw, algbw * self.bus_factor(n)


RECORDS: dict[str, CollectiveRecord] = {
    "all_reduce": CollectiveRecord("all_reduce", reduces=True, rooted=False, layout="same"),
    "reduce": CollectiveRecord("reduce", reduces=True, rooted=True, layout="same"),
    "broadcast": CollectiveRecord("broadcast", reduces=False, rooted=True, layout="same"),
    "all_gather": CollectiveRecord("all_gather", reduces=False, rooted=False, layout="gather"),
    "reduce_scatter": CollectiveRecord("reduce_scatter", reduces=True, rooted=False,
                                       layout="scatter"),
    "gather": CollectiveRecord("gather", reduces=False, rooted=True, layout="gather"),
    "scatter": CollectiveRecord("scatter", reduces=False, rooted=True, layout="scatter"),
    "all_to_all": CollectiveRecord("all_to_all", reduces=False, rooted=False, layout="exchange"),
    # many tensors all-reduced at once: sized and counted as one all-reduce of them all
    "batch_all_reduce": CollectiveRecord("batch_all_reduce", reduces=True, rooted=False,
                                         layout="same"),
}


def record(collective: str) -> CollectiveRecord:
    """The record of ``collective`` (one of ``COLLECTIVES``)."""
    try:
        return RECORDS[collective]
    except KeyError:
        raise ValueError(f"collective {collective!r} is not one of "
                         f"{', '.join(COLLECTIVES)}") from None
