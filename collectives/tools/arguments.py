"""Argument types and the parser the ``collectives`` commands share: sizes with K/M/G
suffixes, counts with a least value, and errors of one line each."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from ..runtime.validate import MAX_DEVICES
from .bench.config import parse_size


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, naming the command and its ``--help``
    (argparse's default prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def size(text: str) -> int:
    """Bytes from "8", "4K", "64M", "1G"; argparse's error where the text is not one."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def count(least: int, most: int | None = None) -> Callable[[str], int]:
    """A type for integers of at least ``least`` (and at most ``most``)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, not {text}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:,}, not {text}")
        return value

    return parse


non_negative, positive = count(0), count(1)
# devices, or thread ranks, in one process (a sweep's plans and buffers are made for each)
in_one_process = count(1, MAX_DEVICES)


def add_root_and_shards(parser: argparse.ArgumentParser) -> None:
    """The ``--root`` and ``--shards`` options of the commands that build schedules."""
    parser.add_argument("--root", type=non_negative, default=0,
                        help="the root participant of reduce, broadcast, gather and scatter; "
                             "default 0")
    parser.add_argument("--shards", type=non_negative, default=0,
                        help="sub-chunks of ring and gather devices of shuffle (0: the "
                             "algorithm's default)")
