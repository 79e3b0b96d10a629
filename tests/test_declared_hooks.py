"""The optional hooks of transports and backends are declared, and the core never probes them.

The protocols (``collectives.runtime.transport``'s ``Transport``, ``NativeCollectives``,
``NativeRun`` and ``PersistentNative``, the executors' ``PointToPoint`` and
``DeviceBackend``) declare every member the core reads, the optional ones with their
defaults, and the bundled implementations set each one. So the core reads them as plain
attributes: these tests fail on a ``getattr(x, "name", ...)`` or ``hasattr(x, "name")`` in
the core whose receiver is a transport, a channel, a native collective or run, or a backend
and whose name a protocol declares, and on a bundled local implementation that leaves a
declared member out.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np

import collectives
from collectives import registry
from collectives.runtime import transport
from collectives.runtime.execute import devices, spmd

ROOT = Path(__file__).resolve().parent.parent
PROTOCOLS = (transport.Transport, transport.NativeCollectives, transport.NativeRun,
             transport.PersistentNative, spmd.PointToPoint, devices.DeviceBackend)
# what a receiver's source looks like when it is one of those objects
RECEIVER = re.compile(r"transport|native|\brun\b|bound|backend|channel")
# probes still in modules being rewritten elsewhere: (module, name); each entry must still be
# found, so the list only shrinks (remove an entry once its probe is gone)
KNOWN = {
    # a device backend's ``fabric``: the CuPy devices (backends/cupy/devices.py) have none yet
    ("collectives/runtime/execute/device_calls.py", "fabric"),
}


def _declared(protocol: type) -> set[str]:
    """The members ``protocol`` declares: its annotated attributes and its methods."""
    names = set(vars(protocol).get("__annotations__", {}))
    names |= {name for name, value in vars(protocol).items()
              if callable(value) and not name.startswith("_")}
    return names


HOOKS = set().union(*(_declared(p) for p in PROTOCOLS))


def _probes() -> set[tuple[str, str, int]]:
    """Every ``getattr``/``hasattr`` of a declared name on such a receiver in the core."""
    found = set()
    for path in sorted((ROOT / "collectives").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2):
                continue
            name = node.args[1]
            if (isinstance(name, ast.Constant) and name.value in HOOKS
                    and RECEIVER.search(ast.unparse(node.args[0]))):
                found.add((path.relative_to(ROOT).as_posix(), name.value, node.lineno))
    return found


def test_the_protocols_declare_the_optional_hooks():
    for hook in ("calls_may_not_return", "schedules_in_native_order", "persistent",
                 "fast_bytes", "holds_turn", "pending_peers", "quick", "begin_round",
                 "shares_memory", "own"):
        assert hook in HOOKS, f"no protocol declares {hook!r}"
    assert transport.Transport.calls_may_not_return is False
    assert transport.NativeCollectives.fast_bytes == transport.FAST_BYTES
    assert transport.NativeRun.holds_turn is False


def test_the_core_reads_declared_hooks_without_probing():
    probes = _probes()
    new = sorted(p for p in probes if (p[0], p[1]) not in KNOWN)
    assert not new, ("the core probes declared hooks with getattr/hasattr (read the attribute: "
                     f"the protocol declares it, with its default): {new}")
    gone = sorted(KNOWN - {(p[0], p[1]) for p in probes})
    assert not gone, f"these probes are gone: remove them from KNOWN in {__file__}: {gone}"


def test_the_local_backend_sets_every_declared_member():
    def members(comm):
        t = comm.transport
        return [(type(obj).__name__, name)
                for obj, protocol in ((t, transport.Transport), (t.data, spmd.PointToPoint),
                                      (t.p2p, spmd.PointToPoint))
                for name in sorted(_declared(protocol)) if not hasattr(obj, name)]

    missing = collectives.run(members, 2)[0]
    backend = registry.backend_for_arrays([np.zeros(1)])
    missing += [(type(backend).__name__, name) for name in sorted(_declared(devices.DeviceBackend))
                if not hasattr(backend, name)]
    assert not missing, f"bundled implementations leave declared members out: {missing}"
