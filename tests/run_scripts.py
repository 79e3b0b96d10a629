"""Run several scripts one after another in this one process, each as ``__main__``.

    python tests/run_scripts.py PLAN.json OUTDIR [--fork JOBS --preload MODULE,...]
    python tests/run_scripts.py --serve OUTDIR [--preload MODULE,...]

``PLAN.json`` lists the scripts: ``[{"label": ..., "script": ..., "argv": [...], "cwd": ...}]``
(``argv`` and ``cwd`` optional). Each script runs in a fresh namespace (``runpy``), from its
``cwd`` (default: its folder), with ``sys.argv`` and ``sys.path[0]`` as ``python SCRIPT ARGV``
would set them; its stdout and stderr (file descriptors 1 and 2, so C++ logging too) go to
``OUTDIR/LABEL.out`` and ``OUTDIR/LABEL.err``, and its exit status, as Python would give it
(0, ``sys.exit``'s code, 1 for an uncaught exception, whose traceback goes to its stderr), to
``OUTDIR/LABEL.status``. A script that fails does not stop the ones after it.

For scripts whose process-wide setup agrees (the same TensorFlow devices, say): they pay for
the interpreter and its large imports (TensorFlow: about 6 s of CPU) once, not once each.

``--fork JOBS``: each script runs in a process of its own all the same (stdin ``/dev/null``),
forked from this one once it has imported the ``--preload`` modules (NumPy and the library:
about 0.5 s of CPU a start), up to JOBS at a time; its exit status is that process's, after
Python's own exit (its threads joined, its ``atexit`` functions run). A script gets a new
process only for itself, so nothing one does reaches another; a script that must import a
preloaded module itself (say, after setting an environment variable it reads) does not belong
in such a plan. An item's ``timeout`` (seconds, default 300) ends its process with SIGKILL.

An item may instead give ``"code"`` (run as ``python -c CODE ARGV`` runs it: from the current
folder, ``sys.argv[0]`` ``-c``) or ``"module"`` (as ``python -m MODULE ARGV``: ``sys.path[0]``
the current folder); ``"env"``, the whole environment it runs with (in ``os.environ``, read
after the preloaded modules were imported); and, forked only, ``"tty": true``: its stderr a
pseudo-terminal, whose output (as a terminal shows it) goes to ``LABEL.err``.

``--serve``: a fork server. Once it has imported the ``--preload`` modules it writes one JSON
line, ``{"modules": [...]}`` (every module it holds), then reads items from stdin, one JSON
line each, runs each in a process forked from it and, once that process has ended, writes
``{"label": ..., "status": ..., "killed": ...}``; it ends at the end of its stdin. ``Forks``
(below) is its client, for tests that would start many short Python processes, each importing
the library.
"""

from __future__ import annotations

import gc
import json
import os
import pty
import runpy
import select
import signal
import subprocess
import sys
import time
import types
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
    if "env" in item:
        os.environ.clear()
        os.environ.update(item["env"])
    argv = item.get("argv", [])
    try:
        if "code" in item:  # python -c CODE ARGV
            os.chdir(item.get("cwd") or ".")
            sys.argv, sys.path[0] = ["-c", *argv], ""
            main = sys.modules["__main__"] = types.ModuleType("__main__")
            exec(compile(item["code"], "<string>", "exec"), main.__dict__)
        elif "module" in item:  # python -m MODULE ARGV
            os.chdir(item.get("cwd") or ".")
            sys.argv, sys.path[0] = ["-m", *argv], os.getcwd()
            runpy.run_module(item["module"], run_name="__main__", alter_sys=True)
        else:
            script = Path(item["script"]).resolve()
            os.chdir(item.get("cwd") or script.parent)
            sys.argv, sys.path[0] = [str(script), *argv], str(script.parent)
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return exit_status(exc.code)
    except BaseException as exc:  # noqa: BLE001 - reported as Python reports it, then the next
        exc.__traceback__ = exc.__traceback__.tb_next  # (less this frame)
        sys.excepthook(type(exc), exc, exc.__traceback__)
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
    queue, running, terminals = list(plan), {}, {}
    while queue or running:
        while queue and len(running) < jobs:
            item = queue.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            master, terminal = pty.openpty() if item.get("tty") else (None, None)
            pid = os.fork()
            if pid == 0:  # the child: the script's own process
                for fd, suffix in ((1, "out"), (2, "err"))[:1 if terminal else 2]:
                    with open(outdir / f"{item['label']}.{suffix}", "wb") as f:
                        os.dup2(f.fileno(), fd)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.close(null)
                if terminal is not None:
                    os.dup2(terminal, 2)
                    os.close(terminal)
                    os.close(master)
                for fds in terminals.values():
                    os.close(fds[0])
                return run_one(item, outdir)
            if terminal is not None:
                os.close(terminal)
                terminals[pid] = (master, open(outdir / f"{item['label']}.err", "wb"))
            running[pid] = (item, time.monotonic() + item.get("timeout", 300))
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for pid, (item, deadline) in running.items():
                if time.monotonic() > deadline and not item.get("killed"):
                    item["killed"] = True
                    os.kill(pid, signal.SIGKILL)
            read_terminals(terminals, 0.02)
            continue
        item, _ = running.pop(pid)
        if pid in terminals:  # what it left on its terminal, then the terminal closes
            read_terminals({pid: terminals[pid]}, 0)
            master, shown = terminals.pop(pid)
            os.close(master)
            shown.close()
        if item.get("killed"):
            with open(outdir / f"{item['label']}.err", "a") as err:
                err.write(f"\n(killed after its {item.get('timeout', 300)} s)\n")
        (outdir / f"{item['label']}.status").write_text(str(os.waitstatus_to_exitcode(status)))
    return None


def read_terminals(terminals: dict, timeout: float) -> None:
    """Copy what the children's terminals show to their files: what is there within
    ``timeout`` seconds, then what is there still (sleeps ``timeout`` where there is none)."""
    if not terminals:
        time.sleep(timeout)
        return
    files = dict(terminals.values())
    while True:
        ready, _, _ = select.select(list(files), [], [], timeout)
        if not ready:
            return
        for master in ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: no process holds the terminal any more
                chunk = b""
            if not chunk:
                files.pop(master)
            else:
                files[master].write(chunk)
        if not files:
            return
        timeout = 0


def serve(outdir: Path) -> int | None:
    """Answer items from stdin, one at a time (see the module's docstring). Returns None
    here, and in a child the status it is to exit with."""
    print(json.dumps({"modules": sorted(sys.modules)}), flush=True)
    for line in sys.stdin:
        item = json.loads(line)
        for suffix in ("out", "err", "status"):
            (outdir / f"{item['label']}.{suffix}").unlink(missing_ok=True)
        status = run_forked([item], outdir, 1)
        if status is not None:  # the child
            return status
        status = int((outdir / f"{item['label']}.status").read_text())
        print(json.dumps({"label": item["label"], "status": status,
                          "killed": bool(item.get("killed"))}), flush=True)
    return None


def main() -> int | None:
    if "--preload" in sys.argv:
        for name in sys.argv[sys.argv.index("--preload") + 1].split(","):
            __import__(name)
    if sys.argv[1] != "--serve" and "--fork" not in sys.argv:
        run_here(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]).resolve())
        return None
    # What is here now stays out of the garbage collector's way in the children: their
    # collections, and their collection at exit, do not walk (and so copy) the preloaded
    # modules' objects (about 0.1 s of CPU a child, with NumPy and the library).
    gc.freeze()
    if sys.argv[1] == "--serve":
        return serve(Path(sys.argv[2]).resolve())
    return run_forked(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]).resolve(),
                      int(sys.argv[sys.argv.index("--fork") + 1]))


class Forks:
    """The client of ``--serve``: runs ``python -c CODE ...``, ``python -m MODULE ...`` and
    ``python SCRIPT ...`` commands each in a process forked from a server that has imported
    ``preload`` (a comma-separated list), started on first use. A command that must not find
    some modules already imported (``unloaded``: it blocks them, say) where that server holds
    one runs in a process forked from a bare server instead, which holds only what this file
    imports (the standard library's). What a server wrote to stderr importing its modules
    (warnings, say) comes first in each command's stderr, as a fresh process would write it."""

    def __init__(self, folder: Path, preload: str):
        self.folder, self.preload = Path(folder), preload
        self.servers: dict[str, tuple[subprocess.Popen, Path, set]] = {}
        self.startup: dict[str, bytes] = {}  # what each wrote to stderr importing its modules
        self.count = 0

    def server(self, preload: str) -> tuple[subprocess.Popen, Path, set]:
        if preload not in self.servers:
            folder = self.folder / f"server{len(self.servers)}"
            folder.mkdir()
            with open(folder / "server.log", "wb") as log:
                proc = subprocess.Popen([sys.executable, __file__, "--serve", str(folder),
                                         *(["--preload", preload] if preload else [])],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=log, text=True)
            modules = set(self.answer(proc, folder)["modules"])
            self.servers[preload] = (proc, folder, modules)
            self.startup[preload] = (folder / "server.log").read_bytes()
        return self.servers[preload]

    @staticmethod
    def answer(proc: subprocess.Popen, folder: Path) -> dict:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server ended (exit {proc.wait()}):\n"
                               f"{(folder / 'server.log').read_text()[-4000:]}")
        return json.loads(line)

    def run(self, argv, *, cwd=None, env=None, timeout: float = 60, tty: bool = False,
            unloaded=()) -> tuple[int, bytes, bytes]:
        """``[sys.executable, *argv]``'s exit status, stdout and stderr (with ``tty``, what
        its terminal showed); ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        flag, *rest = argv
        kind, target = ({"-c": "code", "-m": "module"}[flag], rest.pop(0)) if flag in ("-c", "-m") \
            else ("script", flag)
        preload = self.preload
        if any(m == name or m.startswith(f"{name}.") for name in unloaded
               for m in self.server(preload)[2]):
            preload = ""
        proc, folder, _ = self.server(preload)
        self.count += 1
        label = f"run{self.count}"
        item = {"label": label, kind: target, "argv": rest,
                "cwd": str(cwd or os.getcwd()), "env": dict(os.environ if env is None else env),
                "timeout": timeout, "tty": tty}
        proc.stdin.write(json.dumps(item) + "\n")
        proc.stdin.flush()
        answer = self.answer(proc, folder)
        out, err = ((folder / f"{label}.{suffix}").read_bytes() for suffix in ("out", "err"))
        err = self.startup[preload] + err  # (a fresh process would write it, importing them)
        if answer["killed"]:
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, out, err)
        return answer["status"], out, err

    def close(self) -> None:
        for proc, _, _ in self.servers.values():
            proc.stdin.close()
            proc.wait(timeout=60)
            proc.stdout.close()

    def __enter__(self) -> Forks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
