"""What a rank publishes of its calls (``Transport.publish_activity``) and how its peers read
it (``Transport.peer_activity``): for a timed-out call's message, which ranks it names as
missing (``missing``), and the disputes of calls the ranks took differently (``disputes``).
"""

from __future__ import annotations

from typing import Any

SILENT = "silent"  # the phase ``Transport.peer_activity`` gives a peer that did not answer


def describe_activity(activity: Any, in_flight: dict[int, int] | None = None
                      ) -> tuple[int | None, str, Any, tuple[int, ...], int | None,
                                 dict[int, int], str]:
    """A peer's answer to ``Transport.peer_activity`` from what it published:
    ``(seq, text, phase, waiting_for, check, in_flight, call)``. ``activity`` is ``(seq, call,
    phase)``, or with a fourth item, the ranks a slow wait is waiting for (published by the
    engine now and then, so a rank that times out can follow the chain of waits to the rank
    that holds it up). ``check``: the call's check value (None where the subject has none):
    ranks moving the data of one call under different checks disagree about it (``Engine``'s
    disputes). ``in_flight``: the check values of the peer's calls in flight, by number
    (``Engine.checks_in_flight``, read as it answers): a peer shows only its latest call, and
    an earlier one in flight under another check is a dispute too. ``call``: that call's
    description alone (what a mismatch found by disputes names)."""
    in_flight = in_flight or {}
    if activity is None:
        return None, "has made no call", None, (), None, in_flight, ""
    seq, subject, phase, *rest = activity
    call = subject if isinstance(subject, str) else subject.describe()
    check = getattr(subject, "check", None)
    waiting = tuple(rest[0]) if rest else ()
    text = f"{'in' if phase else 'last finished'} call {seq}, {call}"
    if phase and waiting:
        text += f", waiting for rank(s) {', '.join(map(str, waiting))}"
    return (seq, text, phase, waiting if phase else (), check if isinstance(check, int) else None,
            in_flight, call)
