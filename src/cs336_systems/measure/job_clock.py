"""Where one job's wall time goes, from Snakemake's dispatch to its record.

The job's code marks the end of each stage as it gets there; the record keeps the marks'
breakdown (`breakdown()`, in `env.job_time`), and the writeup adds them up per section:

    dispatched  Snakemake wrote the job's script                         (start)
    process     the job's process started              -> dispatch
    entry       the job's own code began (interpreter, Snakemake's preamble) -> interpreter
    placed      it holds the GPUs it asked for (pipeline.gpus)      -> gpu_wait
    forked      the job server's child took the job    -> server (0 without the server)
    imported    the experiment's module was imported   -> imports
    device      the device resolved, CUDA initialised  -> device
    warmed      the timing harness ended its warm-up   -> warm_up (where a job has one)
    measured    the measurement returned               -> measuring
    written     the record was written                 -> teardown

Start-up is everything before the measurement begins (dispatch to device); measuring is the
measurement itself, its warm-up and compilation included. Times are seconds since the epoch
(`time.time()`), so marks taken in different processes of one job line up.
"""

from __future__ import annotations

import os
import time

ORDER = ("dispatched", "process", "entry", "placed", "forked", "imported", "device", "warmed", "measured",
         "written")
SEGMENTS = {"process": "dispatch", "entry": "interpreter", "placed": "gpu_wait",
            "forked": "server",
            "imported": "imports", "device": "device", "warmed": "warm_up",
            "measured": "measuring", "written": "teardown"}
STARTUP = ("dispatch", "interpreter", "gpu_wait", "server", "imports", "device")
MEASURING = ("warm_up", "measuring")

_marks: dict[str, float] = {}


def mark(name: str, at: float | None = None) -> None:
    """Record that the job reached `name` (now, or at `at`); a stage is marked once."""
    if name not in ORDER:
        raise ValueError(f"unknown job mark {name!r}; allowed: {', '.join(ORDER)}")
    _marks.setdefault(name, time.time() if at is None else at)


def begin_measurement() -> None:
    """Forget the marks of an earlier measurement in this process (from `device` on): a job
    measures once, but a test may call `run_and_record` many times."""
    for name in ORDER[ORDER.index("device"):]:
        _marks.pop(name, None)


def marks() -> dict[str, float]:
    return dict(_marks)


def restore(marks_: dict[str, float]) -> None:
    """Take over the marks another process of the same job made (the job server's client)."""
    _marks.clear()
    _marks.update(marks_)


def process_started() -> float | None:
    """When the kernel started this process, in seconds since the epoch (Linux, 10 ms
    resolution); None where /proc cannot say."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def breakdown(marks_: dict[str, float] | None = None) -> dict | None:
    """Seconds of each stage between consecutive marks, and the job's start-up and measuring
    totals; None without any mark. A stage whose end was not marked is left out."""
    marks_ = _marks if marks_ is None else marks_
    present = [name for name in ORDER if name in marks_]
    if len(present) < 2:
        return None
    stages = {SEGMENTS[end]: max(0.0, marks_[end] - marks_[start])
              for start, end in zip(present, present[1:])}
    return {"start": marks_[present[0]], "stages_s": stages,
            "startup_s": sum(stages.get(s, 0.0) for s in STARTUP),
            "measuring_s": sum(stages.get(s, 0.0) for s in MEASURING)}
