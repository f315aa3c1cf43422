"""What the README's two commands cost, rendered from measured records so that it cannot drift.

    docs/costs.json            the CPU figures: a fresh clone's setup, main job and test
                               commands on a 2-core machine, timed by scripts/measure_costs.py
                               (with the commit, the date and the test counts)
    docs/reference-run/...     the GPU figures: the committed reference run's job times

`costs_block` renders both as the README's cost table, which sits between the COSTS markers;
`python -m cs336_systems.report.costs` rewrites that block in README.md, and
tests/report/test_readme.py fails when the README and the records disagree.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[3]
COSTS = CHECKOUT / "docs" / "costs.json"
REFERENCE = CHECKOUT / "docs" / "reference-run" / "results" / "assignment"
BEGIN, END = "<!-- COSTS: rendered from docs/costs.json and the reference run -->", \
    "<!-- /COSTS -->"


def duration(seconds: float) -> str:
    """'48 s', '5 min 51 s', '1 h 23 min'."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def reference_jobs(reference: Path = REFERENCE) -> dict:
    """The reference run's jobs: how many carry a job time, their seconds in all, its GPUs."""
    jobs, seconds, gpus = 0, 0.0, set()
    for facts_path in sorted((reference / "sections").glob("*.json")):
        facts = json.loads(facts_path.read_text())
        gpus |= set(facts.get("env", {}).get("gpu", []))
        for t in facts.get("job_times", {}).values():
            jobs += 1
            seconds += t["startup_s"] + t["measuring_s"]
    return {"jobs": jobs, "seconds": seconds, "gpus": sorted(gpus)}


def costs_block(costs: dict, reference: dict) -> str:
    """The README's cost table."""
    steps = costs["steps"]
    cpu = f"{costs['machine']['cores']}-core CPU, no GPU"
    lines = [
        BEGIN,
        f"| command | {cpu} (`smoke` preset) | GPUs (`assignment` preset) |",
        "|---|---|---|",
        f"| `scripts/setup.sh` | {duration(steps['setup_s'])} | (keeps the GPU box's torch) |",
        (f"| the main job | {duration(steps['main_job_s'])}; again with nothing to redo "
         f"{duration(steps['main_job_again_s'])} | {reference['jobs']} jobs whose own times add up "
         f"to {duration(reference['seconds'])} of GPU time ({', '.join(reference['gpus'])}); "
         "with several GPUs, jobs run side by side |"),
        (f"| the tests | {duration(steps['tests_s'])} ({steps['tests_passed']} passed, "
         f"{steps['tests_skipped']} skipped: they need a GPU) | |"),
        (f"| `pytest -m \"not pipeline\"` | {duration(steps['quick_tests_s'])} "
         f"({steps['quick_tests_passed']} passed) | |"),
        "",
        (f"_Measured from a fresh clone at commit {costs['commit']} on {costs['date']} "
         f"(Python {costs['machine']['python']}, `scripts/measure_costs.py`); the GPU column "
         "from the committed reference run's records._"),
        END,
    ]
    return "\n".join(lines)


def current_block(readme: str) -> str | None:
    found = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), readme, re.DOTALL)
    return found.group(0) if found else None


def render_readme(readme_path: Path = CHECKOUT / "README.md", costs_path: Path = COSTS) -> None:
    """Rewrite the README's cost block from the records."""
    readme = readme_path.read_text()
    if current_block(readme) is None:
        sys.exit(f"{readme_path} has no block between '{BEGIN}' and '{END}'")
    block = costs_block(json.loads(costs_path.read_text()), reference_jobs())
    readme_path.write_text(readme.replace(current_block(readme), block))


if __name__ == "__main__":
    render_readme()
