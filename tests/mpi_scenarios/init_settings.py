"""Settings of ``collectives.init`` that one rank gives otherwise: every rank raises the same
error before any communicator is used, and a later ``init`` works. Calibration switched off
as ``"0"`` on one rank alone, or asked for on some ranks only, made a communicator and calls
only there: those ranks waited forever. A bad ``COLLECTIVES_DEBUG`` or
``COLLECTIVES_HANG_GUARD`` on one rank raised there alone, its peers waiting their timeout (a
bad ``COLLECTIVES_PURE_PYTHON`` did not raise at all: any text but ``0`` switched the compiled
path off).
"""

from __future__ import annotations

import numpy as np
from _common import WORLD, Report, environment

import collectives

report = Report("init_settings")
rank = WORLD.rank


def attempt(name: str, says: str, calibrate=None, env: dict | None = None) -> None:
    try:
        with environment(env):
            collectives.init(timeout=5, calibrate=calibrate, abort_on_error=False)
        report.check(not says, f"{name}: init returned")
    except ValueError as exc:
        report.check(bool(says) and says in str(exc), f"{name}: {exc}")


def main() -> None:
    one = rank == WORLD.size - 1
    attempt("a bad COLLECTIVES_DEBUG on one rank", "COLLECTIVES_DEBUG='bogus'",
            env={"COLLECTIVES_DEBUG": "bogus"} if one else None)
    attempt("a bad COLLECTIVES_HANG_GUARD on one rank", "COLLECTIVES_HANG_GUARD",
            env={"COLLECTIVES_HANG_GUARD": "nan"} if one else None)
    attempt("a bad COLLECTIVES_PURE_PYTHON on one rank", "COLLECTIVES_PURE_PYTHON='maybe'",
            env={"COLLECTIVES_PURE_PYTHON": "maybe"} if one else None)
    attempt("calibration asked for on one rank alone", "different calibrate=",
            calibrate="cached" if one else None)
    attempt("calibration asked for two ways", "different calibrate=",
            calibrate="fresh" if one else "cached")
    attempt("a bad COLLECTIVES_CALIBRATE on one rank", "calibrate='maybe'",
            env={"COLLECTIVES_CALIBRATE": "maybe"} if one else None)
    # (last: it makes this process's communicator, which a later init returns)
    attempt("calibration off, spelled two ways", "", calibrate="0" if one else None)
    comm = collectives.init(timeout=5, calibrate="0" if one else None, abort_on_error=False)
    total = comm.all_reduce(np.ones(2))
    report.check(total.tolist() == [WORLD.size] * 2, f"after: {total}")
    report.finish()


if __name__ == "__main__":
    main()
