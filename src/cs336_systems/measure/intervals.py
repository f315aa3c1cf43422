"""A trace as intervals: what ran when, and what ran at the same time (times in any one unit).

    union([(5, 6), (0, 2), (1, 3)])           # [(0, 3), (5, 6)]
    length(collectives)                        # time during which at least one ran
    length(intersection(collectives, compute)) # time during which both ran

Kept apart from `profiling` (which reads the trace into kernels) so that the jobs which profile
but never ask what overlapped do not depend on it.
"""

from __future__ import annotations

from collections.abc import Sequence

Interval = tuple[float, float]


def union(intervals: Sequence[Interval], gap: float = 0.0) -> list[Interval]:
    """The [start, end) intervals merged into disjoint ones, sorted; intervals less than `gap`
    apart are merged too (a coarser picture of the same timeline)."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def length(intervals: Sequence[Interval]) -> float:
    """Total length of the union of the intervals: overlapping ones count once."""
    return sum(e - s for s, e in union(intervals))


def intersection(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """The time covered by both sets of intervals, as disjoint sorted intervals."""
    a, b = union(a), union(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out
