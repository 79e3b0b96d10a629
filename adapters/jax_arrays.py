"""JAX arrays as an array kind: results come back as JAX arrays, and ``out=`` is refused.

JAX arrays are immutable, so nothing is written into one: an ``out=`` that is a JAX array
raises TypeError before any data moves (use the returned array), and a batch of them is not
packed on JAX's side (packing writes into its buckets); each array crosses into the library
through DLPack on its own (a NumPy view on the CPU, a CuPy array on the same GPU memory), and
the library packs. Results go back with ``back``: a NumPy result becomes a JAX array (one copy,
as ``jax.numpy.asarray`` makes; on the caller's device where its array was committed to one),
a CuPy result one on the same GPU memory (``jax.numpy.from_dlpack``).

Found through the ``collectives.array_kinds`` entry points (the module of that name); it
imports JAX only from the arrays it is given.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np

from collectives.log import program_level


def _jax() -> Any:
    return sys.modules["jax"]  # (a JAX array exists: JAX is imported)


class JaxArrays:
    """``jax.Array`` for ``collectives.foreign``: ``detect``, ``back`` and ``out_refusal``
    (no packing operations: the library packs the arrays' NumPy or CuPy views)."""

    name = "jax"
    out_refusal = "JAX arrays are immutable, so a result cannot be written into one"

    @staticmethod
    def detect(x: object) -> bool:
        jax = sys.modules.get("jax")
        return jax is not None and isinstance(x, jax.Array)

    @staticmethod
    def back(result: Any, like: Any = None) -> Any:
        """``result`` (a NumPy or CuPy array) as a JAX array, placed as ``like`` is."""
        jax = _jax()
        if not isinstance(result, np.ndarray):  # GPU memory (CuPy): shared, not copied
            return jax.numpy.from_dlpack(result)
        if result.dtype == np.float64 and not jax.config.jax_enable_x64:
            # (an integer MEAN's float64 result: JAX would hold it as float32, silently)
            warnings.warn("this result is float64 (an integer MEAN's), which JAX holds as "
                          "float32 unless 64-bit types are on: jax.config.update("
                          "'jax_enable_x64', True), or cast the inputs to a float first",
                          RuntimeWarning, stacklevel=program_level())
        sharding: Any = getattr(like, "sharding", None)
        if getattr(like, "committed", False) and len(sharding.device_set) == 1:
            return jax.device_put(result, sharding)  # (committed to its device: there too)
        return jax.numpy.asarray(result)  # (bfloat16 and read-only results too)


ARRAYS = JaxArrays()
