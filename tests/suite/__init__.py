"""The SPMD test suite, written once: bodies any transport runs (thread ranks in-process, MPI
ranks under mpiexec, later NCCL). See ``bodies.py`` and ``runner.py``."""
