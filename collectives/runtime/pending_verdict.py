"""A call whose signature's agreement is still in flight: it waits for that verdict.

Calls issued together (asynchronous calls, a tensor list's buckets) often share a signature
no rank has agreed yet. The first of them runs the agreement; each later one, issued before
that verdict, takes a ``PendingVerdict`` as its first stage and waits for it:

1. the verdict agrees: the call goes on as a call of a signature agreed before (nothing more
   is exchanged, and nothing was held up but its start);
2. the verdict refuses the signature (a rank could not start its call, a bad argument on that
   rank, or the ranks' calls differ): the call runs its own agreement, as a new signature's
   first call does, so every rank raises together, nothing moved, and the communicator stays
   usable (as after a plain call refused).

Taking such calls as agreed at once moved their data on the ranks that agreed; a refusal then
met that data, and the communicator broke.

Every rank decides alike: each call waits for the one issued just before it with its
signature (an ``Agreement``, or another ``PendingVerdict``), and that call's outcome is the
same on every rank. A peer that disputes the call before the verdict (it runs the call's
agreement: it refused the call, or already saw the verdict refuse the signature) makes it
agree at once (``agree_now``): nothing moved here, so this is an agreement like any first
call's, not a late one.
"""

from __future__ import annotations

from typing import Any

from .agreement import Agreement


class PendingVerdict:
    """The first stage of a call that waits for its signature's verdict (see the module)."""

    __slots__ = ("agreement", "awaited", "check", "engine", "error", "op", "outcome", "seq",
                 "signature")

    def __init__(self, engine: Any, seq: int, signature: tuple, check: int, awaited: Any):
        """``awaited``: the stage of the latest call issued before this one with this
        signature (an ``Agreement`` or a ``PendingVerdict``), whose ``outcome`` decides."""
        self.engine, self.seq, self.signature, self.check = engine, seq, signature, check
        self.awaited = awaited
        self.agreement: Agreement | None = None  # this call's own, once it runs one
        self.outcome: bool | None = None  # True: the call goes on; False: it was refused
        self.error: BaseException | None = None  # a bad ``out`` here, for its own agreement
        self.op: Any = None  # the operation it begins (``belongs_to``)

    @property
    def agreeing(self) -> bool:
        """Whether it runs an agreement of its own now."""
        return self.agreement is not None and self.outcome is None

    def belongs_to(self, op: Any) -> None:
        """``op`` is the call this stage begins: it takes its agreement as skipped until one
        of its own runs."""
        self.op = op

    def fail_with(self, error: BaseException) -> None:
        """This rank's call cannot take its result (a bad ``out``): where the call runs its
        own agreement, every rank hears it there and nothing moves; where the verdict
        agrees, the call runs with a buffer of its own and raises at its end, as any call
        agreed before does."""
        self.error = error
        if self.agreement is not None:
            self.agreement.fail_with(error)

    def agree_now(self) -> bool:
        """A peer disputes the call: run its agreement now (True), unless the call is past
        its verdict already and may have moved its data (False: a late agreement's case)."""
        if self.agreement is None:
            if self.outcome:
                return False
            self._agree()
        return True

    def advance(self) -> bool:
        if self.agreement is None:
            if self.outcome:
                return True
            verdict = self.awaited.outcome
            if verdict is None:
                return False
            if verdict:
                self.outcome = True
                return True
            self._agree()
        assert self.agreement is not None
        try:
            done = self.agreement.advance()
        except BaseException:
            self.outcome = False
            raise
        if done:
            self.outcome = True
        return done

    def _agree(self) -> None:
        if self.op is not None:  # (peers asking what it does hear "agreeing" now)
            self.op.skipped_agreement = False
        self.agreement = Agreement(self.engine, self.seq, self.signature, self.check,
                                   self.error)

    def abort(self) -> None:
        if self.agreement is not None:
            self.agreement.abort()
        if self.outcome is None:
            self.outcome = False

    def pending_peers(self) -> list[int]:
        """The peers its own agreement waits for (none while it waits for a verdict: the
        earlier call's wait names those)."""
        return self.agreement.pending_peers() if self.agreement is not None else []
