"""Routes: how the adapter reduces one group of values (spec ranges, packing, groups).

Every cross-device-ops class maps each value to a ``Route``; ``ONE_DEVICE`` is the
route of TensorFlow's ReductionToOneDevice, which the device path spreads differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collectives.algorithms.spec import SpecRange

from .host import Packing


@dataclass(frozen=True)
class Route:
    """How one group of values is reduced: spec ranges (with shards), packing, groups."""

    spec: tuple[SpecRange, ...] = (SpecRange("auto", 1, -1),)
    packing: Packing = Packing()
    groups: Any = None  # a group size, a partition, or a callable n -> groups

    def key(self, packing_override: Packing | None) -> tuple:
        """What workers must agree on (groups stay within a worker)."""
        packing = packing_override or self.packing
        return (tuple((r.algorithm, r.shards, r.limit) for r in self.spec),
                tuple(sorted(packing.kwargs().items())))


ONE_DEVICE = Route((SpecRange("one_device", 1, -1),))
