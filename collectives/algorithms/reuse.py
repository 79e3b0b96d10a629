"""Fused buckets kept from one batched call to the next, as DDP's reducer keeps its buckets.

A training loop all-reduces the same gradient list every step, and most of a fused call's
host time on a GPU goes to making things anew: a bucket per pack, and one view of it per
tensor (CuPy and PyTorch each spend microseconds per view; 161 of them for ResNet-50). When a
call's results are no longer referenced by the time the next call of the same plan starts,
nothing can tell the buckets were used before: that call packs into the same buckets and
hands back the same view objects (results are still fresh values, still views of their
bucket), where each still has the form it was handed out in (a caller may set a dropped
result's shape, make it read-only or make a tensor require grad: then the views are new).
Where anything still refers to a bucket or a result of the last call (a result kept across
steps, a view of one, a handle in flight, a DLPack export), the call packs into the bucket of
the call before (``GENERATIONS``: a loop such as ``averaged = buckets.wait()`` holds one
step's results while it packs the next, and lets go of the step's before), or makes new ones
where that one is held too, as it would without this.

An array backend takes part by having ``keep(bucket, views)``, which returns what it needs to
tell later (for instance how many references the bucket's memory has now), or None where it
cannot; ``unshared(bucket, views, kept)``, whether anything but the keeper refers to them
now; and ``address(x)``, the first byte of ``x``'s memory (NumPy's, ``NumpyArrays``: a
bucket is a view of an owner buffer that every view of it refers to, so the owner's holders
are counted; PyTorch's and CuPy's count the references to the memory; each counts the
views' own holders with ``result_pool.held_by_one``). Backends without them never reuse. A
keeper holds at most ``KEPT_PLANS`` plans' buckets (the memory of one step's
buckets each, as DDP holds), or as many as its owner asks, and belongs to one communicator,
or one thread of multi-device calls.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

KEPT_PLANS = 4  # tensor lists whose buckets a keeper holds at most (the least recent go)
# buckets kept per pack: the last call's, and the one's before, which a loop that still holds
# the last step's results while it packs the next can take (with one, that loop made new
# buckets at every step: two thirds of them, 14 of 21 over three steps)
GENERATIONS = 2


class Kept:
    """One pack's bucket of one member and its views, the backend's record of them, and
    whether a call is packing into it now (``taken``: from ``bucket`` until ``views``)."""

    __slots__ = ("bucket", "views", "record", "taken")

    def __init__(self, bucket: Any, views: tuple, record: Any) -> None:
        self.bucket, self.views, self.record, self.taken = bucket, views, record, False


class BucketKeeper:
    """The buckets of the last calls (``GENERATIONS``) of each of a few plans, by ``(plan,
    pack, member)``, the most recent last."""

    def __init__(self, arrays: Any, plans: int = 0) -> None:
        """``plans``: how many plans' buckets it holds at most (0: ``KEPT_PLANS``; a step of
        ``comm.buckets`` under a spec of ranges has a plan per bucket, all kept)."""
        self.arrays = arrays
        self.plans = max(plans, KEPT_PLANS)
        self.enabled = all(hasattr(arrays, name) for name in ("keep", "unshared", "address"))
        self._plans: OrderedDict[int, tuple[Any, dict]] = OrderedDict()

    def _entries(self, plan: Any, create: bool) -> dict | None:
        held = self._plans.get(id(plan))
        if held is not None and held[0] is plan:
            self._plans.move_to_end(id(plan))
            return held[1]
        if not create:
            return None
        if len(self._plans) >= self.plans:
            self._plans.popitem(last=False)
        entries: dict = {}
        self._plans[id(plan)] = (plan, entries)
        return entries

    def bucket(self, plan: Any, pack: int, member: int) -> tuple[Any, tuple] | None:
        """A kept bucket to pack into and its views, where no call is packing into it (an
        asynchronous one still in flight) and nothing else refers to its views or their
        memory; else None (those others refer to stay kept: once let go, a later call
        takes them)."""
        if not self.enabled:
            return None
        entries = self._entries(plan, create=False)
        for kept in (entries or {}).get((pack, member), ()):
            if not kept.taken and self.arrays.unshared(kept.bucket, kept.views, kept.record):
                kept.taken = True
                return kept.bucket, kept.views
        return None

    def views(self, plan: Any, pack: int, member: int, reduced: Any) -> tuple | None:
        """For the call that took this bucket (``bucket``), now done with it: the kept views,
        where ``reduced`` is the bucket (reduced in place), else None; the bucket is free
        again either way."""
        entries = self._entries(plan, create=False) if self.enabled else None
        taken = [kept for kept in (entries or {}).get((pack, member), ()) if kept.taken]
        if not taken:
            return None
        address = self.arrays.address(reduced)
        for kept in taken:
            if reduced is kept.bucket or address == self.arrays.address(kept.bucket):
                kept.taken = False
                return kept.views
        if len(taken) == 1:  # (reduced into another array: the bucket is free again; with
            taken[0].taken = False  # several taken, which is this call's is not known: they
        return None  # stay taken, and the fresh ones ``keep`` adds push them out)

    def keep(self, plan: Any, pack: int, member: int, bucket: Any, views: list) -> None:
        """Keep a fresh bucket and its views for the next call of ``plan``."""
        if not self.enabled:
            return
        views_kept = tuple(views)
        record = self.arrays.keep(bucket, views_kept)
        entries = self._entries(plan, create=True)
        assert entries is not None
        if record is None:
            entries.pop((pack, member), None)
            return
        kept = entries.setdefault((pack, member), [])
        kept.append(Kept(bucket, views_kept, record))
        while len(kept) > GENERATIONS:  # (the oldest one no call packs into goes first, never
            # the one just kept: with the others stuck taken by failed calls, it went at once)
            kept.remove(next((k for k in kept[:-1] if not k.taken), kept[0]))


def keeper_in(keepers: dict, arrays: Any) -> BucketKeeper:
    """The keeper of ``arrays``' library in ``keepers`` (a communicator's, or a thread's),
    made on first use."""
    keeper = keepers.get(arrays.name)
    if keeper is None or keeper.arrays is not arrays:
        keeper = keepers[arrays.name] = BucketKeeper(arrays)
    return keeper
