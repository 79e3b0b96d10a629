"""Workers agree on each cross-worker call of the adapter before any of its data moves.

The core's ``Communicator`` checks the arguments of each collective it runs, but one
``batch_reduce`` is several collectives (one per tensor or pack). If one worker's batch is a
tensor shorter than another's, every collective it does run still matches, so it would return
its sums and its *next* call would pair with the other worker's last tensor: wrong results,
silently. So each cross-worker call (a batch, a gather) first agrees on a description of the
whole call: which call, the reduce op, the local device count, and every tensor's kind, dtype
and shape, in order.

Cost in the steady state: one ``all_gather`` of an 8-byte digest of the description. Only when
the digests differ do the workers exchange their full descriptions, so that every worker raises
the same ``collectives.CollectiveMismatchError`` saying what differs, before data moves.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any

import numpy as np

from collectives import CollectiveMismatchError

__all__ = ["BatchAgreement", "Signature", "agree", "explain", "signature"]

# What a description holds, in the order a mismatch is explained: fields of the whole call, then
# (after the batch length) fields with one entry per tensor; each with the advice to give.
_CALL_FIELDS = (
    ("call", "operations", "every worker must make the same cross-device calls in the same order"),
    ("op", "reduce ops", "every worker must pass the same reduce_op"),
    ("workers_sum", "workers_sum settings", "construct the cross-device ops alike on every worker"),
    ("axis", "axes", "every worker must gather along the same axis"),
)
_TENSOR_FIELDS = (  # (tensors before routes: a sparse value has no route, a dense one has)
    ("devices", "numbers of devices", "every worker must run the same number of replicas"),
    ("tensors", "tensors", "every worker must pass tensors of the same kind, dtype and shape, "
                           "in the same order"),
    ("route", "algorithms or packing", "construct the cross-device ops alike on every worker"),
)


class Signature:
    """A call's description (JSON-able: str, int, None, tuples, lists, dicts) and its digest."""

    def __init__(self, description: dict[str, Any]):
        self.description = description
        self.text = json.dumps(description, sort_keys=True, separators=(",", ":"))
        digest = hashlib.blake2b(self.text.encode(), digest_size=8).digest()
        self.digest = np.frombuffer(digest, np.int64).copy()


def signature(description: dict[str, Any]) -> Signature:
    """``Signature(description)`` for a description of hashable values (tuples, not lists),
    cached: an eager training loop describes the same batch at every step."""
    return _cached(tuple(sorted(description.items())))


@lru_cache(maxsize=256)
def _cached(items: tuple) -> Signature:
    return Signature(dict(items))


def agree(comm, signature: Signature, *, timeout: float | None = None) -> None:
    """Return when every worker's ``signature`` is the same; else raise the same
    ``CollectiveMismatchError`` on every worker (collective: every worker calls it)."""
    if comm is None or comm.size == 1:
        return
    digests = comm.all_gather(signature.digest, timeout=timeout)
    if np.all(digests == digests[0]):
        return
    # Every worker saw the same digests, so every worker takes part in this second exchange.
    text = np.frombuffer(signature.text.encode(), np.uint8)
    sizes = comm.all_gather(np.array([text.size], np.int64), timeout=timeout).tolist()
    padded = np.zeros(max(sizes), np.uint8)
    padded[:text.size] = text
    rows = comm.all_gather(padded, timeout=timeout).reshape(comm.size, -1)
    descriptions = [json.loads(bytes(rows[r, :size]).decode()) for r, size in enumerate(sizes)]
    raise CollectiveMismatchError(f"rank {comm.rank}: {explain(descriptions)}")


def _by_rank(values: list) -> str:
    return ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))


def _show(field: str, value) -> str:
    if field != "tensors":
        return str(value)
    kind, dtype, shape = value  # shape: a list, None for an unknown dimension or rank
    dims = "?" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
    return f"{kind} {dtype} {dims}"


def explain(descriptions: list[dict[str, Any]]) -> str:
    """What differs between the workers' descriptions (one per rank), and how to fix it."""
    call = descriptions[0].get("call", "call")
    for field, plural, advice in _CALL_FIELDS:
        seen = [d.get(field) for d in descriptions]
        if any(s != seen[0] for s in seen):
            return f"workers called {call} with different {plural} ({_by_rank(seen)}); {advice}"
    counts = [len(d.get("tensors", ())) for d in descriptions]
    if any(c != counts[0] for c in counts):
        return (f"workers called {call} with batches of different lengths "
                f"({_by_rank([f'{c} tensor(s)' for c in counts])}); every worker must pass the "
                "same tensors, in the same order, in every batch")
    for k in range(counts[0]):
        for field, plural, advice in _TENSOR_FIELDS:
            seen = [d.get(field, [None] * counts[0])[k] for d in descriptions]
            if any(s != seen[0] for s in seen):
                shown = _by_rank([_show(field, s) for s in seen])
                return (f"workers called {call} with different {plural} at position {k} "
                        f"({shown}); {advice}")
    return f"workers called {call} with different arguments ({_by_rank(descriptions)})"


class BatchAgreement:
    """A batch's description for the workers' agreement; dense shapes that are unknown while
    tracing are filled in from the arrays at each step."""

    def __init__(self, description: dict):
        self.description = description
        tensors = description["tensors"]
        self.open = [i for i, (kind, _, shape) in enumerate(tensors)
                     if kind == "dense" and (shape is None or None in shape)]
        self.fixed = None if self.open else signature(description)

    def signature(self, shapes: dict[int, tuple] | None = None) -> Signature:
        if self.fixed is not None:
            return self.fixed
        tensors = list(self.description["tensors"])
        for i in self.open:
            kind, dtype, _ = tensors[i]
            tensors[i] = (kind, dtype, tuple(shapes[i]) if shapes and i in shapes else None)
        return signature(dict(self.description, tensors=tuple(tensors)))
