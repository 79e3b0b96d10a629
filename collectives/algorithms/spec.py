"""All-reduce specs: which algorithm (and how many shards) reduces which tensors.

A spec is a list of ``SpecRange`` ``(algorithm, shards, limit)``. A tensor of ``n``
**elements** (not bytes) goes to the first range with ``n <= limit``; the last range has
``limit == -1`` (no limit). Every form TensorFlow accepts is accepted by ``parse_spec``:

* a plain algorithm name: ``"pscpu/pscpu"``, ``"ring"``, ``"auto"`` -> one range, 1 shard;
* a tuple ``(alg,)``, ``(alg, shards)`` or ``(alg, shards, limit)`` (namedtuples included,
  e.g. TF's ``AllReduceSpecTuple``), or a list of such tuples;
* the tf_cnn_benchmarks grammar ``"pscpu:2k:pscpu#2:64k:xring"``: algorithm parts
  (``ALG`` or ``ALG#SHARDS``) alternating with limits (an integer with an optional ``K``/``k``,
  ``M``, ``G`` or ``T`` suffix, powers of 1024). A string is read as the grammar when it
  contains ``:`` or ``#``, otherwise as a plain name.

Algorithm names are checked with ``collectives.algorithms.canonical``, so this library's
names, TensorFlow's (``nccl``, ``xring``, ``pscpu``, ``psgpu``, ``collective``, ...) and any
``"A/B"`` composition of them are accepted; ``SpecRange.algorithm`` keeps the user's text.

Differences from TensorFlow, all of them raising where TensorFlow misbehaves:

* non-integer shards (``"xring#a"``) raise ValueError (TensorFlow raises a TypeError from a
  broken format string); shards must be >= 1 (TensorFlow takes 0 or negatives silently);
* text after a second ``#`` (``"xring#2#x"``) is rejected (TensorFlow ignores it);
* limits are checked: every range but the last has a positive limit, limits strictly
  increase, and the last range's limit is -1 (TensorFlow is silent and later trips an
  ``assert`` or leaves tensors unreduced);
* an unsupported type (dict, int, None) raises TypeError (TensorFlow silently keeps an empty
  spec); an empty list or tuple raises ValueError;
* the limit is documented as a number of elements, which is what TensorFlow's code compares
  (its ``MultiWorkerAllReduce`` docstring says bytes).

``assign_ranges`` only partitions tensor indices; callers keep results in input order
(TensorFlow's ``MultiWorkerAllReduce`` returned small-tensor ranges first).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NamedTuple, TypeVar

from . import canonical

__all__ = [
    "SpecRange",
    "assign_ranges",
    "group_device_names",
    "parse_general_int",
    "parse_spec",
    "pick_range",
]

T = TypeVar("T")

_ACCEPTED = ("a string such as 'pscpu/pscpu' or 'pscpu:2k:pscpu#2:64k:xring', a tuple "
             "(algorithm[, shards[, limit]]) or a list of such tuples")
_GENERAL_INT = re.compile(r"(\d+)([KkMGT]?)$")
_SUFFIX = {"": 1, "K": 1024, "k": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class SpecRange(NamedTuple):
    """One range of a spec: tensors of at most ``limit`` elements (-1: any size)."""

    algorithm: str
    shards: int
    limit: int


def parse_general_int(text: str) -> int:
    """``"64k"`` -> 65536: digits with an optional K/k/M/G/T suffix (powers of 1024), else int()."""
    # re.match with "$" (not fullmatch) is TensorFlow's exact rule, trailing newline included.
    match = _GENERAL_INT.match(text)
    if match:
        return int(match.group(1)) * _SUFFIX[match.group(2)]
    return int(text)


# what transports call their own collectives (MPI's; its shared window): asked of a transport
# that has none, they are no unknown algorithm
TRANSPORT_WORDS = ("native", "mpi", "shm", "shared_memory")


def not_this_transports(algorithm: str, extra_names: Sequence[str]) -> ValueError:
    """The error for ``algorithm``, one of ``TRANSPORT_WORDS`` that is not among the
    transport's own ``extra_names``."""
    has = (f"its own are {', '.join(repr(n) for n in extra_names)}" if extra_names
           else "it has none (thread ranks, one process's devices)")
    return ValueError(f"algorithm={algorithm!r} names a transport's own collective, and this "
                      f"call's transport does not run that one: {has}; use 'auto' or one of "
                      "the library's schedules ('ring', 'rechd', 'tree', ...)")


def _check_algorithm(alg: Any, where: str, extra_names: Sequence[str] = ()) -> None:
    # Re-raise canonical()'s error with the spec fragment, keeping its exception type.
    if isinstance(alg, str) and alg.strip().lower() in extra_names:
        return
    if isinstance(alg, str) and alg.strip().lower() in TRANSPORT_WORDS:
        raise ValueError(f"all_reduce_spec {where}: {not_this_transports(alg, extra_names)}")
    try:
        canonical(alg, argument="algorithm")
    except (TypeError, ValueError) as err:
        raise type(err)(f"all_reduce_spec {where}: {err}") from None


def _whole(value: Any, what: str, where: str) -> int:
    # bool is an int subclass, but True shards is certainly a mistake.
    if isinstance(value, bool):
        raise ValueError(f"all_reduce_spec {where}: {what} must be a whole number, not {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"all_reduce_spec {where}: {what} must be a whole number, "
                         f"not {value!r}") from None


def _check_shards(shards: int, where: str) -> None:
    if shards < 1:
        raise ValueError(f"all_reduce_spec {where}: shards={shards} must be 1 or more")


def _check_limits(ranges: list[SpecRange], where: list[str]) -> None:
    last = len(ranges) - 1
    for i, rng in enumerate(ranges):
        if i == last:
            if rng.limit != -1:
                raise ValueError(
                    f"all_reduce_spec {where[i]}: the last range must have limit -1 (no limit) "
                    f"so that every tensor has a range, not {rng.limit}")
        elif rng.limit <= 0:
            raise ValueError(
                f"all_reduce_spec {where[i]}: limit={rng.limit}; every range but the last needs "
                "a positive limit (a number of elements)")
        elif i > 0 and rng.limit <= ranges[i - 1].limit:
            raise ValueError(
                f"all_reduce_spec {where[i]}: limit {rng.limit} is not greater than the previous "
                f"range's limit {ranges[i - 1].limit}; limits must strictly increase")


def _from_tuple(item: Any, extra_names: Sequence[str] = ()) -> SpecRange:
    where = repr(item)
    if not isinstance(item, tuple):
        raise ValueError(f"all_reduce_spec: a tuple (algorithm[, shards[, limit]]) is expected, "
                         f"not {where}")
    if not 1 <= len(item) <= 3:
        raise ValueError(f"all_reduce_spec tuple {where} has {len(item)} elements; "
                         "expected (algorithm[, shards[, limit]])")
    alg = item[0]
    _check_algorithm(alg, f"tuple {where}", extra_names)
    shards = _whole(item[1], "shards", f"tuple {where}") if len(item) > 1 else 1
    _check_shards(shards, f"tuple {where}")
    limit = _whole(item[2], "limit", f"tuple {where}") if len(item) > 2 else -1
    return SpecRange(alg, shards, limit)


def _parse_grammar(spec: str, extra_names: Sequence[str] = ()) -> list[SpecRange]:
    # The implicit "-1" gives the last algorithm part its unlimited range.
    parts = spec.split(":") + ["-1"]
    if len(parts) % 2:
        raise ValueError(
            f"all_reduce_spec {spec!r} is not well formed: it ends with the limit {parts[-2]!r}; "
            "algorithms and limits must alternate and end with an algorithm "
            "(e.g. 'pscpu:2k:pscpu#2:64k:xring')")
    ranges: list[SpecRange] = []
    where: list[str] = []
    count = len(parts) // 2
    for i, (alg_part, limit_part) in enumerate(zip(parts[::2], parts[1::2], strict=True)):
        # The last limit is the implicit "-1", not text the user wrote.
        fragment = alg_part if i == count - 1 else f"{alg_part}:{limit_part}"
        pieces = alg_part.split("#")
        alg = pieces[0]
        if len(pieces) > 2:
            raise ValueError(f"all_reduce_spec {spec!r}: {alg_part!r} has more than one '#'; "
                             "expected ALG or ALG#SHARDS")
        shards = 1
        if len(pieces) == 2:
            try:
                shards = int(pieces[1])
            except ValueError:
                raise ValueError(
                    f"all_reduce_spec {spec!r} contains non-integer shards {pieces[1]!r} in "
                    f"{alg_part!r}; expected ALG#N with a whole number N >= 1") from None
        _check_algorithm(alg, f"{spec!r} part {alg_part!r}", extra_names)
        _check_shards(shards, f"{spec!r} part {alg_part!r}")
        try:
            limit = parse_general_int(limit_part)
        except ValueError:
            raise ValueError(
                f"all_reduce_spec {spec!r} contains non-integer range {limit_part!r}; expected "
                "a whole number of elements with an optional K/k, M, G or T suffix") from None
        ranges.append(SpecRange(alg, shards, limit))
        where.append(f"{spec!r} range {fragment!r}")
    _check_limits(ranges, where)
    return ranges


def parse_spec(spec: str | tuple | Sequence[tuple],
               extra_names: Sequence[str] = (), argument: str = "all_reduce_spec"
               ) -> list[SpecRange]:
    """Normalise any accepted all-reduce spec form to a checked list of ``SpecRange``.

    ``extra_names``: algorithm names a transport adds (e.g. MPI's "native"); ``argument``:
    the argument errors name (the library's calls take a spec as ``algorithm``; TensorFlow's
    name, ``all_reduce_spec``, by default).
    """
    try:
        try:  # (keyed by the parts' types too: ("ring", 2.0) must not hit ("ring", 2)'s entry)
            kinds = tuple(map(type, spec)) if isinstance(spec, tuple) else type(spec)
            return list(_parse_cached(spec, kinds, tuple(extra_names)))
        except TypeError as exc:  # an unhashable spec (a list): parse without the cache
            if "unhashable" not in str(exc):
                raise
            return _parse(spec, tuple(extra_names))
    except (TypeError, ValueError) as exc:
        if argument == "all_reduce_spec":
            raise
        raise type(exc)(_named(str(exc), spec, argument)) from None


def _named(message: str, spec: Any, argument: str) -> str:
    """A spec's error as ``argument`` names it: ``algorithm='rign': unknown algorithm ...``
    where the whole spec is that one bad name, else ``algorithm`` for ``all_reduce_spec``
    (the batch calls named TensorFlow's argument, which their callers never wrote)."""
    whole = f"all_reduce_spec {spec!r}: "
    if message.startswith(whole) and message[len(whole):].startswith(f"{argument}="):
        return message[len(whole):]
    return argument + message.removeprefix("all_reduce_spec")


@lru_cache(maxsize=512)
def _parse_cached(spec, kinds, extra_names: tuple[str, ...]) -> tuple[SpecRange, ...]:
    return tuple(_parse(spec, extra_names))


def _parse(spec, extra_names: tuple[str, ...]) -> list[SpecRange]:
    if isinstance(spec, str):
        if ":" in spec or "#" in spec:
            return _parse_grammar(spec, extra_names)
        _check_algorithm(spec, repr(spec), extra_names)
        return [SpecRange(spec, 1, -1)]
    if isinstance(spec, tuple):
        if not spec:
            raise ValueError(f"all_reduce_spec is an empty tuple; expected {_ACCEPTED}")
        ranges = [_from_tuple(spec, extra_names)]
        _check_limits(ranges, [f"tuple {spec!r}"])
        return ranges
    if isinstance(spec, list):
        if not spec:
            raise ValueError(f"all_reduce_spec is an empty list; expected {_ACCEPTED}")
        ranges = [_from_tuple(item, extra_names) for item in spec]
        _check_limits(ranges, [f"tuple {item!r}" for item in spec])
        return ranges
    raise TypeError(f"all_reduce_spec must be {_ACCEPTED}, not {type(spec).__name__} {spec!r}")


def spec_key(spec: Any) -> Any:
    """A key for caches of what a spec (or any argument) validated to: lists become tuples,
    and every part carries its type (``("ring", 2.0)`` and ``("ring", 2)``, ``True`` and
    ``1`` are equal, but only one of each is valid: a cache keyed by the value let the
    other skip its checks)."""
    if spec is None or type(spec) is str:  # (the common case, its own key: no cost per call)
        return spec
    if isinstance(spec, (list, tuple)):
        return type(spec).__name__, tuple(spec_key(s) for s in spec)
    return type(spec).__name__, spec


def with_shards(spec: Any, ranges: Sequence[SpecRange], shards: int) -> list[SpecRange]:
    """``spec``'s ``ranges`` with a call's ``shards=`` (0: none given), as every call reads
    them: a plain name (no ``:`` or ``#``) takes it (0: the algorithm's default); the ranges
    of a spec that set no count of their own (1) take it, and one that sets another raises
    ``ValueError``."""
    if isinstance(spec, str) and ":" not in spec and "#" not in spec:
        return [ranges[0]._replace(shards=shards)]
    if not shards:
        return list(ranges)
    if any(r.shards not in (1, shards) for r in ranges):
        raise ValueError(f"shards={shards} conflicts with the all-reduce spec {spec!r}, which "
                         "sets its own; put them in the spec (e.g. 'xring#2', ('xring', 2)) "
                         "or pass the plain name")
    return [r._replace(shards=shards) for r in ranges]


def pick_range(ranges: Sequence[SpecRange], count: int) -> SpecRange:
    """The range a tensor of ``count`` elements belongs to (the first whose limit admits it)."""
    for rng in ranges:
        if rng.limit < 0 or count <= rng.limit:
            return rng
    raise ValueError(f"a tensor of {count} elements exceeds every range's limit "
                     f"({', '.join(str(r.limit) for r in ranges)}); end the spec with limit -1")


def assign_ranges(sizes: Sequence[int], ranges: Sequence[SpecRange]) -> list[list[int]]:
    """Per range, the indices (in input order) of the tensors it reduces; sizes in elements."""
    out: list[list[int]] = [[] for _ in ranges]
    for index, size in enumerate(sizes):
        for slot, rng in enumerate(ranges):
            # A negative limit is "no limit", as in TensorFlow's `limit < 0` test.
            if rng.limit < 0 or size <= rng.limit:
                out[slot].append(index)
                break
        else:
            raise ValueError(f"tensor {index} has {size} elements, more than every range's limit "
                             f"({', '.join(str(r.limit) for r in ranges)}); end the spec with a "
                             "range of limit -1")
    return out


def group_device_names(devices: Sequence[T], group_size: int) -> list[list[T]]:
    """Split ``devices`` into ceil(n / group_size) groups of ``group_size``, reusing devices."""
    n = len(devices)
    if group_size > n:
        raise ValueError(f"only {n} devices, but group_size={group_size}")
    # TensorFlow would divide by zero here; a clear message is better.
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be 1 or more")
    num_groups = -(-n // group_size)
    groups: list[list[T]] = [[] for _ in range(num_groups)]
    # Round-robin over groups; the last devices wrap to the start so every group is full.
    for i in range(num_groups * group_size):
        groups[i % num_groups].append(devices[i % n])
    return groups
