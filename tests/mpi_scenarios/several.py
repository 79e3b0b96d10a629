"""Several scenarios in one MPI job, one after another: each pays for a job of its own (a Python
with NumPy, mpi4py and the library imported on every rank, MPI started) only once.

Usage: ``mpiexec -n N python several.py PLAN``, PLAN a JSON list of ``{"label": ..., "script":
..., "args": [...], "env": {...}}`` (an env value of null unsets the variable). Every rank runs
each script as ``__main__`` (a namespace of its own, its own communicators), with ``sys.argv``
and the environment as given while it runs; rank 0 prints ``BEGIN label`` before it and ``END
label exit=CODE`` after it (CODE: what the script's ``Report.finish`` exited with, 0 if it
returned), so each scenario's output can be told apart. A failed scenario does not stop the
ones after it; an uncaught exception aborts the job, as it does a scenario run alone. The job
exits non-zero if any scenario failed.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

from _common import WORLD, environment, meet

HERE = os.path.dirname(os.path.abspath(__file__))


def run(item: dict) -> int:
    path = os.path.join(HERE, item["script"])
    saved_argv = sys.argv
    sys.argv = [path, *item.get("args", [])]
    try:
        with environment(item.get("env")):
            runpy.run_path(path, run_name="__main__")
        return 0
    except SystemExit as exc:  # Report.finish on a failure: every rank exits alike
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved_argv


def main() -> None:
    failed = False
    for item in json.loads(sys.argv[1]):
        meet()  # every rank starts it together, as in a job of its own
        if WORLD.rank == 0:
            print(f"BEGIN {item['label']}", flush=True)
        code = run(item)
        sys.stdout.flush()
        if WORLD.rank == 0:
            print(f"END {item['label']} exit={code}", flush=True)
        failed = failed or code != 0
    meet()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
