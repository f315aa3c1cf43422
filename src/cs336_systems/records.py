"""The per-configuration JSON record every experiment job writes, read and written without torch.

    {"section", "config": {...}, "status": "ok" | "oom" | "skipped" | "error",
     "metrics": {...}, "env": {"device", "gpu", "torch", "triton", "git", "time",
     "placement"?, "job_time"?}, "message"?}

Units live in metric names (`forward_ms_mean`, `peak_gib`). Records are written atomically
(temp file, then rename), so an interrupted job never leaves a half-written record behind.
Jobs make records through `pipeline.records.run_and_record`; the report side reads them here
(and checks what each section needs of them in `report.record_schemas`).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from pathlib import Path

STATUSES = ("ok", "oom", "skipped", "error")
RECORD_KEYS = ("section", "config", "status", "metrics", "env")
# Folders of a preset's results that hold no records: the report's own outputs and job logs.
NOT_RECORDS = ("sections", "tables", "figures", "logs")


@functools.cache
def git_commit() -> str:
    """The commit the code came from: $CS336_GIT_COMMIT (for copies without .git), else git
    (`-dirty` where tracked files have changes)."""
    if commit := os.environ.get("CS336_GIT_COMMIT"):
        return commit
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here,
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, capture_output=True, text=True, check=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class Skip(Exception):
    """Raised by an experiment that cannot run here (e.g. GPU-only on a CPU machine): its record
    is `skipped`, with this message as the reason (`pipeline.records.run_and_record`)."""


class DamagedRecord(ValueError):
    """A record file that is not a record: it names the file, what is wrong with it and the
    command that measures its configuration again."""


def remeasure_command(path: str | Path) -> str:
    """The command that re-measures the configuration whose record is at `path`
    (results/<preset>/...): Snakemake forced on that one file."""
    parts = Path(path).parts
    preset = parts[parts.index("results") + 1] if "results" in parts[:-2] else None
    config = f" --config preset={preset}" if preset else ""
    return f"snakemake --cores 1 --force {path}{config}"


def damaged(path: str | Path, what: str) -> DamagedRecord:
    """The error for a record at `path` of which `what` is wrong."""
    return DamagedRecord(f"{path}: {what}. Measure it again with `{remeasure_command(path)}`.")


def read_record(path: str | Path) -> dict:
    """The record at `path`, checked: valid JSON, an object with the contract's keys
    (RECORD_KEYS) and a known status; anything else raises `DamagedRecord`."""
    try:
        with open(path) as f:
            record = json.load(f)
    except json.JSONDecodeError as error:
        # "Unterminated string starting at" ends in "at" itself
        where = f"{error.msg.removesuffix(' at')} at line {error.lineno}, column {error.colno}"
        raise damaged(path, f"not valid JSON ({where}); the file may be truncated") from None
    except UnicodeDecodeError:
        raise damaged(path, "not text (a record is UTF-8 JSON)") from None
    if not isinstance(record, dict):
        raise damaged(path, f"a record is a JSON object, this is a {type(record).__name__}")
    if missing := [key for key in RECORD_KEYS if key not in record]:
        raise damaged(path, f"missing {', '.join(repr(k) for k in missing)} (a record has "
                            f"{', '.join(RECORD_KEYS)})")
    if record["status"] not in STATUSES:
        raise damaged(path, f"unknown status {record['status']!r} (a record's status is one "
                            f"of {', '.join(STATUSES)})")
    for key in ("config", "metrics", "env"):
        if not isinstance(record[key], dict):
            raise damaged(path, f"{key!r} is a {type(record[key]).__name__}, not an object")
    return record


def record_paths(results_dir: str | Path) -> list[Path]:
    """Every record under a preset's results folder (its JSON files outside NOT_RECORDS)."""
    results_dir = Path(results_dir)
    return [p for p in sorted(results_dir.rglob("*.json"))
            if p.relative_to(results_dir).parts[0] not in NOT_RECORDS]


def check_records(results_dir: str | Path) -> int:
    """Reads every record under a preset's results folder through `read_record` (raising on the
    first damaged one); returns how many there are."""
    paths = record_paths(results_dir)
    for path in paths:
        read_record(path)
    return len(paths)


def unwritable(folder: str | Path) -> str | None:
    """Why files cannot be written into `folder` (made where missing) by this user, or None:
    checked before a run or a measurement, so that it fails in one line, not after the work."""
    folder = Path(folder)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("/"))
    if not existing.is_dir():
        return f"cannot write {folder}: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot write {folder}: {existing} is not writable for this user"
    return None


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write to a temp file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, payload: dict) -> None:
    write_text_atomic(path, json.dumps(payload, indent=1, default=str) + "\n")
