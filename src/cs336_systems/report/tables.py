"""Records to tidy tables: one row per configuration, written as CSV and markdown."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from cs336_systems.lm.sizes import size_label
from cs336_systems.records import read_record

ENV_COLUMNS = ("device", "gpu", "torch", "triton", "git")


def records_frame(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Flatten records: config keys, status, message, scalar metrics and `env_*` columns.

    List-valued metrics (raw samples) stay in the JSON records and are left out here.
    """
    rows = []
    for path in paths:
        record = read_record(path)
        row = dict(record["config"])
        row["status"] = record["status"]
        row["message"] = record.get("message", "")
        row.update({k: v for k, v in record["metrics"].items() if not isinstance(v, (list, dict))})
        row.update({f"env_{k}": record["env"].get(k) for k in ENV_COLUMNS})
        rows.append(row)
    return pd.DataFrame(rows)


def env_summary(*frames: pd.DataFrame) -> dict[str, list[str]]:
    """Distinct values of each `env_*` column (device, GPU, versions, commit) over the tables:
    what a section's facts say about where and from which code its numbers came."""
    summary = {}
    for key in ENV_COLUMNS:
        values = {str(v) for f in frames if f"env_{key}" in f for v in f[f"env_{key}"].dropna()}
        summary[key] = sorted(values)
    return summary


def env_columns(frame: pd.DataFrame) -> list[str]:
    """The `env_*` columns of a records table, in order."""
    return [c for c in frame.columns if c.startswith("env_")]


def write_table(frame: pd.DataFrame, csv_path: str | Path) -> None:
    """The full table as CSV (the tidy data behind a section's tables)."""
    Path(csv_path).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(csv_path, index=False)


def format_number(value) -> str:
    """Four significant digits without scientific notation; '' for missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


# A table of more rows than this goes to its CSV; the text shows a summary of it.
MAX_SHOWN_ROWS = 25


def to_markdown(frame: pd.DataFrame) -> str:
    """A markdown table; floats get `format_number`, strings are printed as they are, and a
    `size` column names its model sizes as the writeup does (`lm.sizes.size_label`)."""
    if frame.empty:
        return "_(no rows)_"
    shown = frame.copy()
    if "size" in shown.columns:
        shown["size"] = shown["size"].map(size_label)
    for column in shown.columns:
        if pd.api.types.is_float_dtype(shown[column]):
            shown[column] = shown[column].map(format_number)
    return shown.to_markdown(index=False, disable_numparse=True)


def long_table(whole: pd.DataFrame, csv_path: str | Path,
               summary: pd.DataFrame | None = None) -> dict:
    """A table for the text, as the `long_table` filter of report.render shows it: the whole
    table up to `MAX_SHOWN_ROWS` rows; beyond that a line linking the CSV of its data
    (`csv_path`, the section's tidy table) and `summary`, which the template introduces."""
    whole_shown = len(whole) <= MAX_SHOWN_ROWS
    shown = whole if whole_shown else summary
    return {"whole": whole_shown, "rows": len(whole), "csv": str(csv_path),
            "markdown": to_markdown(shown) if shown is not None else ""}


def mean_pm_std(mean: float, std: float, digits: int = 2) -> str:
    """'12.34 ± 0.56', or '' for a missing value (an oom or skipped row)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return ""
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def ensure_columns(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Add missing columns as NaN (a sweep whose every row failed has no metric columns)."""
    for column in columns:
        if column not in frame.columns:
            frame[column] = float("nan")
    return frame


def read_table(csv_path: str | Path) -> pd.DataFrame:
    return pd.read_csv(csv_path, keep_default_na=True)
