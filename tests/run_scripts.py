"""Run several scripts one after another in this one process, each as ``__main__``.

    python tests/run_scripts.py PLAN.json OUTDIR [--fork JOBS --preload MODULE,...]

``PLAN.json`` lists the scripts: ``[{"label": ..., "script": ..., "argv": [...], "cwd": ...}]``
(``argv`` and ``cwd`` optional). Each script runs in a fresh namespace (``runpy``), from its
``cwd`` (default: its folder), with ``sys.argv`` and ``sys.path[0]`` as ``python SCRIPT ARGV``
would set them; its stdout and stderr (file descriptors 1 and 2, so C++ logging too) go to
``OUTDIR/LABEL.out`` and ``OUTDIR/LABEL.err``, and its exit status, as Python would give it
(0, ``sys.exit``'s code, 1 for an uncaught exception, whose traceback goes to its stderr), to
``OUTDIR/LABEL.status``. A script that fails does not stop the ones after it.

For scripts whose process-wide setup agrees (the same TensorFlow devices, say): they pay for
the interpreter and its large imports (TensorFlow: about 6 s of CPU) once, not once each.

``--fork JOBS``: each script runs in a process of its own all the same, forked from this one
once it has imported the ``--preload`` modules (NumPy and the library: about 0.5 s of CPU a
start), up to JOBS at a time; its exit status is that process's, after Python's own exit (its
threads joined, its ``atexit`` functions run). A script gets a new process only for itself,
so nothing one does reaches another; a script that must import a preloaded module itself
(say, after setting an environment variable it reads) does not belong in such a plan. An item's
``timeout`` (seconds, default 300) ends its process with SIGKILL.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import time
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


def run_here(plan: list, outdir: Path) -> None:
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


def run_forked(plan: list, outdir: Path, jobs: int) -> int | None:
    """Each item in a forked process, ``jobs`` at a time. Returns None here, and in a child
    the status it is to exit with (the caller exits with it, as Python exits a script)."""
    queue, running = list(plan), {}
    while queue or running:
        while queue and len(running) < jobs:
            item = queue.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child: the script's own process
                for fd, suffix in ((1, "out"), (2, "err")):
                    with open(outdir / f"{item['label']}.{suffix}", "wb") as f:
                        os.dup2(f.fileno(), fd)
                return run_one(item, outdir)
            running[pid] = (item, time.monotonic() + item.get("timeout", 300))
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for pid, (item, deadline) in running.items():
                if time.monotonic() > deadline and not item.get("killed"):
                    item["killed"] = True
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
            continue
        item, _ = running.pop(pid)
        if item.get("killed"):
            with open(outdir / f"{item['label']}.err", "a") as err:
                err.write(f"\n(killed after its {item.get('timeout', 300)} s)\n")
        (outdir / f"{item['label']}.status").write_text(str(os.waitstatus_to_exitcode(status)))
    return None


def main() -> int | None:
    plan, outdir = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]).resolve()
    if "--fork" not in sys.argv:
        run_here(plan, outdir)
        return None
    jobs = int(sys.argv[sys.argv.index("--fork") + 1])
    if "--preload" in sys.argv:
        for name in sys.argv[sys.argv.index("--preload") + 1].split(","):
            __import__(name)
    return run_forked(plan, outdir, jobs)


if __name__ == "__main__":
    sys.exit(main())
