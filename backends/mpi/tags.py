"""Integer MPI tags for the executor's ``(seq, check, round, position)`` tags.

An MPI tag holds what keeps concurrent calls apart: the low bits of the call's sequence
number, then as many bits of the call's check value as the library's ``TAG_UB`` leaves. The
round and position need no bits: both ends post one pair's messages in the same order (plans
list them by position) and MPI never lets a message overtake an earlier one with the same
tag between the same two ranks, so the n-th send pairs with the n-th receive.

Sequence numbers wrap, which is harmless as long as no rank can have two calls with the same
low bits in flight at once: the transport says so (``calls_apart``, 2**11), and the engine
issues no call 2**11 numbers past one still in flight before that one has finished
(``InFlight.make_room``). (The limit of 1024 handles not waited on did not bound it: a dropped
handle leaves its call in flight, and with one rank behind, 2049 dropped calls paired call 0's
messages with call 2048's: other sums on each rank, without a word.) Check bits make ranks that disagree
about a call post tags that never match (their receives wait, and the slow-receive probe
sees the other call's tag); MPICH's ``TAG_UB`` of 2^29 - 1 leaves 18 of the check's 30 bits,
the standard's minimum of 32767 only 4 (one mismatch in 16 then pairs up; the length check
still catches those whose sizes differ).
"""

from __future__ import annotations

SEQ_BITS = 11  # data channel: calls that may be outstanding at once, < 2**SEQ_BITS
PART_BITS = 3  # control channel: the check value there is an agreement part, 0..7


class TagSpace:
    """Tags of one channel: ``seq_bits`` of the sequence number, then ``check`` bits."""

    __slots__ = ("check_mask", "seq_bits", "seq_mask")

    def __init__(self, tag_ub: int, *, seq_bits: int | None = None, check_bits: int | None = None):
        bits = (tag_ub + 1).bit_length() - 1  # tags 0 .. 2**bits - 1 are all valid
        if seq_bits is None:
            seq_bits = bits - (check_bits or 0)
        if seq_bits < 1 or seq_bits > bits:
            raise ValueError(f"TAG_UB={tag_ub} leaves no room for {seq_bits} sequence bits")
        self.seq_bits = seq_bits
        self.seq_mask = (1 << seq_bits) - 1
        room = bits - seq_bits
        self.check_mask = (1 << min(room, check_bits if check_bits is not None else room)) - 1

    def tag(self, seq: int, check: int) -> int:
        return ((check & self.check_mask) << self.seq_bits) | (seq & self.seq_mask)

    def same_call(self, tag: int, other: int) -> bool:
        """Whether two tags carry the same sequence bits (the same call, or one 2**seq_bits
        calls apart)."""
        return (tag ^ other) & self.seq_mask == 0


def user_tags(tag_ub: int) -> TagSpace:
    """Users' own messages: the tag they gave (0 .. 32767), as it is."""
    return TagSpace(tag_ub, seq_bits=15, check_bits=0)


def data_tags(tag_ub: int) -> TagSpace:
    return TagSpace(tag_ub, seq_bits=SEQ_BITS)


def control_tags(tag_ub: int) -> TagSpace:
    return TagSpace(tag_ub, check_bits=PART_BITS)
