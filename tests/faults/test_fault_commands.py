"""The console commands at absurd sizes: an answer or a one-line error in seconds, never a
traceback or a process that keeps allocating."""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import pytest

COMMAND = [sys.executable, "-m", "collectives.tools.cli"]


@pytest.fixture
def run(python):
    """``collectives ARGS``: the process and its seconds. Forked (conftest's ``python``),
    except under an address-space limit (``memory``), which a fresh process starts under."""
    def run(args: list[str], *, memory: int | None = None, wall: float = 60.0):
        def limit() -> None:  # (in the child: an address-space limit, as a small machine has)
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

        start = time.monotonic()
        if memory is None:
            proc = python(*COMMAND[1:], *args, timeout=wall)
        else:
            proc = subprocess.run([*COMMAND, *args], capture_output=True, text=True,
                                  timeout=wall, preexec_fn=limit)
        return proc, time.monotonic() - start
    return run


@pytest.mark.parametrize("n", ["100000000000", "16777216"])
def test_simulate_prices_absurd_participant_counts_at_once(n, run):
    """A named algorithm at any count: closed forms, an answer in seconds."""
    proc, took = run(["simulate", "ring", "-n", n])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"all_reduce of 64 MiB over {n}:" in proc.stdout, proc.stdout[-2000:]
    assert took < 30, f"{took:.0f} s for an answer"


@pytest.mark.parametrize("n", ["100000000000", "16777216"])
def test_simulate_auto_refuses_counts_it_cannot_compare_at_once(n, run):
    """``auto`` compares candidates by their plans: past 131,072 a one-line error naming the
    way out (name an algorithm), never a traceback or minutes of allocating."""
    proc, took = run(["simulate", "auto", "-n", n])
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"-n {n}: auto compares its candidates by their plans, at most 131,072" in \
        proc.stderr, proc.stderr
    assert "name an algorithm" in proc.stderr and "Traceback" not in proc.stderr
    assert took < 30, f"{took:.0f} s for an error"


@pytest.mark.parametrize("collective", ["gather", "scatter", "all_to_all"])
def test_simulate_native_names_the_collectives_it_models(collective, run):
    proc, _ = run(["simulate", "native", "-c", collective, "-n", "8"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"native has no model for {collective}" in proc.stderr, proc.stderr


def test_simulate_still_prices_its_largest_count(run):
    proc, _ = run(["simulate", "ring", "-n", "131072", "-b", "1M"])
    assert proc.returncode == 0 and "all_reduce of 1 MiB over 131072" in proc.stdout, \
        proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.slow
def test_bench_out_of_memory_is_one_line(run):
    """``bench`` with more participants than memory allows (768 MiB of address space, five
    times what the command needs to start): one line naming what could not be allocated and
    how to ask for less, exit status 1."""
    proc, _ = run(["bench", "-n", "100000", "-b", "8", "-e", "8"], memory=3 << 28)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("collectives bench: out of memory ("), lines
    assert "allocate" in lines[0] and "fewer participants (-n)" in lines[0], lines
