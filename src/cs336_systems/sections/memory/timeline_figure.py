"""The active memory timeline drawn as pytorch.org/memory_viz draws it, from a
`memory_timeline.Timeline` (the compact sidecar, not the snapshot).

x is the allocation/free event index; allocations lie stacked in the order they were made, and a
band slides down when one below it is freed. The largest allocations (the top 10 % by size, the
same ones as the section's table) are coloured by the source line that made them, one colour
per line across every panel of the section; the rest are grey; what was allocated before the
recording is the dark base. Vertical lines mark where each phase of each step began.

Speed: the grey silhouette is one step curve of the live bytes (a cumulative sum). Only the
coloured bands need their own outlines; a band moves only when an allocation below it is freed,
so its outline is computed with numpy over the events of its lifetime (one pass per coloured
band, no per-event Python loop), and all bands of a colour form one PolyCollection.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from collections.abc import Iterable

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.patches import Patch

from cs336_systems.measure.memory import GIB
from cs336_systems.measure.memory_timeline import PREEXISTING, Timeline

GREY = "#c9c9c9"                  # every allocation that is not among the largest
BASE = "#6b6b6b"                  # allocated before the recording
OTHER_LARGE = "#9a9a9a"           # large allocations beyond the palette's lines
# tab20 without its greys: distinct colours for the lines that make the most large-allocation bytes
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
           "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5"]
MAX_COLOURS = 12
ZOOM_SHARE = 0.25   # below this share of the peak added by the steps, the y axis zooms in


def band_bottoms(timeline: Timeline, which: Iterable[int]
                 ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """For each allocation k in `which` (stack positions), where its band's bottom changes:
    (x, bottom bytes) with x[0] its first event (0 for one made before the trace) and the
    bottom holding from each x to the next, until its end.

    At its allocation a band sits on everything below it that is still live (live bytes after
    that event, less its own size); afterwards it drops by the size of each allocation below it
    that is freed during its lifetime.
    """
    n = timeline.events
    live = timeline.live_bytes()
    freed = timeline.end < n
    free_position = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    free_size = np.zeros(n, dtype=np.int64)
    free_position[timeline.end[freed]] = np.flatnonzero(freed)
    free_size[timeline.end[freed]] = timeline.size[freed]
    earlier = np.cumsum(np.where(timeline.start < 0, timeline.size, 0)) - np.where(
        timeline.start < 0, timeline.size, 0)   # made-before bytes below each position
    out = {}
    for k in which:
        start, end, size = int(timeline.start[k]), int(timeline.end[k]), int(timeline.size[k])
        if start >= 0:
            first, bottom = start, int(live[start]) - size
        else:
            first, bottom = 0, timeline.base_bytes + int(earlier[k])
        lo, hi = (start + 1 if start >= 0 else 0), min(end, n)
        drops = np.flatnonzero(free_position[lo:hi] < k) + lo
        x = np.concatenate([[first], drops])
        bottoms = bottom - np.concatenate([[0], np.cumsum(free_size[drops])])
        out[int(k)] = (x, bottoms)
    return out


def band_polygon(x: np.ndarray, bottom: np.ndarray, end: int, size: int) -> np.ndarray:
    """The outline (vertices, bytes) of a band whose bottom steps to `bottom[i]` at `x[i]`."""
    xs = np.repeat(np.append(x, end), 2)[1:-1]          # x0 x1 x1 x2 x2 ... end
    ys = np.repeat(bottom, 2)                             # b0 b0 b1 b1 ...
    lower = np.column_stack([xs, ys])
    upper = np.column_stack([xs[::-1], ys[::-1] + size])
    return np.concatenate([lower, upper])


def colours(timelines: Iterable[Timeline]) -> dict[str, str]:
    """One colour per source line of the largest allocations, over every timeline: the lines
    that make the most large-allocation bytes first; beyond the palette, OTHER_LARGE."""
    totals: dict[str, int] = defaultdict(int)
    for timeline in timelines:
        for k in timeline.largest_indices():
            totals[timeline.sites[int(timeline.site[k])]["label"]] += int(timeline.size[k])
    ranked = sorted(totals, key=lambda label: (-totals[label], label))
    return {label: PALETTE[i] if i < MAX_COLOURS else OTHER_LARGE
            for i, label in enumerate(ranked)}


def draw(ax, timeline: Timeline, palette: dict[str, str], title: str) -> dict:
    """One timeline on `ax` (y in GiB); returns its peak ({bytes, event, step, phase})."""
    n = max(timeline.events, 1)
    live = timeline.live_bytes()
    if len(live):
        ax.stairs(live / GIB, np.arange(len(live) + 1), fill=True, color=GREY, lw=0, zorder=1)
    ax.fill_between([0, n], 0, timeline.base_bytes / GIB, color=BASE, lw=0, zorder=2)
    before = np.flatnonzero(timeline.start < 0)
    largest = timeline.largest_indices()
    polygons: dict[str, list[np.ndarray]] = defaultdict(list)
    for k, (x, bottom) in band_bottoms(timeline, np.concatenate([before, largest])).items():
        site = timeline.sites[int(timeline.site[k])]["label"]
        colour = BASE if timeline.start[k] < 0 else palette.get(site, OTHER_LARGE)
        polygons[colour].append(band_polygon(x, bottom, int(min(timeline.end[k], n)),
                                             int(timeline.size[k])) / [1, GIB])
    for colour, shapes in polygons.items():
        ax.add_collection(PolyCollection(shapes, facecolors=colour, edgecolors="none",
                                         zorder=2))
    top = max(timeline.initial_bytes, int(live.max()) if len(live) else 0) / GIB
    steps = {m["step"] for m in timeline.marks}
    for mark in timeline.marks:
        if mark.get("event") is None:
            continue
        ax.axvline(mark["event"], color="black", lw=0.6, ls="--", zorder=3)
        label = mark["phase"] + (f" {mark['step']}" if len(steps) > 1 else "")
        ax.text(mark["event"], 0.98, " " + label, rotation=90, fontsize=6, va="top",
                ha="left", zorder=3, transform=ax.get_xaxis_transform())
    peak = timeline.peak()
    if peak["event"] >= 0:
        ax.plot([peak["event"] + 0.5], [peak["bytes"] / GIB], marker="v", color="red",
                markersize=5, zorder=4)
    where = f"the {peak['phase']}" if peak.get("phase") else "an unmarked phase"
    unmarked = "" if any(m.get("event") is not None for m in timeline.marks) else \
        " (phase marks unavailable)"
    bottom = zoom_bottom(timeline.initial_bytes / GIB, top)
    zoomed = f", y from {bottom:.1f} GiB" if bottom else ""
    ax.set(xlim=(0, n), ylim=(bottom, bottom + (top - bottom) * 1.25 or 1),
           xlabel="allocation / free event", ylabel="GiB")
    ax.set_title(f"{title}\npeak {peak['bytes'] / GIB:.2f} GiB in {where}{zoomed}{unmarked}",
                 fontsize=8)
    ax.tick_params(labelsize=7)
    return peak


def zoom_bottom(start: float, top: float, share: float = ZOOM_SHARE) -> float:
    """Where the y axis starts: 0, unless what the steps add above the memory already in use
    is under `share` of the peak (inference over resident weights); then low enough to show
    a slice of the base under it, so the steps' allocations are not a hairline."""
    if top <= 0 or top - start >= share * top:
        return 0.0
    return max(0.0, start - (top - start))


def not_measured(ax, title: str, reason: str) -> None:
    """A panel for a configuration without a timeline."""
    ax.set_axis_off()
    ax.set_title(title, fontsize=8)
    ax.text(0.5, 0.5, "not measured:\n" + textwrap.fill(reason, 60), ha="center",
            va="center", fontsize=7, transform=ax.transAxes)


def legend_handles(palette: dict[str, str], sources: dict[str, str], shown: Iterable[str]
                   ) -> list[Patch]:
    """Legend entries: each coloured line drawn (with its code), the other large ones, grey,
    and the base."""
    shown = set(shown)
    handles = []
    for label, colour in palette.items():
        if label in shown and colour != OTHER_LARGE:
            code = sources.get(label, "")
            code = code if len(code) <= 60 else code[:59] + "…"
            handles.append(Patch(color=colour, label=f"{label}  {code}".rstrip()))
    if any(palette.get(label) == OTHER_LARGE for label in shown):
        handles.append(Patch(color=OTHER_LARGE, label="other large allocations"))
    handles += [Patch(color=GREY, label="smaller allocations"),
                Patch(color=BASE, label=PREEXISTING + " (weights, optimizer state, ...)")]
    return handles
