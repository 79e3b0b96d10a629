"""The types of the compiled hot path (``_hot.c``, built where a C compiler is at hand):
``Hot``, bound once to a persistent in-place all-reduce (``compiled.bind``)."""

class Hot:
    """A persistent in-place all-reduce's hot path, bound once."""

    ran: int  # runs completed by the compiled path

    def __init__(self, head: int, nbytes: int, tail: int, mine: int, tail_bytes: int,
                 trailer: int, expected: int, trailer_bytes: int, request: int, start: int,
                 test: int, spin: float, hold: float, keep: object, /) -> None: ...
    def run(self, x: object, out: object, /) -> int:
        """One all-reduce of ``x`` into ``out``: 0 done, 1 still running, 2 the reduced
        trailer differs, 3 refused (nothing started), negative: MPI's error code, negated."""
    def run_at(self, x_address: int, out_address: int, /) -> int:
        """``run`` between two C-contiguous arrays' addresses (``nbytes`` each, checked by
        the caller): the same codes, never 3."""
