"""Run several scripts one after another in this one process, each as ``__main__``.

    python tests/run_scripts.py PLAN.json OUTDIR

``PLAN.json`` lists the scripts: ``[{"label": ..., "script": ..., "argv": [...], "cwd": ...}]``
(``argv`` and ``cwd`` optional). Each script runs in a fresh namespace (``runpy``), from its
``cwd`` (default: its folder), with ``sys.argv`` and ``sys.path[0]`` as ``python SCRIPT ARGV``
would set them; its stdout and stderr (file descriptors 1 and 2, so C++ logging too) go to
``OUTDIR/LABEL.out`` and ``OUTDIR/LABEL.err``, and its exit status, as Python would give it
(0, ``sys.exit``'s code, 1 for an uncaught exception, whose traceback goes to its stderr), to
``OUTDIR/LABEL.status``. A script that fails does not stop the ones after it.

For scripts whose process-wide setup agrees (the same TensorFlow devices, say): they pay for
the interpreter and its large imports (TensorFlow: about 6 s of CPU) once, not once each.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from pathlib import Path


def exit_status(code) -> int:
    """The exit status ``sys.exit(code)`` gives (printing a message, as Python does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_one(item: dict, outdir: Path) -> int:
    script = Path(item["script"]).resolve()
    os.chdir(item.get("cwd") or script.parent)
    sys.argv = [str(script), *item.get("argv", [])]
    sys.path[0] = str(script.parent)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return exit_status(exc.code)
    except BaseException:  # noqa: BLE001 - reported as Python reports it, then the next script
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    plan, outdir = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]).resolve()
    saved = os.dup(1), os.dup(2)
    for item in plan:
        label = item["label"]
        sys.stdout.flush()
        sys.stderr.flush()
        with open(outdir / f"{label}.out", "wb") as out, open(outdir / f"{label}.err", "wb") as err:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            try:
                status = run_one(item, outdir)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
        (outdir / f"{label}.status").write_text(str(status))


if __name__ == "__main__":
    main()
