"""The bench's progress display on stderr: rich's bar in a terminal where rich is installed,
one plain line rewritten in place without it, nothing where stderr is not a terminal."""

from __future__ import annotations

import sys


class Quiet:
    """No progress display (stderr is not a terminal)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def clear(self) -> None:
        pass

    def advance(self, description: str) -> None:
        pass


class PlainProgress(Quiet):
    """One line on stderr, rewritten in place: ``[3/12] 4096 B ring``."""

    def __init__(self, total: int):
        self.total, self.done = total, 0

    def clear(self) -> None:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()

    def advance(self, description: str) -> None:
        self.done += 1
        sys.stderr.write(f"\r\033[K[{self.done}/{self.total}] {description}")
        sys.stderr.flush()

    def __exit__(self, *exc) -> None:
        self.clear()


class RichProgress(Quiet):
    """rich's progress bar on stderr (rows printed meanwhile scroll above it)."""

    def __init__(self, total: int, title: str):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=Console(file=sys.stderr), transient=True,
                                 redirect_stdout=sys.stdout.isatty(), redirect_stderr=False)
        self.task = self.progress.add_task(title, total=total)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def advance(self, description: str) -> None:
        self.progress.update(self.task, advance=1, description=description)


def progress(total: int, title: str) -> Quiet:
    """A progress display for ``total`` rows: rich's bar when stderr is a terminal and rich
    is installed, a plain line on such a terminal without rich, nothing otherwise."""
    if not sys.stderr.isatty():
        return Quiet()
    try:
        return RichProgress(total, title)
    except ImportError:
        return PlainProgress(total)
