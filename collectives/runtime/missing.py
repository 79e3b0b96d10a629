"""Which ranks a timed-out call names as missing, from what its peers say they are doing.

A call that times out asks its peers (``Transport.peer_activity``) and names the ranks that
kept it waiting: ranks that say they are not in this call yet, else the ranks it waits for,
followed along their own waits to the end of each chain, that did not say they issued the call
(a native call waits for every rank, and with calls in flight a live peer may be calls ahead),
else ranks that did not answer, else the ranks it waits for, else every other rank. A silent
peer may merely have timed out first and left; a transport may leave some peers unasked (MPI:
those on other hosts).
"""

from __future__ import annotations

from .activity import SILENT


def missing_ranks(seq: int, waited: list[int], activity: dict[int, tuple], rank: int,
                  size: int) -> list[int]:
    """The ranks call ``seq`` of ``rank`` names as missing; ``waited``: the peers it waits
    for; ``activity``: what each asked peer says, ``(seq, text, phase[, waiting for])``."""
    silent = [r for r, entry in sorted(activity.items()) if entry[2:3] == (SILENT,)]
    absent = [r for r, (theirs, *_) in sorted(activity.items())
              if r not in silent and (theirs is None or theirs < seq)]
    arrived = {r for r, (theirs, *_) in activity.items()
               if r not in silent and theirs is not None and theirs >= seq}
    ends = held_up_by(waited, seq, activity, rank)
    return (absent or [r for r in ends if r not in arrived] or silent or ends
            or [r for r in range(size) if r != rank])


def all_in_call(seq: int, ranks: list[int], activity: dict[int, tuple]) -> bool:
    """Whether every one of ``ranks`` (some) says it is in call ``seq`` now, agreeing on it or
    moving its data: a call that timed out waiting for them was slower than its timeout."""
    return bool(ranks) and all(r in activity and activity[r][0] == seq
                               and activity[r][2] in ("agreeing", "moving") for r in ranks)


def held_up_by(waited: list[int], seq: int, activity: dict[int, tuple],
                rank: int) -> list[int]:
    """The ranks at the end of the chains of waits that start at ``waited``: a peer that is
    in call ``seq`` itself and says it waits for others is followed to them (the first rank
    to time out names the lost one, not the live neighbour stuck behind it)."""
    found: list[int] = []
    seen = {rank}
    todo = list(waited)
    while todo:
        peer = todo.pop(0)
        if peer in seen:
            continue
        seen.add(peer)
        entry = activity.get(peer, ())
        onward = [r for r in (entry[3] if len(entry) > 3 and entry[0] == seq else ())
                  if r not in seen]
        if onward:
            todo.extend(onward)
        else:
            found.append(peer)
    return sorted(found) or waited
