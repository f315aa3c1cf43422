"""Facts: what a section's report module computes from its tables and hands to its template.

Facts are plain JSON (numbers, strings, lists, dicts; a missing number is null), written to
`results/<preset>/sections/<section>.json`. Every number and every verdict word of the writeup
is a fact; the template only arranges them into sentences. Two helpers make the facts that
recur: `speedup` (a ratio, its verdict and whether it is inside the measured spread) and
`covered` (what a section says of one problem of the assignment, for the coverage table).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cs336_systems.lm.sizes import size_label
from cs336_systems.records import write_text_atomic


def jsonable(value: Any) -> Any:
    """`value` with numpy and pandas scalars made plain, NaN and NA made None, tuples lists."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def write_facts(path: str | Path, facts: dict) -> None:
    write_text_atomic(path, json.dumps(jsonable(facts), indent=1, allow_nan=False) + "\n")


def read_facts(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def number(value) -> float | None:
    """A table cell as a plain float for the facts, or None where it is missing (None, NaN, NA)."""
    return None if value is None or pd.isna(value) else float(value)


def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def speedup(time: float, reference: float, time_std: float | None = None,
            reference_std: float | None = None) -> dict | None:
    """How `time` compares with `reference` (both durations; smaller is faster).

    ratio = reference / time (above 1: `time` is faster); factor = the larger of ratio and its
    inverse, with word "faster" or "slower", for sentences like "2.9x faster" / "1.4x slower".
    within_spread: whether mean +- std of the two overlap (None where a spread is unknown), so
    a sentence can say when a difference is inside the measured noise. None if either is missing.
    """
    if not (_finite(time) and _finite(reference)) or time <= 0 or reference <= 0:
        return None
    ratio = reference / time
    within = None
    if _finite(time_std) and _finite(reference_std):
        within = abs(reference - time) <= time_std + reference_std
    return {"ratio": ratio, "factor": max(ratio, 1 / ratio),
            "word": "faster" if ratio > 1 else "slower" if ratio < 1 else "as fast",
            "within_spread": within}


def median_speedup(time: float, reference: float, time_range: tuple | None = None,
                   reference_range: tuple | None = None) -> dict | None:
    """`speedup` of two medians, for tables that show each time as its median [min–max]: the
    ratio of the medians, and a tie (`within_spread`) where the two [min, max] ranges overlap
    (None where a range is unknown)."""
    result = speedup(time, reference)
    if result is None:
        return None
    ranges = [r for r in (time_range, reference_range) if r and all(map(_finite, r))]
    if len(ranges) == 2:
        (t_lo, t_hi), (r_lo, r_hi) = ranges
        result["within_spread"] = not (t_hi < r_lo or r_hi < t_lo)
    else:
        result["within_spread"] = None
    return result


# A time is overhead-bound when a larger problem of its kind (the same implementation, dtype,
# model...) did at least OVERHEAD_WORK times its work in at most OVERHEAD_FLAT times its time:
# flat in the problem's size, it measured launches and host work, not the computation.
OVERHEAD_WORK, OVERHEAD_FLAT = 4.0, 1.5


def overhead_rule() -> dict:
    """The rule's two factors, for a section's facts (its template states them)."""
    return {"work": OVERHEAD_WORK, "flat": OVERHEAD_FLAT}


def overhead_bound(frame: pd.DataFrame, kind: list[str], work: pd.Series, time: str
                   ) -> pd.Series:
    """Per row of `frame`, whether its `time` is overhead-bound against the rows of the same
    `kind` columns (`work`: each row's work, in any unit); False where it has no time or no
    larger problem to compare with."""
    flags = pd.Series(False, index=frame.index)
    timed = frame.dropna(subset=[time])
    for _, group in timed.groupby(kind):
        for i in group.index:
            larger = group[work[group.index] >= OVERHEAD_WORK * work[i]]
            flags[i] = bool((larger[time] <= OVERHEAD_FLAT * group.loc[i, time]).any())
    return flags


# Where torch's CUDA out-of-memory message turns from this allocation to general advice
_OOM_ADVICE = (" Including non-PyTorch memory", " Of the allocated memory",
               " If reserved but unallocated")


def reason(message) -> str:
    """The line of a record's message that says why: the last line of a traceback (the
    exception), the first line of anything else; '' for none. Of a CUDA out-of-memory, the
    allocation that failed and the device's room, without torch's advice after them."""
    lines = [line.strip() for line in str(message or "").splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    cuts = [line.find(advice) for advice in _OOM_ADVICE if advice in line]
    if "CUDA out of memory" in line and cuts:
        line = line[:min(cuts)].rstrip(". ")  # the sentence around it ends it
    return line


def not_ok(rows: pd.DataFrame, keys: list[str]) -> list[dict]:
    """The rows that did not end `ok`: their `keys`, status and reason, for "not measured"."""
    bad = rows[rows["status"] != "ok"]
    return [{**{k: r[k] for k in keys}, "status": r["status"], "reason": reason(r["message"])}
            for _, r in bad.iterrows()]


def not_in_preset(axes: dict, more: Iterable[str] = (), lead: str = "not in this preset") -> str:
    """What of the full matrix a preset leaves out, for a coverage note: `axes` maps a name to
    (the values the assignment wants, the values the rows have); each wanted value the rows lack
    is named (a model size as the writeup names it), then each of `more` that is not ''. '' when
    nothing is left out: 'not in this preset: sizes xl, 10B; contexts 1024'."""
    parts = []
    for what, (wanted, have) in axes.items():
        have = set(have)
        gone = [size_label(v) for v in wanted if v not in have]
        if gone:
            parts.append(f"{what} {', '.join(map(str, gone))}")
    parts += [m for m in more if m]
    return f"{lead}: " + "; ".join(parts) if parts else ""


def covered(records: pd.DataFrame | None = None, missing: str = "", anchor: str = "",
            how: str = "") -> dict:
    """What a section says of one problem, for the coverage table.

    `records`: the table rows (with `status` and `message`) whose results answer it, or None
    where code and tests answer it (`how` says so in the note). A row that ran out of memory is
    a result; one skipped or failed is not. No result at all: "skipped" when every row was
    skipped (with the reasons), "failed" otherwise. Some results: "answered", or "partly
    answered" when `missing` says what the section leaves out or some rows were skipped or
    failed; the note counts the rows that did not end `ok`, with their reasons.
    """
    notes = [note for note in (missing, how) if note]
    partly = bool(missing)
    if records is not None:
        if records.empty:
            return {"status": "skipped", "note": "no configuration of it in this preset",
                    "anchor": anchor}
        counts = records["status"].value_counts()
        results = counts.get("ok", 0) + counts.get("oom", 0)
        reasons = {status: sorted({reason(m) for m in
                                   records.loc[records["status"] == status, "message"]} - {""})
                   for status in ("skipped", "error")}
        if results == 0:
            status = "skipped" if counts.get("skipped", 0) == len(records) else "failed"
            return {"status": status, "anchor": anchor,
                    "note": "; ".join(reasons["skipped"] + reasons["error"])}
        for status in ("skipped", "oom", "error"):
            if counts.get(status, 0):
                partly |= status != "oom"
                detail = f" ({'; '.join(reasons[status])})" if reasons.get(status) else ""
                notes.append(f"{counts[status]} of {len(records)} configurations {status}{detail}")
    return {"status": "partly answered" if partly else "answered", "note": "; ".join(notes),
            "anchor": anchor}
