"""On ``PYTHONPATH`` (``conftest.tf_lean``) of a process that imports TensorFlow and uses neither JAX
nor matplotlib: TensorFlow's import pulls both in where they are installed (tf.lite looks for
``jax.jit``, Keras's image gallery imports ``matplotlib.pyplot``), both optional there (the
ImportError is caught). Hidden, the import takes about 8 s of CPU instead of 11 on a 2-core
machine. ``tests/tf_scenarios/common.py`` does the same inside its scenario processes."""

import sys

for _unused in ("jax", "matplotlib"):
    sys.modules.setdefault(_unused, None)  # type: ignore[assignment]
