"""Which call signatures are agreed, and the stage each new call begins with (a mixin of
``Engine``).

A call's first stage (``agreement``) is one of:

* an ``Agreement`` where the signature is new (or forgotten), or a peer rejected the call
  before it was issued here (``ahead``), or the call always agrees (``Call.always_agrees``);
* nothing where the signature's agreement came and agreed, and no agreement of a call since
  then is still without its verdict: the data moves at once, its check value riding along
  (``disputes`` for ranks that disagree even so);
* a ``PendingVerdict`` otherwise: the call waits for those verdicts, then goes on where each
  agreed, and agrees on its own where one refused (``pending_verdict``).

A refused verdict (ranks disagree about call ``k``, or one could not start it) forgets every
signature agreed before call ``k`` (``refused``). Every rank hears the same verdicts, and a
call waits for those it has not heard yet, so every rank decides alike whether a call
agrees, whichever verdicts had come when it was issued: a rank whose own call ``k`` was
refused (its bad argument) and its peers, whose call ``k`` waited for an earlier verdict,
treat the calls after ``k`` alike. (A call that moved its data before a peer refused it is
``disputes``' case: a late agreement.)

``agreed`` maps each signature's check value to the stage that decides it (its agreement, or
the latest call waiting for verdicts), least recently used first; ``unsettled`` holds the
agreement stages still without a verdict, in call order; ``forgotten`` counts signatures
dropped, the hot paths' cue to look again (``hot_path``).
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
        self.unsettled: list[Agreement | PendingVerdict] = []  # (``issued_agreement``)
        self.forgotten = 0  # how many signatures were forgotten (the hot paths' cue to look)
        # calls a peer rejected or disputed before this rank had them in flight (the notice
        # came early: the progress thread hears notices between calls): they run their agreement
        self.ahead: set[int] = set()

    def agreement(self, seq: int, signature: tuple | None, check: int,
                  error: BaseException | None, always: bool = False,
                  issued: int = 1) -> Agreement | PendingVerdict | None:
        """The stage a call begins with, or None where it needs none (see the module's
        docstring)."""
        with self.state:  # (the progress thread settles verdicts meanwhile)
            if self.ahead:  # (a notice that came before this call: it agrees after all)
                always = always or seq in self.ahead
                self.ahead = {s for s in self.ahead if s > seq}
            decider = self.agreed.get(check)
            unsettled = self.unsettled  # (settled ones leave from the front: verdicts come in
            while unsettled and unsettled[0].outcome is not None:  # call order, and else the
                del unsettled[0]  # last agreement of every signature stayed, scanned per call)
            if (error is None and not always and not self.detail and decider is not None
                    and decider.outcome is not False):
                self.agreed.move_to_end(check)
                since = self._unsettled_since(decider)
                if decider.outcome and not since:
                    return None
                assert signature is not None  # (no error: the call has one)
                awaited = since if decider.outcome else [decider, *since]
                waiting = PendingVerdict(self, seq, signature, check, awaited)
                self.agreed[check] = waiting  # (the next call of it waits for this one)
                return waiting
            agreement = Agreement(self, seq, signature, check, error, issued=issued)
            if error is None:
                self.remember(check, agreement)
            return agreement

    def _unsettled_since(self, decider: Agreement | PendingVerdict) -> list:
        """The agreement stages issued after ``decider``'s call still without a verdict."""
        return [s for s in self.unsettled if s.seq > decider.seq and s.outcome is None]

    def issued_agreement(self, stage: Agreement | PendingVerdict) -> None:
        """``stage`` decides a call issued now (an agreement, or a call waiting for
        verdicts): calls issued before its verdict wait for it (``agreement``)."""
        with self.state:
            self.unsettled = [s for s in self.unsettled if s.outcome is None]
            self.unsettled.append(stage)

    def remember(self, check: int, decider: Agreement | PendingVerdict) -> None:
        self.agreed[check] = decider
        self.agreed.move_to_end(check)
        if len(self.agreed) > AGREED_SIGNATURES:
            self.agreed.popitem(last=False)
            self.forgotten += 1

    def refused(self, seq: int) -> None:
        """The verdict of call ``seq`` refused it: every signature decided before it is
        forgotten (calls after it agree again; those already waiting for its verdict do as
        well, ``pending_verdict``), on every rank alike."""
        with self.state:
            for check in [c for c, decider in self.agreed.items() if decider.seq <= seq]:
                del self.agreed[check]
            self.forgotten += 1

    def is_agreed(self, check: int) -> bool:
        """Whether a call of ``check`` skips its agreement now (its verdict came and agreed,
        and no agreement since is without its verdict)."""
        decider = self.agreed.get(check)
        return decider is not None and bool(decider.outcome) and not self._unsettled_since(decider)
