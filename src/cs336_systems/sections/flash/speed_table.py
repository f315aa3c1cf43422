"""The flash section's speed table: one row per (target, shape) of `targets.TARGETS`, from the
records of `sections/flash/time_targets.py` (one per group of targets).

A row holds our value and, where the target has a reference, the reference's value measured
in the same process, their ratio (ours / reference), the target, and `meets_target`. A row
whose measurement did not end `ok` (out of memory, skipped, timed out, or a failed job), or
whose fixed bound was quoted for another GPU ("not comparable"), has no verdict: its status
and reason say why. `within_spread` says whether the value is within the
measured spread (the rounds' standard deviations) of the bound, where a verdict could flip
from one run to the next.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.records import read_record
from cs336_systems.report import facts, tables
from cs336_systems.report.render import fmt, fmt_ratio
from cs336_systems.sections.flash.targets import TARGETS, UNITS_SHOWN, Target, graph_twin

COLUMNS = ["target", "title", "shape", "precision", "causal", "ours", "value", "value_std",
           "value_min", "value_max", "unit",
           "reference", "reference_value", "reference_std", "ratio", "compared", "bound",
           "target_text", "meets_target", "within_spread", "off_by", "stretch", "status",
           "reason", "commit"]


def _shape(shape) -> str:
    return "x".join(map(str, shape)) if shape else ""


def _measurements(record: dict) -> dict[tuple[str, tuple], dict]:
    """(implementation key, shape) -> its measurement, in an `ok` record."""
    return {(m["attention"], tuple(m["shape"])): m for m in record["metrics"].get("measurements",
                                                                                  [])}


def _base(target: Target, record: dict, shape) -> dict:
    config = record["config"]
    return {"target": target.key, "title": target.name, "shape": _shape(shape),
            "precision": config.get("precision"), "causal": config.get("causal"),
            "ours": target.ours.label, "unit": target.unit,
            "reference": target.reference.label if target.reference else "",
            "bound": target.bound, "target_text": target.describe(), "stretch": target.stretch,
            "commit": record["env"].get("git")}


def _not_ok(row: dict, status: str, why: str) -> dict:
    return {**row, "status": status, "reason": why, "meets_target": None}


def target_row(target: Target, record: dict, shape) -> dict:
    """One target at one shape, from its group's record."""
    row = _base(target, record, shape)
    if record["status"] != "ok":
        return _not_ok(row, record["status"], facts.reason(record.get("message")))
    found = _measurements(record)
    needed = [target.ours, *([target.reference] if target.reference else [])]
    if missing := [run.label for run in needed if (run.key, tuple(shape)) not in found]:
        return _not_ok(row, "missing", f"{', '.join(missing)} not in the group's record, which "
                       "predates this target; rerun the group's job")
    ours = found[(target.ours.key, tuple(shape))]
    reference = found[(target.reference.key, tuple(shape))] if target.reference else None
    rounds = ours.get("rounds") or [ours.get("value")]
    row.update(value=ours.get("value"), value_std=ours.get("std"), value_min=min(rounds),
               value_max=max(rounds))
    if reference is not None:
        row.update(reference_value=reference.get("value"), reference_std=reference.get("std"))
    for label, m in ((target.ours.label, ours), (row["reference"], reference)):
        if m is not None and m["status"] != "ok":
            return _not_ok(row, m["status"], f"{label}: {facts.reason(m.get('message'))}")
    gpu = record["env"].get("gpu") or record["env"].get("device") or "unknown"
    if target.bound_gpu and target.bound_gpu not in str(gpu):
        return _not_ok(row, "not comparable", f"the bound is an {target.bound_gpu}'s; this ran "
                       f"on {gpu}")
    return {**row, **verdict(target, row), "status": "ok", "reason": ""}


def verdict(target: Target, row: dict) -> dict:
    """The compared value (the ratio where there is a reference), whether it meets the
    target, how far it is from the bound, and whether the bound is inside the spread."""
    value, reference = row["value"], row.get("reference_value")
    if target.reference:
        ratio = value / reference
        threshold, threshold_std = target.bound * reference, _scaled(row["reference_std"],
                                                                     target.bound)
    else:
        ratio, threshold, threshold_std = None, target.bound, 0.0
    compared = ratio if target.reference else value
    near = facts.speedup(value, threshold, row["value_std"], threshold_std)
    return {"ratio": ratio, "compared": compared, "meets_target": target.meets(compared),
            "off_by": target.off_by(compared),
            "within_spread": near["within_spread"] if near else None}


def _scaled(std, factor: float):
    return None if std is None else std * factor


def speed_rows(record_paths: list[str]) -> list[dict]:
    """Every target's rows, in the targets' order, shapes in their group's order; a group
    without a record gives no rows (a preset that leaves it out)."""
    records = {r["config"]["group"]: r for r in map(read_record, record_paths)}
    rows = []
    for target in TARGETS:
        record = records.get(target.group)
        if record is None:
            continue
        shapes = record["config"]["shapes"] or [None]
        rows += [target_row(target, record, shape) for shape in shapes]
    return rows


def speed_table(record_paths: list[str]) -> pd.DataFrame:
    return pd.DataFrame(speed_rows(record_paths), columns=COLUMNS)


def shown(value, unit: str) -> str:
    """A value as the table shows it: '0.82x', '6.120 ms', '48 s', '65536'."""
    if value is None or pd.isna(value):
        return ""
    if unit == "x":
        return fmt_ratio(value)
    if unit == "ms":
        return f"{fmt(value, 3)} ms"
    if unit == "s":
        return f"{fmt(value, 0)} s"
    return f"{value:g}{UNITS_SHOWN[unit]}"


def _pm(value, std, unit: str) -> str:
    text = shown(value, unit)
    return f"{text} ± {fmt(std, 3)}" if text and std is not None and pd.notna(std) else text


def _time_unit(row: pd.Series) -> str:
    """The unit of the measured values: a ratio target measures milliseconds."""
    return "ms" if row["unit"] == "x" else row["unit"]


def speed_display(table: pd.DataFrame) -> pd.DataFrame:
    """The markdown table: measured values (± the rounds' standard deviation), the ratio and
    the verdict, and whether the bound lies within the spread; a row that was not measured
    shows its status."""
    def yes_no(row, column):
        value = row[column]
        return "" if row["status"] != "ok" or value is None or pd.isna(value) else (
            "true" if value else "false")
    return pd.DataFrame({
        "target": table["title"],
        "shape": [f"{r['shape']} {r['precision']}" if r["shape"] else ""
                  for _, r in table.iterrows()],
        "ours": [_pm(r["value"], r["value_std"], _time_unit(r)) for _, r in table.iterrows()],
        "reference": table["reference"],
        "reference (same process)": [_pm(r["reference_value"], r["reference_std"], "ms")
                                     for _, r in table.iterrows()],
        "ratio": [shown(r["ratio"], "x") for _, r in table.iterrows()],
        "target value": table["target_text"],
        "meets_target": [yes_no(r, "meets_target") for _, r in table.iterrows()],
        "bound within spread": [yes_no(r, "within_spread") for _, r in table.iterrows()],
        "status": table["status"],
        "commit": table["commit"],
    })


def _unmet(row: pd.Series) -> dict:
    return {"title": row["title"], "shape": row["shape"], "target": row["target_text"],
            "shown": shown(row["compared"], row["unit"]), "off_by": row["off_by"],
            "side": ("above" if row["compared"] > row["bound"]
                     else "below" if row["compared"] < row["bound"] else "at"),
            "within_spread": row["within_spread"], "stretch": bool(row["stretch"])}


def speed_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per target (title and bound): its shapes, how many meet it, and the range of
    the compared values (ours / reference, or the value itself) with the farthest miss."""
    rows = []
    for (title, bound), group in table.groupby(["title", "target_text"], sort=False):
        ok = group[group["status"] == "ok"]
        met = ok[ok["meets_target"] == True]  # noqa: E712 - object column of True/False/None
        missed = ok[ok["meets_target"] == False]  # noqa: E712
        unit = group["unit"].iloc[0]
        values = ok["compared"].dropna()
        worst = missed.loc[missed["off_by"].idxmax()] if len(missed) else None
        rows.append({
            "target": title, "bound": bound, "shapes": len(group),
            "met": f"{len(met)} of {len(group)}",
            "measured": (f"{shown(values.min(), unit)} to {shown(values.max(), unit)}"
                         if len(values) > 1 else shown(values.iloc[0], unit)
                         if len(values) else ""),
            "farthest miss": "" if worst is None else
            f"{shown(worst['compared'], unit)} at {worst['shape']}"
            + (" (within spread)" if worst["within_spread"] else ""),
            "not measured": len(group) - len(ok)})
    return pd.DataFrame(rows)


def speed_facts(table: pd.DataFrame, record_paths: list[str]) -> dict:
    """The speed table's markdown (the whole table up to `MAX_SHOWN_ROWS` rows, else one row
    per target, the whole one in its CSV) and counts, each unmet target with how far it is,
    and each row that was not measured with its reason."""
    ok = table[table["status"] == "ok"]
    rounds = sorted({read_record(p)["config"]["rounds"] for p in record_paths})
    met = ok[ok["meets_target"] == True]  # noqa: E712 - object column of True/False/None
    whole = len(table) <= tables.MAX_SHOWN_ROWS
    return {
        "whole": whole,
        "table": tables.to_markdown(speed_display(table) if whole else speed_summary(table))
        if len(table) else "",
        "rows": len(table),
        "measured": len(ok),
        "unmeasured": len(table) - len(ok),
        "met": len(met),
        "all_met": bool(len(table)) and len(met) == len(table),
        "rounds": rounds[0] if len(rounds) == 1 else None,
        "unmet": [_unmet(r) for _, r in ok[ok["meets_target"] == False].iterrows()],  # noqa: E712
        "not_measured": not_measured(table),
        "host_bound": host_bound(table),
    }


def host_bound(table: pd.DataFrame) -> list[dict]:
    """Each (target, shape) that misses its target as an eager step while the same comparison
    in GPU time (`targets.graph_twin`: each step replayed from a CUDA graph, ours and the
    reference alike) meets it at that shape. `host` says whether the host's time is what the
    eager row misses by: each round of our eager step took longer than every round of the same
    step replayed. Where one did not, the eager steps' kernels took as long as the replayed
    ones, and the two runs differ by their spread, not by the host."""
    ok = table[table["status"] == "ok"]
    verdicts = {(r["target"], r["shape"]): r for _, r in ok.iterrows()}
    found = []
    for target in TARGETS:
        twin = graph_twin(target)
        if twin is None:
            continue
        missed = ok[(ok["target"] == target.key) & (ok["meets_target"] == False)]  # noqa: E712
        for _, row in missed.iterrows():
            graph = verdicts.get((twin.key, row["shape"]))
            if graph is not None and graph["meets_target"] == True:  # noqa: E712
                found.append({"title": row["title"], "shape": row["shape"],
                              "target": row["target_text"],
                              "eager": shown(row["compared"], row["unit"]),
                              "graph": shown(graph["compared"], graph["unit"]),
                              "graph_within_spread": bool(graph["within_spread"]),
                              "host": bool(row["value_min"] > graph["value_max"]),
                              "eager_ms": shown(row["value"], _time_unit(row)),
                              "graph_ms": shown(graph["value"], _time_unit(graph))})
    return found


def not_measured(table: pd.DataFrame) -> list[dict]:
    """The rows that were not measured, grouped by status and reason: {status, reason, rows},
    each (title, shape) once (targets against two references share a title and a shape)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for _, r in table[table["status"] != "ok"].iterrows():
        where = f"{r['title']} at {r['shape']}" if r["shape"] else r["title"]
        rows = groups.setdefault((r["status"], r["reason"]), [])
        if where not in rows:
            rows.append(where)
    return [{"status": status, "reason": why, "rows": rows}
            for (status, why), rows in groups.items()]
