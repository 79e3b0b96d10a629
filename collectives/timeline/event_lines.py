"""A recorded event as one line of Chrome's trace-event JSON (``format_event``), built fast:
the hooks pass tuples, and dicts they reuse (a call's signature, a round's sends and
receives) are encoded once and cached by identity; names are quoted once."""

from __future__ import annotations

import json
from typing import Any

_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)
_encoded: dict[int, tuple[Any, str]] = {}  # args dicts the hooks reuse -> their JSON
_quoted: dict[str, str] = {}  # events' names -> their JSON


def _json(value: Any) -> str:
    """JSON of a dict the hooks may pass again and again (a call's signature, a round's
    sends and receives: built once and never changed), cached by identity."""
    found = _encoded.get(id(value))
    if found is not None and found[0] is value:
        return found[1]
    text = _ENCODER.encode(value)
    if len(_encoded) > 8192:
        _encoded.clear()
    _encoded[id(value)] = (value, text)
    return text


def _args(args: Any) -> str:
    """An event's args as JSON. Besides a dict, the hooks pass what is cheaper to record:
    ``(dict, fragment)`` (the dict's members plus a JSON fragment of this event's own),
    ``("for", ranks, call, round)`` (a wait) and ``("from", rank, bytes)`` (a reduction)."""
    if type(args) is dict:
        return _json(args)
    kind = args[0]
    if kind == "for":
        _, ranks, call, index = args
        tail = f',"round":{index}' if index is not None else ""
        return f'{{"for":[{",".join(map(str, ranks))}],"call":{call}{tail}}}'
    if kind == "from":
        return f'{{"from":{args[1]},"bytes":{args[2]}}}'
    base = _json(args[0])
    return f"{base[:-1]},{args[1]}}}" if len(base) > 2 else f"{{{args[1]}}}"


def format_event(event: tuple) -> str:
    ph, pid, tid, ts, name, cat, args, dur = event
    out = f'{{"ph":"{ph}","pid":{pid},"tid":{tid}'
    if ph != "M":
        out += f',"ts":{ts // 1000}.{ts % 1000:03d}'
    if name is not None:
        text = _quoted.get(name)
        if text is None:
            text = _quoted[name] = _ENCODER.encode(name)
            if len(_quoted) > 4096:
                _quoted.clear()
        out += f',"name":{text}'
    if cat is not None:
        out += f',"cat":"{cat}"'
    if ph == "X":
        out += f',"dur":{dur // 1000}.{dur % 1000:03d}'
    elif ph == "i":
        out += ',"s":"t"'
    if args:
        out += f',"args":{_args(args)}'
    return out + "}"
