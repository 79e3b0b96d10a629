"""``collectives timeline summary``: where the time went, per collective and size, and per rank.

Per collective and size: how many calls, the mean time of one (over every rank), the bus
bandwidth that time achieves (nccl-tests' convention: all-reduce moves ``2 (n-1)/n`` of its
bytes over each rank's link, all-gather and reduce-scatter ``(n-1)/n`` of the whole buffer,
the others all of it), the time ranks spent waiting inside those calls, and for whom.

*For whom* follows chains: a rank that waited for a peer which was itself waiting, within
the same call, for a third rank, waited for the third (a ring's neighbour of a late rank is
not the culprit; the late rank is). A rank that others waited for without it waiting itself
is where the chain ends: the straggler the last line names.

Point-to-point messages count as calls named ``send`` and ``recv`` (two ranks each, counted
in all rather than per rank, their bandwidth the message's bytes over its time); a message's
wait is charged to its peer directly: chains are followed within one collective call, and a
message is none.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from .recorder import HOST_PID
from .trace_files import Span, names, spans

BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n,
               "all_gather": lambda n: (n - 1),  # of one rank's bytes: (n-1)/n of n of them
               "all_to_all": lambda n: (n - 1) / n}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def human_time(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"


def busbw(collective: str, nbytes: int, ranks: int, seconds: float) -> float:
    """GB/s on each rank's link (nccl-tests' busbw)."""
    if seconds <= 0 or ranks < 1:
        return 0.0
    factor = BUS_FACTORS.get(collective, lambda n: 1.0)(ranks)
    return nbytes * factor / seconds / 1e9


SLACK = 20.0  # microseconds: how much later a peer's wait may end and still explain one


class Blame:
    """Who each wait was, at the end of its chain, waiting for."""

    def __init__(self, all_spans: list[Span]):
        self.waits: dict[tuple, list[Span]] = defaultdict(list)
        for span in all_spans:
            if span.cat == "wait" and "call" in span.args:
                self.waits[span.comm, span.args["call"], span.pid].append(span)

    def roots(self, wait: Span) -> Counter:
        """``wait``'s time, by the rank at the end of its chain: the part of it during which
        a peer it waited for was itself waiting (a wait that ended before this one did, so
        it held that peer up) goes to whom that peer waited for, and so on; the rest goes to
        the peer (all of it, for a message's wait: it has no call number to follow)."""
        return self._blame(wait.comm, wait.args.get("call"), wait.start, wait.end,
                           wait.args.get("for") or [], frozenset({wait.pid}))

    def _blame(self, comm: int, call: int | None, start: float, end: float, peers: list,
               seen: frozenset) -> Counter:
        """Time of ``[start, end]`` by culprit; a chain that comes back to a rank in ``seen``
        (two ranks waiting for each other: messages in flight) leaves that part unclaimed,
        and the caller keeps it for its own peer."""
        out: Counter = Counter()
        peers = [p for p in peers if p not in seen]
        if end <= start or not peers:
            return out
        share = (end - start) / len(peers)
        for peer in peers:
            covered = 0.0
            for theirs in self.waits.get((comm, call, peer), ()):
                lo, hi = max(start, theirs.start), min(end, theirs.end)
                if hi <= lo or theirs.end > end + SLACK:
                    continue
                below = self._blame(comm, call, lo, hi, theirs.args.get("for") or [],
                                    seen | {peer})
                for rank, amount in below.items():
                    out[rank] += amount / len(peers)  # type: ignore[assignment]  # float times
                covered += sum(below.values()) / len(peers)
            out[peer] += max(share - covered, 0.0)  # type: ignore[assignment]  # float times
        return out


@dataclass
class Accounts:
    """Where a trace's time went: calls grouped by (collective, bytes, ranks, multi-device),
    waiting by group and by participant, and for whom (at the ends of the chains)."""

    labels: dict
    groups: dict = field(default_factory=lambda: defaultdict(list))
    waited: dict = field(default_factory=lambda: defaultdict(float))
    waited_for: dict = field(default_factory=lambda: defaultdict(Counter))
    rank_wait: dict = field(default_factory=lambda: defaultdict(float))
    rank_for: dict = field(default_factory=lambda: defaultdict(Counter))
    blamed: Counter = field(default_factory=Counter)
    per_rank: dict = field(default_factory=lambda: defaultdict(list))

    def hosts(self, events: list[dict]) -> dict[str, list[int]]:
        """The ranks (pids below the devices') of each host, as the files name them."""
        found: dict[str, list[int]] = defaultdict(list)
        for e in events:
            if (e.get("ph") == "M" and e.get("name") == "process_name"
                    and e.get("pid", 0) < HOST_PID and "host" in e.get("args", {})):
                if e["pid"] not in found[e["args"]["host"]]:
                    found[e["args"]["host"]].append(e["pid"])
        return {h: sorted(p) for h, p in found.items()}

    def straggler(self) -> tuple[int | None, float]:
        """The participant the others waited for most, and its share of all waiting."""
        total = sum(self.blamed.values())
        if not total:
            return None, 0.0
        worst, amount = self.blamed.most_common(1)[0]
        return worst, amount / total


def account(events: list[dict]) -> Accounts:
    every = spans(events)
    out = Accounts(names(events))
    blame = Blame(every)
    call_of: dict[tuple, tuple] = {}
    key: tuple | None
    for call in (s for s in every if s.cat == "call"):
        a = call.args
        key = (a.get("collective", call.name), a.get("bytes", 0),
               a.get("ranks") or a.get("devices") or (2 if "peer" in a else 1), "devices" in a)
        out.groups[key].append(call)
        if call.depth == 0:
            out.per_rank[call.pid].append(call)
        number = _number(a)
        if number is not None:
            call_of[call.pid, call.comm, number] = key
    for wait in (s for s in every if s.cat == "wait" and _number(s.args) is not None):
        key = call_of.get((wait.pid, wait.comm, _number(wait.args)))
        out.rank_wait[wait.pid] += wait.duration
        if key is not None:
            out.waited[key] += wait.duration
        for root, share in blame.roots(wait).items():
            if key is not None:
                out.waited_for[key][root] += share
            out.rank_for[wait.pid][root] += share
            out.blamed[root] += share
    return out


def _number(args: dict) -> tuple | None:
    """What numbers a call or a wait on its communicator: its call, or its message."""
    if "call" in args:
        return "call", args["call"]
    if "message" in args:
        return "message", args["message"]
    return None


def summarize(events: list[dict]) -> str:
    """The summary's text for a trace's events."""
    accounts = account(events)
    labels = accounts.labels
    if not accounts.groups:
        return "no collective calls in this trace"
    lines = [f"{'collective':<16} {'size':>9} {'ranks':>5} {'calls':>6} {'time/call':>10} "
             f"{'busbw GB/s':>10} {'waiting':>10}  waited for"]
    for key in sorted(accounts.groups, key=lambda k: (k[3], k[0], k[1], k[2])):
        collective, nbytes, ranks, devices = key
        found = accounts.groups[key]
        # a collective's calls per rank; messages in all (each is one rank's send or recv)
        rows = {(s.pid, s.comm) for s in found} if "peer" not in found[0].args else {0}
        mean = sum(s.duration for s in found) / len(found)
        culprits = "" if devices else _top(accounts.waited_for[key], labels)
        lines.append(f"{collective:<16} {human_bytes(nbytes):>9} {ranks:>5} "
                     f"{len(found) // max(len(rows), 1):>6} {human_time(mean):>10} "
                     f"{busbw(collective, nbytes, ranks, mean / 1e6):>10.3f} "
                     f"{human_time(accounts.waited[key]):>10}  {culprits}".rstrip())
    lines += ["", f"{'participant':<14} {'calls':>6} {'in calls':>10} {'waiting':>10} "
              f"{'others waited for it':>21}  it waited for"]
    for pid in sorted(accounts.per_rank):
        found = accounts.per_rank[pid]
        lines.append(f"{labels.get(pid, pid)!s:<14} {len(found):>6} "
                     f"{human_time(sum(s.duration for s in found)):>10} "
                     f"{human_time(accounts.rank_wait[pid]):>10} "
                     f"{human_time(accounts.blamed[pid]):>21}  "
                     f"{_top(accounts.rank_for[pid], labels)}".rstrip())
    hosts = accounts.hosts(events)
    if len(hosts) > 1:
        total = sum(accounts.blamed.values()) or 1.0
        lines += [""] + [f"host {host}: ranks {', '.join(str(p) for p in pids)}; the others "
                         f"waited {human_time(sum(accounts.blamed[p] for p in pids))} for them "
                         f"({100 * sum(accounts.blamed[p] for p in pids) / total:.0f}%)"
                         for host, pids in sorted(hosts.items())]
    worst, share = accounts.straggler()
    if worst is not None:
        lines += ["", f"straggler: {labels.get(worst, f'rank {worst}')}: the others spent "
                      f"{human_time(accounts.blamed[worst])} waiting for it ({100 * share:.0f}% "
                      "of all waiting)"]
    return "\n".join(lines)


def straggler(events: list[dict]) -> tuple[int | None, float]:
    """The participant the others waited for most, and its share of all waiting."""
    return account(events).straggler()


def _top(counter: Counter, labels: dict, most: int = 3) -> str:
    total = sum(counter.values())
    if not total:
        return ""
    return ", ".join(f"{labels.get(pid, f'rank {pid}')} {100 * t / total:.0f}%"
                     for pid, t in counter.most_common(most))
