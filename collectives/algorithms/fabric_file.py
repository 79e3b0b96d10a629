"""A fabric as a file: ``Fabric.from_json`` reads the fields ``Fabric.to_json`` (or
``collectives probe --json``) wrote, and refuses, naming the field, any that is missing or of
the wrong kind. Read as it was, a wrong field (a number as text, a negative latency) broke
``auto`` at a later call with a bare TypeError naming no file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

# a Fabric's fields that are numbers of seconds (or counts) at least 0
NUMBERS = ("gamma", "overhead", "round_overhead", "native_overhead", "call_overhead", "cores",
           "crowding", "crowding_message")


def fields(text: str, links: Sequence[str]) -> dict[str, Any]:
    """The keyword arguments of ``Fabric`` that ``text`` holds (fields an older file lacks
    are left out: they keep their defaults), its ``links`` (the link classes' names) as the
    keyword arguments of their ``Link``; ValueError naming what is wrong."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"a fabric is a JSON object of fields, not {type(data).__name__}")
    try:
        for name in links:
            link = data[name]
            for part in ("alpha", "beta", "two_way"):
                if part in link or part != "two_way":
                    number(link[part], f"{name}.{part}")
        data["gammas"] = tuple((str(n), number(g, f"gammas[{n!r}]"))
                               for n, g in data.get("gammas", ()))
        data["measured"] = tuple((m, c, n, tuple(tuple(p) for p in pts))
                                 for m, c, n, pts in data.get("measured", ()))
        data["raw"] = tuple(tuple(r) for r in data.get("raw", ()))
        data["checks"] = tuple(tuple(c) for c in data.get("checks", ()))
        data["flags"] = tuple(data.get("flags", ()))
        data["probed"] = tuple(data["probed"]) if data.get("probed") is not None else None
        for name in NUMBERS:
            if name in data:
                number(data[name], name)
        for name in ("serial", "nic_shared"):
            if not isinstance(data.get(name, False), bool):
                raise ValueError(f"a fabric's {name} is {data[name]!r}: true or false")
        for method, _, count, points in data["measured"]:
            for nbytes, seconds in points:
                number(nbytes, f"measured {method} ({count} elements) bytes")
                number(seconds, f"measured {method} ({count} elements) seconds")
    except (KeyError, TypeError) as exc:
        raise ValueError(f"a fabric's fields are missing or of the wrong kind: "
                         f"{type(exc).__name__}: {exc}") from None
    return data


def number(value: object, name: str) -> float:
    """``value``, a finite number at least 0; else a ValueError naming the field ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"a fabric's {name} is {value!r}: a finite number at least 0 is due")
    return value
