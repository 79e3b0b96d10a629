"""Output files the commands write (``bench --json``, ``probe --json``, ``timeline merge -o``):
refused before any work where they cannot be written, not after it."""

from __future__ import annotations

import os


def check_writable(path: str, option: str) -> None:
    """Raise ValueError naming ``option`` where ``path`` cannot be written: empty, a folder, in
    a folder that does not exist, or a file that cannot be made there. The file is tried
    (opened to append, and removed again where it was new): ``os.access`` says yes to root
    everywhere, and a mount such as /proc refuses new files whoever asks."""
    if not path:
        raise ValueError(f"{option}: an empty path; name a file")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{option} {path}: is a folder; name a file")
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path}: the folder {folder} does not exist")
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot be written ({exc.strerror or exc})") from None
    if not existed:
        os.remove(path)


FIGURES = (".png", ".svg", ".pdf")


def check_figure(path: str, option: str) -> None:
    """As ``check_writable``, for a figure: its suffix says its format (matplotlib adds .png
    to a name without one, and the command would print a path it did not write)."""
    if os.path.splitext(path)[1].lower() not in FIGURES:
        raise ValueError(f"{option} {path!r}: name a {', '.join(FIGURES)} file (its suffix "
                         "says the format)")
    check_writable(path, option)
