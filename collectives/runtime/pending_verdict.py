"""A call of an agreed signature issued before some verdicts came: it waits for them.

Calls issued together (asynchronous calls, a tensor list's buckets) often share a signature
no rank has agreed yet: the first of them runs the agreement, and the later ones, issued
before its verdict, must not move their data on the strength of it. Nor may a call of a
signature agreed long ago move while a later call's agreement has no verdict yet: a refusal
there (one rank's bad argument) makes every rank agree again on what comes after it
(``AgreedSignatures.refused``), and a rank whose own call was refused would wait for that
verdict where its peers moved data. Such a call takes a ``PendingVerdict`` as its first
stage, holding the stages whose verdicts it waits for (its signature's decider, and every
agreement issued since):

1. every verdict agrees: the call goes on as a call of a signature agreed before (nothing
   more is exchanged; only its start was held up);
2. one refuses: the call runs its own agreement, as a new signature's first call does, so a
   rank's bad argument to several calls in flight makes every rank raise with nothing
   moved, and the communicator stays usable (as after a plain call refused).

Every rank waits for the same verdicts, or had heard them before it issued the call, so
every rank decides alike. A peer that disputes the call meanwhile (it runs the call's
agreement: it refused the call, or heard a refusal first) makes it agree at once
(``agree_now``): nothing moved here, so this is an agreement like any first call's, not a
late one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .agreement import Agreement


class PendingVerdict:
    """The first stage of a call that waits for verdicts (see the module's docstring)."""

    __slots__ = ("agreement", "awaited", "check", "engine", "error", "op", "outcome", "seq",
                 "signature", "tell")

    def __init__(self, engine: Any, seq: int, signature: tuple, check: int, awaited: list):
        """``awaited``: the stages (``Agreement`` or ``PendingVerdict``) of earlier calls
        whose ``outcome`` decides this one."""
        self.engine, self.seq, self.signature, self.check = engine, seq, signature, check
        self.awaited = awaited
        self.agreement: Agreement | None = None  # this call's own, once it runs one
        self.outcome: bool | None = None  # True: the call goes on; False: it was refused
        self.error: BaseException | None = None  # a bad ``out`` here, for its own agreement
        self.op: Any = None  # the operation it begins (``belongs_to``)
        self.tell: Callable[[bool], None] | None = None  # (``tell_transport``)
        engine.issued_agreement(self)

    @property
    def agreeing(self) -> bool:
        """Whether it runs an agreement of its own now."""
        return self.agreement is not None and self.outcome is None

    def belongs_to(self, op: Any) -> None:
        """``op`` is the call this stage begins: it takes its agreement as skipped until one
        of its own runs."""
        self.op = op

    def tell_transport(self, tell: Callable[[bool], None]) -> None:
        """``tell(agreeing)`` once the call agrees on its own (True) or moves (False; also
        True where it was aborted first: it moved nothing): ``Transport.verdict_pending``."""
        self.tell = tell

    def _told(self, agreeing: bool) -> None:
        tell, self.tell = self.tell, None
        if tell is not None:
            tell(agreeing)

    def fail_with(self, error: BaseException) -> None:
        """This rank's call cannot take its result (a bad ``out``): where the call runs its
        own agreement, every rank hears it there and nothing moves; where every verdict
        agrees, the call runs with a buffer of its own and raises at its end, as any call
        agreed before does."""
        self.error = error
        if self.agreement is not None:
            self.agreement.fail_with(error)

    def agree_now(self) -> bool:
        """A peer disputes the call: run its agreement now (True), unless the call is past
        its verdicts already and may have moved its data (False: a late agreement's case)."""
        if self.agreement is None:
            if self.outcome:
                return False
            self._agree()
        return True

    def advance(self) -> bool:
        if self.agreement is None:
            if self.outcome:
                return True
            verdicts = [stage.outcome for stage in self.awaited]
            if None in verdicts:
                return False
            if all(verdicts):
                self._told(False)
                self._settle(True)
                return True
            self._agree()
        assert self.agreement is not None
        try:
            done = self.agreement.advance()
        except BaseException:
            self._settle(False)
            raise
        if done:
            self._settle(True)
        return done

    def _agree(self) -> None:
        if self.op is not None:  # (its slow waits now compare it as agreeing: ``disputes``)
            self.op.skipped_agreement = False
        self.awaited = []
        self._told(True)
        self.agreement = Agreement(self.engine, self.seq, self.signature, self.check,
                                   self.error)

    def _settle(self, outcome: bool) -> None:
        """The call's outcome; what it held for the wait goes (a decider stays in the
        engine's table for good: it must not keep the earlier calls, nor this one's result)."""
        self.outcome = outcome
        self.awaited, self.op = [], None

    def abort(self) -> None:
        self._told(True)
        if self.agreement is not None:
            self.agreement.abort()
        if self.outcome is None:
            self._settle(False)

    def pending_peers(self) -> list[int]:
        """The peers its own agreement waits for. None while it waits for verdicts: those
        are earlier calls', which their own waits ask about, and a peer that agrees on this
        call is heard by its agreement's first message (``Engine._look_around``)."""
        return self.agreement.pending_peers() if self.agreement is not None else []
