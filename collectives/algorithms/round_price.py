"""One round's price in the model of ``collectives.algorithms.cost``: what each participant
sends, receives and reduces in it (``load``), and the round's time (``round_part``): its
slowest participant's latency, transfer and reduction over the links it crosses, a host's
ranks sharing its network link where the fabric says they do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from .cost import CLASSES, HOST, NET, PROC, Fabric, Part, human_bytes


class Load(NamedTuple):
    """What participant ``rank`` (on host ``host``) does in one round, in bytes."""

    rank: int
    host: int
    sent: tuple   # per class
    recvd: tuple  # per class
    reduced: float
    messages: int
    sources: int = 0  # the peers it receives from (each waits to be scheduled on a crowded host)


def load(rank: int, sends, recvs, scale: float, host_of, local: int, mapped=None) -> Load:
    """Participant ``rank``'s round: ``sends`` and ``recvs`` as in a plan, positions times
    ``scale`` bytes; ``mapped(q)`` renames a peer (symmetry), ``host_of`` gives hosts."""
    sent = [0.0, 0.0, 0.0]
    recvd = [0.0, 0.0, 0.0]
    reduced = 0.0
    messages = len(sends)
    home = host_of[rank] if host_of is not None else 0
    for dst, lo, hi in sends:
        if host_of is None:
            sent[local] += hi - lo
            continue
        q = mapped(dst) if mapped is not None else dst
        sent[NET if host_of[q] != home else local] += hi - lo
    peers: set = set()
    for _, srcs, lo, hi, reduce in recvs:
        width = hi - lo
        messages += len(srcs)
        peers.update(srcs)
        if reduce:
            reduced += width * len(srcs)
        if host_of is None:
            recvd[local] += width * len(srcs)
            continue
        for q in srcs:
            q = mapped(q) if mapped is not None else q
            recvd[NET if host_of[q] != home else local] += width
    return Load(rank, home, (sent[0] * scale, sent[1] * scale, sent[2] * scale),
                (recvd[0] * scale, recvd[1] * scale, recvd[2] * scale), reduced * scale,
                messages, len(peers))


def round_part(loads: Sequence[Load], fabric: Fabric, gamma: float,
               weights: dict | None = None, wait: tuple = (0.0, 0.0)) -> Part:
    """The time of one round that ``loads`` take part in (whole hosts where hosts matter);
    ``wait``: what each participant waits for its peers to be scheduled, per round and per
    peer it receives from (``Fabric.crowd``)."""
    nic: dict[int, list[float]] = {}
    if fabric.nic_shared:
        for ld in loads:
            if ld.sent[NET] or ld.recvd[NET]:
                out = nic.setdefault(ld.host, [0.0, 0.0, 0])
                out[0] += ld.sent[NET]
                out[1] += ld.recvd[NET]
                out[2] += 1
    links = (fabric.proc, fabric.host, fabric.net)
    worst, worst_who = None, None  # (described once, at the end: it names bytes)
    total = [0.0, 0.0, 0.0]
    for ld in loads:
        alpha = 0.0
        transfer = 0.0
        who_cost, who_bytes, who_cls = 0.0, 0.0, 0
        for c in (PROC, HOST, NET):
            s, r = ld.sent[c], ld.recvd[c]
            if not (s or r):
                continue
            link = links[c]
            alpha = max(alpha, link.alpha)
            moved = link.moved(s, r)
            if c == NET and fabric.nic_shared:  # the host's ranks together on its link
                shared = nic[ld.host]
                moved = max(link.moved(shared[0], shared[1]), moved)
            transfer += moved * link.beta
            cost = link.alpha + moved * link.beta  # (the link that takes longest is the one
            if moved and cost > who_cost:  # to name, not the one that moves most)
                who_cost, who_bytes, who_cls = cost, moved, c
        latency = (alpha + fabric.round_overhead + fabric.overhead * ld.messages + wait[0] +
                   wait[1] * ld.sources)
        reduction = ld.reduced * gamma
        if weights is not None:  # serial: one thread does every participant's work
            w = weights.get(ld.rank, 1.0)
            total[0] += latency * w
            total[1] += transfer * w
            total[2] += reduction * w
            continue
        t = latency + transfer + reduction
        if worst is None or t > worst[0]:
            worst = (t, latency, transfer, reduction)
            worst_who = (ld, who_bytes, who_cls)
    busiest = max((ld.messages for ld in loads), default=0)
    if weights is not None:
        return Part(total[0], total[1], total[2], "all participants, one after another",
                    busiest)
    if worst is None or worst_who is None:
        return Part(0.0, 0.0, 0.0, "nobody")
    return Part(worst[1], worst[2], worst[3], _who(*worst_who, nic), busiest)


def _who(ld: Load, moved: float, cls: int, nic: dict) -> str:
    if not moved:
        return f"participant {ld.rank} ({ld.messages} messages)"
    if cls == NET and ld.host in nic and nic[ld.host][2] > 1:
        return (f"host {ld.host}'s link ({human_bytes(moved, 3)} of {nic[ld.host][2]} participants)")
    return f"participant {ld.rank} ({human_bytes(moved, 3)} over {CLASSES[cls]})"
