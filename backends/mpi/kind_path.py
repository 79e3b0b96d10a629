"""The MPI hot path on another library's host arrays (PyTorch CPU tensors), by address.

A repeated small all-reduce of NumPy arrays runs as ``Bound.quick`` (``hot_path.py``). A
tensor would cross the edge on every call instead (a NumPy view in, a tensor back, and the
communicator's routing between them): at 4 KiB that was most of the call. Once the tensor's
signature has a hot path, ``KindBound`` runs it on the tensors themselves: the kind gives
each one's address where it may be used by address (``host_address``), the result comes
from the kind's ``empty_like`` (its address: ``pointer``), and the compiled hot path takes
the two addresses (``Hot.run_at``): the same copies, MPI calls and check as a NumPy call's.
A tensor the edge would refuse (one that requires grad, a lazy conjugate) or hand over
otherwise (a strided one) takes the engine's way, which says what to do. Where the hot path
is not compiled, ``Bound.quick`` runs on NumPy views of the same memory; a call still running
after the spin completes through the engine as any other, its result delivered into the
tensor's memory.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from collectives.runtime.transport import PENDING


@runtime_checkable
class HostPointers(Protocol):
    """What an array kind (``collectives.foreign``) tells the hot path about its arrays."""

    def host_address(self, x: Any) -> int | None:
        """The address of ``x``'s first element where ``x`` may be read and written by
        address: host memory, C-contiguous, holding its values as they are and untracked
        (not requiring grad, no lazy conjugate or negation); else None."""
        ...

    def empty_like(self, x: Any) -> Any:
        """A new C-contiguous array of ``x``'s shape, dtype and device."""
        ...

    def pointer(self, x: Any) -> int:
        """The address of ``x``'s first element, for an array known to be one ``host_address``
        takes (one ``empty_like`` made from such an array)."""
        ...

    def as_numpy(self, x: Any) -> Any:
        """A NumPy view of host array ``x``'s memory."""
        ...


class KindBound:
    """``Bound.quick`` on the arrays of ``kind`` (see the module's docstring)."""

    __slots__ = ("bound", "kind", "out")

    def __init__(self, bound: Any, kind: HostPointers):
        self.bound, self.kind = bound, kind
        self.out: Any = None  # the array a PENDING run delivers into

    def issue(self, x: Any, out: Any, seq: int) -> Any:
        """None: another library's arrays take the engine's way when asynchronous."""
        return None

    def quick(self, x: Any, out: Any, seq: int) -> Any:
        """Run call ``seq`` on ``x`` into ``out`` (None: a new array): the result, ``PENDING``
        or None where the engine's way must run it (nothing was started)."""
        kind, bound = self.kind, self.bound
        src = kind.host_address(x)
        if src is None:
            return None  # (the engine's way takes it, or says what is wrong)
        if out is None:
            out = kind.empty_like(x)
            dst = kind.pointer(out)  # (made here: nothing to look at again)
        elif out is x:
            dst = src
        else:
            address = kind.host_address(out)
            if address is None:
                return None
            dst = address
        if bound.compiled is not None:
            got = bound.quick_at(src, dst, lambda: kind.as_numpy(out), seq)
        else:  # the Python hot path, on views of the same memory
            got = bound.quick(kind.as_numpy(x), kind.as_numpy(out), seq)
        if got is None:
            return None
        if got is PENDING:
            self.out = out
            return PENDING
        return out

    def deliver(self) -> Any:
        """The result of the last ``PENDING`` run, once complete (``Bound.deliver``)."""
        self.bound.deliver()  # (into a NumPy view of self.out's memory)
        out, self.out = self.out, None
        return out

    def advance(self) -> bool:
        return self.bound.advance()

    def pending_peers(self) -> list[int]:
        return self.bound.pending_peers()

    def free(self) -> None:
        self.bound.free()
