"""Where the run's time went, by section: each job's start-up and measuring seconds, read from
its record (`env.job_time`, see `measure.job_clock`), added up for the writeup's header.

Every `<section>_tables` job hands its records' times to its facts (`record_times`); the
writeup counts each record once, in the first section (in writeup order) that reads it. Where
jobs ran several at once on a machine with several GPUs, the records also say how many of its
GPUs were busy when each started (`env.placement`): their job times then add up to more than
the run's wall time.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path


def record_times(paths: Iterable[str]) -> dict[str, dict]:
    """{record path: its job time} for the records among `paths` that carry one."""
    times = {}
    for path in paths:
        if not str(path).endswith(".json"):
            continue
        try:
            record = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        job_time = record.get("env", {}).get("job_time") if isinstance(record, dict) else None
        if job_time:
            times[str(path)] = {"startup_s": job_time["startup_s"],
                                "measuring_s": job_time["measuring_s"],
                                "skipped": record.get("status") == "skipped"}
            if placement := record["env"].get("placement"):
                times[str(path)]["gpus_busy"] = placement["busy"]
                times[str(path)]["gpu_pool"] = placement["pool"]
    return times


def section_rows(sections: list[tuple[str, dict[str, dict]]]) -> dict:
    """The header's table from [(section, its facts' record times)] in writeup order: per
    section its jobs and their start-up and measuring seconds, each record counted once."""
    seen: set[str] = set()
    rows = []
    for name, times in sections:
        own = [t for path, t in times.items() if path not in seen]
        seen |= set(times)
        if own:
            rows.append(_row(name, own))
    unique = {path: t for _, times in sections for path, t in times.items()}
    return {"rows": rows, "total": _row("all", list(unique.values())) if unique else None}


def _row(name: str, times: list[dict]) -> dict:
    """One row; `gpus_busy` is the most GPUs that jobs held at once when one of these started
    (pipeline.gpus), of a machine's `gpu_pool`, where the records say (else None). The start-up
    share is of the jobs that measured: a skipped job starts and measures nothing, so a section
    whose jobs were all skipped has none."""
    startup = [t["startup_s"] for t in times]
    measured = [t for t in times if not t.get("skipped")]
    measured_startup = sum(t["startup_s"] for t in measured)
    measuring = sum(t["measuring_s"] for t in measured)
    placed = [t for t in times if "gpus_busy" in t]
    return {"section": name, "jobs": len(times), "skipped": len(times) - len(measured),
            "startup_s": sum(startup),
            "gpus_busy": max((t["gpus_busy"] for t in placed), default=None),
            "gpu_pool": max((t["gpu_pool"] for t in placed), default=None),
            "measuring_s": measuring, "startup_median_s": statistics.median(startup),
            "startup_share": measured_startup / (measured_startup + measuring)
            if measured_startup + measuring > 0 else None}
