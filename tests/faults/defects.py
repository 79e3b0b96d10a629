"""The defects the fault suite still finds, by number: the reasons of its xfail marks.

A case marked with one of these is expected to fail (strictly: the day it passes, pytest
reports it, and its mark must go). docs/reliability.md lists the same defects as "not yet".
"""

D1 = "1: a bad broadcast out= on one rank desynchronises the ranks"
D2 = "2: two threads on one communicator are not refused"
D3 = "3: native all_reduce with out partly overlapping x"
D4 = "4: NaN in MAX/MIN on MPI's native path"
D5 = "5: multi-device out= aliasing the inputs or each other"
D6 = "6: an argument error on one MPI rank does not reach the others"
D7 = "7: a timeout does not mark the communicator broken (CommunicatorBrokenError)"
D8 = "8: shards has no upper bound"
D10 = "10: check=False with mismatched lengths goes undetected"
D11 = "11: timeout= is not validated"
D12 = "12: ranks calling different collectives wait out the timeout"
D13 = "13: batch_all_reduce(None) fails without naming xs"
