"""Every fault case of ``faults.table`` on every transport it runs on, one pytest item each.

The cases run in batches, in worker processes (``faults.worker``), under an outer time limit;
this module only parametrises and judges. An item marked xfail names a defect that is still
there (``faults.defects``); the mark is strict, so the day the defect is fixed the item fails
as XPASS and its mark must be removed.
"""

from __future__ import annotations

import pytest

from faults import harness
from faults.table import CONFIGS, cases_for

NO_MPI = pytest.mark.skipif(not harness.HAVE_MPI, reason="needs mpi4py and an mpiexec "
                            "(pip install -e '.[mpi]' installs both)")


def _params():
    for transport, size in CONFIGS:
        for case in cases_for(transport, size):
            marks = [NO_MPI, pytest.mark.slow] if transport.startswith("mpi") else []
            reason = case.xfail_reason(transport, size)
            if reason:
                marks.append(pytest.mark.xfail(strict=case.xfail_strict, reason=reason))
            yield pytest.param(transport, size, case, marks=marks,
                               id=f"{transport}{size}-{case.name}")


@pytest.mark.parametrize("transport, size, case", list(_params()))
def test_fault_case(transport, size, case):
    problems = harness.judge(case, harness.report(transport, size, case.name))
    assert not problems, f"{case.name} ({transport}, {size}):\n" + "\n".join(problems)
