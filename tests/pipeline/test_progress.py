"""The log's progress line: each section's jobs done of planned, and the time left from the
reference run's job times on the same GPU (snakemake_logger_plugin_cs336)."""

import json
from collections import Counter

from snakemake_logger_plugin_cs336 import Progress, reference_job_seconds, rule_sections
from support.checkout import ROOT


def test_every_rule_of_a_section_counts_for_it():
    sections = rule_sections()
    assert sections["benchmark"] == "benchmark" and sections["benchmark_tables"] == "benchmark"
    assert sections["ddp"] == "distributed" and sections["benchmark_compiled"] == "attention"
    assert "writeup" not in sections and "section_markdown" not in sections  # report's


def test_the_reference_run_gives_each_section_its_mean_job_time_on_its_gpu():
    means = reference_job_seconds("assignment", "NVIDIA H200")
    facts = json.loads((ROOT / "docs/reference-run/results/assignment/sections/benchmark.json")
                       .read_text())
    times = [t["startup_s"] + t["measuring_s"] for t in facts["job_times"].values()]
    assert means["benchmark"] == sum(times) / len(times)
    assert reference_job_seconds("assignment", "NVIDIA A100") == {}
    assert reference_job_seconds("smoke", "NVIDIA H200") == {}
    assert reference_job_seconds("assignment", None) == {}


def test_the_line_says_what_is_done_and_what_is_left():
    progress = Progress(Counter(benchmark=4, flash=2), Counter(benchmark=1), {"benchmark": 60.0,
                                                                             "flash": 30.0})
    assert progress.line("benchmark", "NVIDIA H200") == (
        "progress: benchmark 1 of 4 jobs, the run 1 of 6; about 4 min left at the reference "
        "run's pace on NVIDIA H200 (its job times, one job at a time)")
    unknown = Progress(Counter(benchmark=4), Counter(benchmark=4), {})
    assert unknown.line("benchmark", None) == (
        "progress: benchmark 4 of 4 jobs, the run 4 of 4; no reference job times for this "
        "preset on a machine without a GPU")
