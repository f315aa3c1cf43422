"""The per-configuration JSON record every experiment job writes, and the environment it ran in.

    {"section", "config": {...}, "status": "ok" | "oom" | "skipped" | "error",
     "metrics": {...}, "env": {"device", "gpu", "torch", "triton", "git", "time",
     "placement"?, "job_time"?}, "message"?}

Units live in metric names (`forward_ms_mean`, `peak_gib`). Records are written atomically
(temp file, then rename), so an interrupted job never leaves a half-written record behind.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import logging
import os
import platform
import subprocess
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cs336_systems.measure import job_clock
from cs336_systems.pipeline import gpus

STATUSES = ("ok", "oom", "skipped", "error")

log = logging.getLogger("cs336_systems")


class Skip(Exception):
    """Raised by an experiment that cannot run here (e.g. GPU-only on a CPU machine)."""


class OutOfMemoryIn(torch.OutOfMemoryError):
    """An out-of-memory in one pass of a measurement, carrying what was measured before it: the
    record gets status `oom`, `metrics` plus `oom_pass`, and the allocator's message."""

    def __init__(self, pass_name: str, metrics: dict, cause: BaseException):
        super().__init__(f"out of memory in the {pass_name} pass: "
                         f"{str(cause).splitlines()[0] if str(cause) else type(cause).__name__}")
        self.pass_name = pass_name
        self.metrics = metrics


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise Skip("CUDA was requested but no CUDA device is available on this machine")
    return device


@functools.cache
def git_commit() -> str:
    """The commit the code came from: $CS336_GIT_COMMIT (for copies without .git), else git."""
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


def environment(device: torch.device | str | None = None) -> dict[str, Any]:
    device = torch.device(device) if device is not None else resolve_device()
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    env = {
        "device": device.type,
        "gpu": gpu,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "python": platform.python_version(),
        "git": git_commit(),
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda" and (placement := gpus.placement_of_this_job()) is not None:
        env["placement"] = placement  # which of the machine's GPUs, and how many were busy
    return env


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


def make_record(section: str, config: dict, status: str, metrics: dict | None = None,
                env: dict | None = None, message: str | None = None) -> dict:
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}; allowed: {', '.join(STATUSES)}")
    record = {"section": section, "config": config, "status": status,
              "metrics": metrics or {}, "env": env or environment()}
    if message:
        record["message"] = message
    return record


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def configure_logging(prefix: str = "") -> None:
    """Jobs log to stderr (their Snakemake log file) unless the caller configured logging;
    `prefix` tells apart the processes of one job (torchrun's ranks)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {prefix}%(message)s",
                            datefmt="%H:%M:%S")


def run_and_record(section: str, config: dict, output: str | Path,
                   measure: Callable[[torch.device], dict], device: str = "auto") -> dict:
    """Run `measure(device)` for one configuration and write its record, whatever happens.

    Out-of-memory becomes status `oom`, `Skip` becomes `skipped` with its reason, and any
    other exception `error` with the traceback, so one bad configuration never ends a sweep.
    This is the only writer of records: a distributed job's launcher calls it too.
    """
    configure_logging()
    log.info("%s: %s", section, json.dumps(config, default=str))
    job_clock.begin_measurement()
    env_device: torch.device | str = "cpu"
    try:
        resolved = resolve_device(device)
        env_device = resolved
        if resolved.type == "cuda":
            torch.cuda.init()  # here, so that the job's time says what CUDA's start-up cost
        job_clock.mark("device")
        try:
            metrics = measure(resolved)
        finally:
            job_clock.mark("measured")
        record = make_record(section, config, "ok", metrics, environment(resolved))
    except Skip as skip:
        record = make_record(section, config, "skipped", env=environment(env_device),
                             message=str(skip))
    except OutOfMemoryIn as oom:
        record = make_record(section, config, "oom", {**oom.metrics, "oom_pass": oom.pass_name},
                             environment(env_device), message=str(oom))
    except Exception as error:  # noqa: BLE001 - every failure becomes data
        status = "oom" if is_out_of_memory(error) else "error"
        message = str(error).splitlines()[0] if status == "oom" else traceback.format_exc()
        record = make_record(section, config, status, env=environment(env_device),
                             message=message)
    job_clock.mark("written")
    if (job_time := job_clock.breakdown()) is not None:
        record["env"]["job_time"] = job_time
    write_json_atomic(output, record)
    log.info("%s: status %s%s -> %s", section, record["status"],
             f" ({record['message']})" if "message" in record else "", output)
    if job_time is not None:
        log.info("job time: start-up %.2f s (%s), measuring %.2f s", job_time["startup_s"],
                 ", ".join(f"{k} {v:.2f}" for k, v in job_time["stages_s"].items()),
                 job_time["measuring_s"])
    return record


RECORD_KEYS = ("section", "config", "status", "metrics", "env")
# Folders of a preset's results that hold no records: the report's own outputs and job logs.
NOT_RECORDS = ("sections", "tables", "figures", "logs")


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


def read_record(path: str | Path) -> dict:
    """The record at `path`, checked: valid JSON, an object with the contract's keys
    (RECORD_KEYS) and a known status; anything else raises `DamagedRecord`."""
    def damaged(what: str) -> DamagedRecord:
        return DamagedRecord(f"{path}: {what}. Measure it again with "
                             f"`{remeasure_command(path)}`.")
    try:
        with open(path) as f:
            record = json.load(f)
    except json.JSONDecodeError as error:
        raise damaged(f"not valid JSON ({error.msg} at line {error.lineno}, column "
                      f"{error.colno}); the file may be truncated") from None
    if not isinstance(record, dict):
        raise damaged(f"a record is a JSON object, this is a {type(record).__name__}")
    if missing := [key for key in RECORD_KEYS if key not in record]:
        raise damaged(f"missing {', '.join(repr(k) for k in missing)} (a record has "
                      f"{', '.join(RECORD_KEYS)})")
    if record["status"] not in STATUSES:
        raise damaged(f"unknown status {record['status']!r} (a record's status is one of "
                      f"{', '.join(STATUSES)})")
    return record


def check_records(results_dir: str | Path) -> int:
    """Reads every record under a preset's results folder through `read_record` (raising on the
    first damaged one); returns how many there are."""
    results_dir = Path(results_dir)
    paths = [p for p in sorted(results_dir.rglob("*.json"))
             if p.relative_to(results_dir).parts[0] not in NOT_RECORDS]
    for path in paths:
        read_record(path)
    return len(paths)
