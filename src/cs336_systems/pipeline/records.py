"""The one writer of records (`run_and_record`) and the environment a record names.

A job measures one configuration and `run_and_record` writes its record, whatever happens: an
out-of-memory becomes status `oom`, `Skip` `skipped` with its reason, any other exception
`error` with the traceback. The record's shape, and reading it back without torch, are in
`cs336_systems.records`.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import platform
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cs336_systems.measure import job_clock
from cs336_systems.pipeline import gpus
from cs336_systems.records import STATUSES, Skip, git_commit, unwritable, write_json_atomic

log = logging.getLogger("cs336_systems")


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
    if problem := unwritable(Path(output).parent):  # before the measurement, not after it
        log.error(problem)
        raise SystemExit(1)
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
