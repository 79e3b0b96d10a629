"""The fault suite's vocabulary: cases, steps, expected outcomes, and how one rank judges its own.

A ``Case`` is a list of steps that every rank takes in order. Each step is a function of the
rank's context (``Ctx``: rank, size, transport) that returns the ``Call`` this rank makes, or
None when this rank stays away from that step (a missing rank). A ``Call`` names a method of
the communicator (or of ``collectives`` for the multi-device API), its arguments and an
``Expect``: the outcomes that are acceptable for this rank, and how fast it must get there.

``perform`` runs one call on one rank and returns a JSON-ready record that already holds the
rank's own verdict (wrong value, modified input, wrong error, too slow). What needs every rank
(bitwise identical results, a rank that never reported) is judged by ``faults.harness``.
This module imports neither pytest nor a transport, so the worker processes use it as is.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ANY = object()  # a result outcome that accepts any value

# Added to every ``within`` bound when a record is judged. A loaded machine (two test workers,
# each running ranks that poll, on two cores) can stretch a step by a second with no fault of
# the library's; every bound in the cases stays below the timeout it tells apart with this
# slack (a prompt error against one that waited a timeout of 3 s or more; a call's own 1 s
# timeout against the communicator's 5 s).
LOAD_SLACK = 1.0


@dataclass(frozen=True)
class Outcome:
    """One acceptable outcome: a result (``errors`` empty) or an exception of a named class."""

    value: Any = ANY
    rtol: float = 0.0
    check: Callable[[Any], str | None] | None = None  # extra test of a result: problem or None
    errors: tuple[str, ...] = ()  # class names, matched against the raised exception's MRO
    match: str | None = None  # regex the error message must contain


@dataclass(frozen=True)
class Expect:
    """Acceptable outcomes of one step on one rank; ``within``: seconds it may take at most."""

    outcomes: tuple[Outcome, ...]
    within: float | None = None

    def __or__(self, other: Expect) -> Expect:
        bounds = [w for w in (self.within, other.within) if w is not None]
        return Expect(self.outcomes + other.outcomes, max(bounds) if bounds else None)


def ok(value=ANY, *, rtol: float = 0.0, check=None, within: float | None = None) -> Expect:
    """The call returns ``value`` (compared bitwise, NaN equal to NaN; ``rtol`` for MEAN)."""
    return Expect((Outcome(value=value, rtol=rtol, check=check),), within)


def raises(*errors: str, match: str | None = None, within: float | None = None) -> Expect:
    """The call raises one of ``errors`` (class names; a base class accepts its subclasses)."""
    return Expect((Outcome(errors=errors, match=match),), within)


@dataclass
class Call:
    """What one rank does in one step."""

    method: str | Callable  # a method name, or a function of the communicator (custom bodies)
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    expect: Expect = field(default_factory=ok)
    delay: float = 0.0  # seconds this rank sleeps before calling (a late rank)
    caught: bool = False  # the program catches this step's error and goes on to the next step
    same: bool = True  # every rank that returns must return the same bits


@dataclass(frozen=True)
class Ctx:
    rank: int
    size: int
    transport: str  # "threads", "mpi", "mpi-nodes" or "multi"


Step = Callable[[Ctx], "Call | None"]


@dataclass(frozen=True)
class Case:
    """One named fault scenario: steps, where it runs, and its limits.

    ``timeout`` is the communicator's default deadline; ``limit`` the outer wall-clock limit
    of the whole case (beyond it the worker dumps its stacks and dies, and the case fails as a
    hang). ``xfail`` maps a transport ("threads", "mpi", "mpi-nodes", "multi"; "mpi" also
    covers "mpi-nodes"; "multi4": only with 4 participants; "*" every transport) to the name of
    a defect that still breaks it there.
    """

    name: str
    steps: tuple[Step, ...]
    where: tuple[str, ...] = ("threads", "mpi")
    sizes: tuple[int, ...] = (3,)
    timeout: float = 5.0
    check: bool = True
    limit: float = 10.0
    xfail: tuple[tuple[str, str], ...] = ()
    xfail_strict: bool = True  # False only where the defect shows in some runs, not all

    def xfail_reason(self, transport: str, size: int) -> str | None:
        for where, reason in self.xfail:
            if where in ("*", transport, f"{transport}{size}") or transport.startswith(where + "-"):
                return reason
        return None


# --- one rank's side ---------------------------------------------------------------------------

def digest(x) -> str | None:
    """Shape, dtype and bytes of a result (a list: of each element), hashed."""
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(str(digest(v)) for v in x) + "]"
    if not isinstance(x, np.ndarray):
        return repr(x)
    a = np.ascontiguousarray(x)
    h = hashlib.blake2b(a.view(np.uint8).tobytes(), digest_size=10).hexdigest()
    return f"{a.dtype}{a.shape}:{h}"


def difference(got, want, rtol: float = 0.0) -> str | None:
    """Why ``got`` is not ``want`` (arrays, None, or lists of them), or None when it is."""
    if want is ANY:
        return None
    if want is None or got is None:
        return None if got is None and want is None else f"got {_short(got)}, want {_short(want)}"
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"got {_short(got)}, want a list of {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            why = difference(g, w, rtol)
            if why:
                return f"[{i}]: {why}"
        return None
    want = np.asarray(want)
    if not isinstance(got, np.ndarray):
        return f"got {type(got).__name__}, want an ndarray"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{got.shape}, want {want.dtype}{want.shape}"
    inexact = want.dtype.kind in "fcV"  # V: bfloat16 from ml_dtypes
    if rtol:
        same = np.allclose(got.astype(np.complex128), want.astype(np.complex128), rtol=rtol,
                           atol=0, equal_nan=True)
    elif inexact:
        g, w = got.astype(np.complex128), want.astype(np.complex128)
        same = bool(np.all((g == w) | (np.isnan(g) & np.isnan(w))))
    else:
        same = np.array_equal(got, want)
    return None if same else f"got {_short(got)}, want {_short(want)}"


def _short(x) -> str:
    text = np.array2string(x, threshold=8) if isinstance(x, np.ndarray) else repr(x)
    return text if len(text) < 200 else text[:200] + "..."


def _arrays(call: Call) -> list[tuple[str, np.ndarray]]:
    """Every array the call reads (arguments, list items), labelled; ``out`` is not an input."""
    found = []

    def visit(label, v):
        if isinstance(v, np.ndarray):
            found.append((label, v))
        elif isinstance(v, (list, tuple)):
            for i, item in enumerate(v):
                visit(f"{label}[{i}]", item)

    for i, a in enumerate(call.args):
        visit(f"args[{i}]", a)
    for k, v in call.kwargs.items():
        if k != "out":
            visit(k, v)
    return found


def _outs(call: Call) -> list[np.ndarray]:
    out = call.kwargs.get("out")
    if out is None:
        return []
    return [o for o in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(o, np.ndarray)]


def perform(target, call: Call) -> tuple[dict, Exception | None]:
    """Make ``call`` on ``target`` and judge this rank's outcome: a JSON-ready record, and the
    exception the call raised (None if it returned).

    Inputs that share no memory with ``out`` must come back bit for bit unchanged.
    """
    outs = _outs(call)
    # Read-only arrays (broadcast views of huge shapes among them) cannot be written anyway.
    inputs = [(label, a, a.copy()) for label, a in _arrays(call)
              if a.flags.writeable and not any(np.shares_memory(a, o) for o in outs)]
    if call.delay:
        time.sleep(call.delay)
    fn = call.method if callable(call.method) else getattr(target, call.method)
    start = time.monotonic()
    try:
        result = fn(*call.args, **call.kwargs) if not callable(call.method) else fn(target)
    except Exception as exc:  # noqa: BLE001 - the outcome under test
        took = time.monotonic() - start
        record = {"kind": "error", "error": type(exc).__name__,
                  "bases": [c.__name__ for c in type(exc).__mro__], "message": str(exc)[:1500]}
        result = error = exc
    else:
        error = None
        took = time.monotonic() - start
        record = {"kind": "result", "digest": digest(result)}
    record["seconds"] = round(took, 4)
    record["same"] = call.same
    problems = [f"{label} was modified" for label, a, before in inputs if not unchanged(a, before)]
    verdict = judge_outcome(call.expect, record, result)
    if verdict:
        problems.append(verdict)
    record["problems"] = problems
    return record, error


def unchanged(a: np.ndarray, before: np.ndarray) -> bool:
    """Bit for bit (NaN payloads included); object arrays by element."""
    if a.dtype.kind == "O":
        return a.shape == before.shape and all(x is y for x, y in zip(a.flat, before.flat))
    return (np.ascontiguousarray(a).view(np.uint8).tobytes()
            == np.ascontiguousarray(before).view(np.uint8).tobytes())


def judge_outcome(expect: Expect, record: dict, result) -> str | None:
    """None when the record is one of the acceptable outcomes, else what went wrong."""
    if expect.within is not None and record["seconds"] > expect.within + LOAD_SLACK:
        return (f"took {record['seconds']:.2f} s, more than {expect.within:g} s "
                f"(+{LOAD_SLACK:g} s for load) "
                f"({_describe(record)})")
    reasons = []
    for o in expect.outcomes:
        if not o.errors and record["kind"] == "result":
            why = difference(result, o.value, o.rtol) or (o.check(result) if o.check else None)
            if why is None:
                return None
            reasons.append(f"wrong result: {why}")
        elif o.errors and record["kind"] == "error":
            if not set(o.errors) & set(record["bases"]):
                reasons.append(f"raised {_describe(record)}; want {' or '.join(o.errors)}")
            elif o.match and not re.search(o.match, record["message"]):
                reasons.append(f"message {record['message']!r} does not match {o.match!r}")
            else:
                return None
    if not reasons:
        want = " or ".join(" or ".join(o.errors) if o.errors else "a result" for o in expect.outcomes)
        reasons.append(f"{_describe(record)}; want {want}")
    return "; ".join(reasons)


def _describe(record: dict) -> str:
    if record["kind"] == "error":
        return f"{record['error']}: {record['message'][:300]}"
    return "returned a result"
