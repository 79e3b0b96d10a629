"""Logical CPU devices in one process: the multi-device backend for NumPy arrays."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

from collectives.algorithms.select import CostModel
from collectives.arrays import NUMPY

TILE_BYTES = 512 * 1024  # a tile of every buffer of a few participants stays in L2
PARALLEL_BYTES = 1 << 20  # below this, handing work to threads costs more than it saves


class NumpyDevices:
    """Multi-device backend for NumPy arrays (logical CPU devices in one address space).

    ``strategy``: "tiles" (every round on one cache-sized tile at a time, tiles spread over
    ``workers`` threads: one pass over memory) or "rounds" (each round over whole ranges).
    The devices share memory, so results may be views of one buffer (``shared_result=True``
    in the multi-device API).
    """

    arrays = NUMPY
    cost_model = CostModel(latency=1e-6, shared_memory=True)
    shares_memory = True

    def __init__(self, workers: int | None = None, strategy: str = "tiles"):
        if strategy not in ("tiles", "rounds"):
            raise ValueError(f"strategy={strategy!r}: use 'tiles' or 'rounds'")
        self.workers = workers or min(os.cpu_count() or 1, 8)
        self.strategy = strategy
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="collectives")

    def own(self, name: str) -> None:
        """None: the library's functions run every call on these devices."""
        return None

    def begin_call(self) -> None:
        """Nothing to order: the steps run in this thread."""

    def end_call(self) -> None:
        """Nothing to order: the steps ran in this thread."""

    def begin_round(self, index: int) -> None:
        """Nothing to order: the steps run in this thread."""

    def end_round(self, index: int) -> None:
        """Nothing to order: the steps ran in this thread."""

    def map_parallel(self, fn: Callable[[int, int], None], length: int, itemsize: int) -> None:
        """Call ``fn(a, b)`` over tiles covering ``[0, length)``, spread over the workers."""
        tile = max(1, TILE_BYTES // itemsize)
        if length * itemsize < PARALLEL_BYTES or self.workers == 1:
            for a in range(0, max(length, 1), tile):
                fn(a, min(a + tile, length))
            return
        # Tiles are handed out one at a time (itertools.count's next() is atomic), so a worker
        # that wakes late or loses its core to another process leaves its tiles to the others
        # instead of holding up the call; the combine kernels release the GIL meanwhile.
        tiles = [(a, min(a + tile, length)) for a in range(0, length, tile)]
        taken = itertools.count()

        def run():
            for i in iter(taken.__next__, None):
                if i >= len(tiles):
                    return
                fn(*tiles[i])

        futures = [self._pool.submit(run) for _ in range(min(self.workers, len(tiles)) - 1)]
        try:
            run()
        finally:
            for f in futures:
                f.result()


@lru_cache(maxsize=2)
def devices(strategy: str = "tiles") -> NumpyDevices:
    """The shared NumPy multi-device backend (one per strategy)."""
    return NumpyDevices(strategy=strategy)
