"""Which call signatures are agreed, and the stage each new call begins with (a mixin of
``Engine``).

Every rank issues its calls in the same order, so every rank decides alike, at issue, what a
call's first stage is (``agreement``):

* an ``Agreement`` where the signature is new (or was forgotten: a failed agreement forgets
  every rank's signature in it, on every rank, from its call on), or a peer rejected the call
  before it was issued here (``ahead``), or the call always agrees (``Call.always_agrees``);
* a ``PendingVerdict`` where the signature's latest agreement is still in flight: the call
  waits for that verdict (``pending_verdict``);
* nothing where the signature was agreed: its data moves at once, with its check value riding
  along (``disputes`` for ranks that disagree even so).

``agreed`` maps each signature's check value to the stage that decides it (its agreement, or
the latest call waiting for one), least recently used first; ``forgotten`` counts
signatures dropped, the hot paths' cue to look again (``hot_path``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .agreement import Agreement
from .pending_verdict import PendingVerdict

AGREED_SIGNATURES = 1024  # signatures remembered as agreed (least recently used forgotten)


class AgreedSignatures:
    """The agreed signatures of one communicator (see the module's docstring)."""

    state: Any
    detail: bool

    def __init__(self) -> None:
        # check value -> what decides it (an Agreement, or a PendingVerdict: ``outcome``)
        self.agreed: OrderedDict[int, Agreement | PendingVerdict] = OrderedDict()
        self.forgotten = 0  # how many signatures were forgotten (the hot paths' cue to look)
        # calls a peer rejected or disputed before this rank had them in flight (the notice
        # came early: the progress thread hears notices between calls): they run their agreement
        self.ahead: set[int] = set()

    def agreement(self, seq: int, signature: tuple | None, check: int,
                  error: BaseException | None, always: bool = False,
                  issued: int = 1) -> Agreement | PendingVerdict | None:
        """The stage a call begins with (see the module's docstring), or None when its
        signature was agreed before. A signature counts from the moment its agreement is
        *issued*, so that calls issued meanwhile wait for its verdict alike on every rank."""
        if self.ahead:
            with self.state:  # (a notice that came before this call: it agrees after all)
                always = always or seq in self.ahead
                self.ahead = {s for s in self.ahead if s > seq}
        if error is None and not always and not self.detail:
            decider = self.agreed.get(check)
            if decider is not None and decider.outcome is not False:
                self.agreed.move_to_end(check)
                if decider.outcome:
                    return None
                assert signature is not None  # (no error: the call has one)
                waiting = PendingVerdict(self, seq, signature, check, decider)
                self.agreed[check] = waiting  # (the next call of it waits for this one)
                return waiting
        agreement = Agreement(self, seq, signature, check, error, issued=issued)
        if error is None:
            self.remember(check, agreement)
        return agreement

    def remember(self, check: int, decider: Agreement | PendingVerdict) -> None:
        self.agreed[check] = decider
        self.agreed.move_to_end(check)
        if len(self.agreed) > AGREED_SIGNATURES:
            self.agreed.popitem(last=False)
            self.forgotten += 1

    def forget(self, check: int, seq: int) -> None:
        """The verdict of call ``seq`` refused signature ``check``: forgotten, unless a later
        call already waits for a verdict of its own on it (it decides for the calls after
        it, alike on every rank: those that had not issued it yet forgot the earlier one)."""
        decider = self.agreed.get(check)
        if decider is not None and decider.seq <= seq:
            del self.agreed[check]
        self.forgotten += 1

    def is_agreed(self, check: int) -> bool:
        """Whether a call of ``check`` skips its agreement now (its verdict came, and agreed)."""
        decider = self.agreed.get(check)
        return decider is not None and bool(decider.outcome)
