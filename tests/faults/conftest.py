"""Every selected batch of fault cases starts with the first case's report, in the background
(two at a time), while pytest reports the first ones."""

from __future__ import annotations

import pytest

from faults import harness


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what will not run
def pytest_collection_modifyitems(session, config, items):
    if config.option.collectonly:
        return
    selected: dict[tuple[str, int], list[str]] = {}
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if item.originalname != "test_fault_case" or not params:
            continue
        key = (params["transport"], params["size"])
        if harness.HAVE_MPI or not key[0].startswith("mpi"):
            selected.setdefault(key, []).append(params["case"].name)
    harness.select(selected)


def pytest_sessionfinish(session, exitstatus):
    harness.stop()
