"""``collectives timeline plot``: the picture a person wants first.

One row per participant (rank, or device) and track; time runs left to right in milliseconds
from the first event. A call is a pale bar in its collective's colour, each round of its plan
a darker bar inside it (rounds alternate in shade, so their edges show), the agreement grey,
reductions a black tick at the bottom, and every wait a hatched red bar on top of whatever it
interrupted. Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .record_calls import LANES
from .trace_files import Span, names, spans

COLLECTIVE_COLOURS = {"all_reduce": "tab:blue", "reduce": "tab:purple", "broadcast": "tab:green",
                      "all_gather": "tab:orange", "reduce_scatter": "tab:cyan",
                      "gather": "tab:olive", "scatter": "tab:pink", "all_to_all": "tab:brown",
                      "batch_all_reduce": "tab:gray", "batch_reduce": "tab:gray",
                      "send": "gold", "recv": "yellowgreen"}  # (messages: send, recv)


def _rows(every: list[Span], labels: dict) -> list[tuple[int, int]]:
    rows = sorted({(s.pid, s.tid) for s in every})
    return rows


def _label(pid: int, tid: int, labels: dict, shared: dict) -> str:
    name = labels.get(pid, f"rank {pid}")
    if shared[pid] == 1:
        return name
    comm, lane = divmod(tid, LANES)
    return f"{name} c{comm}" + (f" async {lane}" if lane else "")


def plot(events: list[dict], path: str | Path, *, start_ms: float | None = None,
         end_ms: float | None = None, title: str | None = None) -> Path:
    """Draw ``events`` into ``path`` (PNG, SVG or PDF by its suffix); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    every = [s for s in spans(events) if s.cat != "timeline"]
    if not every:
        raise ValueError("the trace holds no spans to draw")
    if start_ms is not None and end_ms is not None and end_ms <= start_ms:
        raise ValueError(f"--end {end_ms:g} is not after --start {start_ms:g}: name a range "
                         "of some length, in ms from the trace's first span")
    origin = min(s.start for s in every)
    lo = start_ms if start_ms is not None else float("-inf")
    hi = end_ms if end_ms is not None else float("inf")
    every = [s for s in every if (s.end - origin) / 1e3 >= lo and (s.start - origin) / 1e3 <= hi]
    if not every:
        length = (max(s.end for s in spans(events) if s.cat != "timeline") - origin) / 1e3
        raise ValueError(f"the trace holds no spans from {start_ms or 0:g} ms to "
                         f"{'its end' if end_ms is None else f'{end_ms:g} ms'}: it runs "
                         f"{length:.3g} ms from its first span")
    labels = names(events)
    rows = _rows(every, labels)
    shared: defaultdict[int, int] = defaultdict(int)
    for pid, _ in rows:
        shared[pid] += 1
    index = {row: k for k, row in enumerate(rows)}
    bars: dict[tuple, list] = defaultdict(list)  # (kind, colour) -> [(row, x, width)]
    present: dict[str, list[str]] = defaultdict(list)  # colour -> the collectives drawn in it
    wide: list[tuple] = []  # calls wide enough to be labelled
    for span in every:
        row = index[span.pid, span.tid]
        x = max((span.start - origin) / 1e3, lo)  # clipped to the window
        width = max(min((span.end - origin) / 1e3, hi) - x, 1e-6)
        if span.cat in ("call", "batch"):
            collective = span.args.get("collective", span.name)
            colour = COLLECTIVE_COLOURS.get(collective, "tab:gray")
            if collective not in present[colour]:
                present[colour].append(collective)
            bars["call", colour].append((row, x, width))
            if span.depth == 0 and "bytes" in span.args:
                wide.append((row, x, width, f"{collective} {_size(span.args['bytes'])}"))
        elif span.cat in ("round", "agreement"):
            if span.cat == "agreement":
                bars["agreement", "0.55"].append((row, x, width))
            else:
                shade = "dark" if span.args.get("round", 0) % 2 == 0 else "light"
                bars["round", shade].append((row, x, width))
        elif span.cat == "wait":
            bars["wait", "tab:red"].append((row, x, width))
        elif span.cat == "reduce":
            bars["reduce", "black"].append((row, x, width))
    height = max(2.0, (0.7 if len(rows) <= 8 else 0.45) * len(rows) + 1.4)
    fig, ax = plt.subplots(figsize=(12, height), dpi=120)
    geometry = {"call": (0.40, 0.80), "agreement": (0.28, 0.56), "round": (0.28, 0.56),
                "wait": (0.28, 0.56), "reduce": (0.40, 0.16)}
    for (kind, colour), found in sorted(bars.items(), key=lambda item: _order(item[0][0])):
        top, tall = geometry[kind]
        by_row: dict[int, list] = defaultdict(list)
        for row, x, width in found:
            by_row[row].append((x, width))
        for row, ranges in by_row.items():
            y = row - top
            if kind == "call":
                ax.broken_barh(ranges, (y, tall), facecolors=colour, alpha=0.35,
                               edgecolors="white", linewidth=0.8)
            elif kind == "round":
                face = "#1f3b73" if colour == "dark" else "#5b86c9"
                ax.broken_barh(ranges, (y, tall), facecolors=face, alpha=0.85, linewidth=0)
            elif kind == "agreement":
                ax.broken_barh(ranges, (y, tall), facecolors=colour, linewidth=0)
            elif kind == "wait":
                ax.broken_barh(ranges, (y, tall), facecolors="white", edgecolors="tab:red",
                               hatch="////", linewidth=0.6, alpha=0.9)
            else:
                ax.broken_barh(ranges, (y, tall), facecolors="black", linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([_label(pid, tid, labels, shared) for pid, tid in rows])
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlim(left=lo if start_ms is not None else None,
                right=hi if end_ms is not None else None)
    left, right = ax.get_xlim()
    for row, x, width, text in wide:  # name the calls there is room to name
        if width > 0.08 * (right - left):
            ax.text(x + width / 2, row - 0.39, text, ha="center", va="top", fontsize=6,
                    color="0.2", clip_on=True)
    legend = [Patch(facecolor=c, alpha=0.35, label=" / ".join(names_))
              for c, names_ in sorted(present.items())]
    legend += [Patch(facecolor="#1f3b73", label="round of the plan (shades alternate)"),
               Patch(facecolor="0.55", label="agreement"),
               Patch(facecolor="white", edgecolor="tab:red", hatch="////", label="wait"),
               Patch(facecolor="black", label="reduction")]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.4 / height),
              ncol=min(len(legend), 4), fontsize="small", frameon=False)
    ax.set_title(title or "collectives timeline")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def _order(kind: str) -> int:
    return ["call", "agreement", "round", "reduce", "wait"].index(kind)


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"
