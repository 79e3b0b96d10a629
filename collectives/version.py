"""The library's version: the one definition, which pyproject.toml reads, and the check that
every rank of a job runs the same one."""

__version__ = "0.1.0"


def check_versions(versions: list[str]) -> None:
    """Raise unless every rank runs the same version of the library (a mixed install
    mismatches in subtle ways). ``versions``: each rank's ``collectives.__version__``, in rank
    order, as the backend gathered them (outside the communicator's numbered calls, so that
    the program's first call is call 1 in every message about it)."""
    if len(set(versions)) > 1:
        by_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(versions))
        raise RuntimeError(f"ranks run different versions of collectives ({by_rank}); install "
                           "the same one everywhere")
