"""Snakemake's log with each section's progress and the time left: `--logger cs336` (the
default profile sets it).

It prints what Snakemake's own log prints (through Snakemake's formatter and filter), less the
`Shell command: None` line that every script rule adds, and after each finished job a line

    progress: benchmark 12 of 96 jobs, the run 40 of 420; about 23 min left at the reference
    run's pace on NVIDIA H200 (its job times, one job at a time)

The estimate takes, for each section, the mean time of a job (start-up and measuring) in the
committed reference run of the same preset (`docs/reference-run/results/<preset>/sections/`)
measured on this machine's GPU, times the section's jobs still to run. Where the reference run
has no such preset or GPU, the line says so. The sections are the rules files'
(`workflow/rules/<section>.smk`); rules of no section count as "report".
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.common import LogEvent

CHECKOUT = Path(__file__).resolve().parents[2]
RULES = CHECKOUT / "workflow" / "rules"
REFERENCE = CHECKOUT / "docs" / "reference-run" / "results"
NOT_SECTIONS = ("common", "report", "archive")


@cache
def rule_sections(rules_dir: Path = RULES) -> dict[str, str]:
    """rule name -> the section whose rules file defines it."""
    found = {}
    for path in sorted(rules_dir.glob("*.smk")):
        if path.stem in NOT_SECTIONS:
            continue
        for name in re.findall(r"^rule (\w+):", path.read_text(), re.MULTILINE):
            found[name] = path.stem
    return found


@cache
def machine_gpu() -> str | None:
    """The first GPU's name as `nvidia-smi` gives it, or None."""
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout.strip()
    return out.splitlines()[0].strip() if out else None


def reference_job_seconds(preset: str, gpu: str | None,
                          reference: Path = REFERENCE) -> dict[str, float]:
    """section -> the mean seconds of one job (start-up and measuring) in the reference run of
    `preset`, over the jobs whose records were measured on `gpu`; {} where there are none."""
    if gpu is None:
        return {}
    means = {}
    for facts_path in sorted((reference / preset / "sections").glob("*.json")):
        facts = json.loads(facts_path.read_text())
        if gpu not in facts.get("env", {}).get("gpu", []):
            continue
        times = [t["startup_s"] + t["measuring_s"] for t in facts.get("job_times", {}).values()]
        if times:
            means[facts_path.stem] = sum(times) / len(times)
    return means


@dataclass
class Progress:
    """Jobs planned and done, by section, and the estimate of the time left."""

    planned: Counter
    done: Counter
    seconds_per_job: dict[str, float]

    def left_s(self) -> float | None:
        left = {s: self.planned[s] - self.done[s] for s in self.planned}
        known = {s: n for s, n in left.items() if n > 0}
        if not self.seconds_per_job:
            return None
        return sum(n * self.seconds_per_job.get(s, 0.0) for s, n in known.items())

    def line(self, section: str, gpu: str | None) -> str:
        total, done = sum(self.planned.values()), sum(self.done.values())
        head = (f"progress: {section} {self.done[section]} of {self.planned[section]} jobs, "
                f"the run {done} of {total}")
        left = self.left_s()
        if left is None:
            return (f"{head}; no reference job times for this preset on "
                    f"{gpu or 'a machine without a GPU'}")
        return (f"{head}; about {left / 60:.0f} min left at the reference run's pace on {gpu} "
                f"(its job times, one job at a time)")


class LogHandler(LogHandlerBase):
    """Snakemake's stream log (its formatter and filter), and the progress line."""

    def __post_init__(self) -> None:
        from snakemake.logging import ColorizingTextHandler, DefaultFilter, DefaultFormatter

        s = self.common_settings
        self.inner = ColorizingTextHandler(
            nocolor=s.nocolor, stream=sys.stdout if s.stdout else sys.stderr,
            formatter=DefaultFormatter(s.quiet, s.show_failed_logs),
            filter=DefaultFilter(s.quiet, s.debug_dag, s.verbose, s.dryrun, s.printshellcmds))
        self.sections = rule_sections()
        self.jobs: dict[int, str] = {}
        self.progress: Progress | None = None
        self.preset: str | None = None

    def emit(self, record) -> None:
        event = getattr(record, "event", None)
        if event == LogEvent.SHELLCMD and getattr(record, "shellcmd", "") is None:
            return  # "Shell command: None": every rule runs a script
        self.inner.handle(record)
        if event == LogEvent.RUN_INFO and not self.common_settings.dryrun:
            stats = getattr(record, "stats", {}) or {}
            planned = Counter()
            for rule, count in stats.items():
                if rule != "total":
                    planned[self.sections.get(str(rule), "report")] += int(count)
            self.progress = Progress(planned, Counter(), {})
        elif event == LogEvent.JOB_INFO:
            self.jobs[record.jobid] = self.sections.get(record.rule_name, "report")
            if self.preset is None and self.progress is not None:
                self._learn_preset(record)
        elif event == LogEvent.JOB_FINISHED and self.progress is not None:
            section = self.jobs.get(getattr(record, "job_id", None), "report")
            self.progress.done[section] += 1
            self.inner.stream.write(self.progress.line(section, machine_gpu()) + "\n")
            self.inner.flush()

    def _learn_preset(self, record) -> None:
        for path in re.split(r",\s*", str(getattr(record, "output", "") or "")):
            found = re.match(r"results/([^/]+)/", path.strip())
            if found:
                self.preset = found.group(1)
                self.progress.seconds_per_job = reference_job_seconds(self.preset,
                                                                      machine_gpu())
                return

    @property
    def writes_to_stream(self) -> bool:
        return True

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return True

    @property
    def has_formatter(self) -> bool:
        return True

    @property
    def needs_rulegraph(self) -> bool:
        return False
