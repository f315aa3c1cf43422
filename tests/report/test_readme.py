"""The README's figures that can go stale are rendered from records and checked against them."""

import json
import re
import subprocess
import sys

import pytest

from cs336_systems.report import costs

README = costs.CHECKOUT / "README.md"


def test_the_readme_cost_table_is_the_one_its_records_render():
    block = costs.current_block(README.read_text())
    assert block is not None, "README.md lost its COSTS markers"
    expected = costs.costs_block(json.loads(costs.COSTS.read_text()), costs.reference_jobs())
    assert block == expected, (
        "README.md's cost table differs from docs/costs.json and the reference run: "
        "run `python -m cs336_systems.report.costs`")


def test_the_cost_table_renders_every_measured_step():
    measured = {"commit": "abc", "date": "2026-01-01", "machine": {"cores": 2, "python": "3.11.9"},
                "steps": {"setup_s": 61.0, "main_job_s": 754.2, "main_job_again_s": 3.4,
                          "quick_tests_s": 118.0, "quick_tests_passed": 800,
                          "tests_s": 1100.0, "tests_passed": 900, "tests_skipped": 80}}
    block = costs.costs_block(measured, {"jobs": 3, "seconds": 4000.0, "gpus": ["NVIDIA H200"]})
    for figure in ("1 min 1 s", "12 min 34 s", "3 s", "1 min 58 s", "800 passed",
                   "18 min 20 s", "900 passed", "80 skipped", "1 h 6 min", "NVIDIA H200",
                   "3 jobs", "2-core"):
        assert figure in block, figure


def test_no_test_count_outside_the_rendered_block():
    readme = README.read_text()
    outside = readme.replace(costs.current_block(readme) or "", "")
    stale = re.findall(r"\d[\d,]* (?:passed|skipped|tests\b)", outside)
    assert not stale, f"README.md states test counts outside its rendered block: {stale}"


# The block names the commit it was measured at, so a test or two added since is history, not a
# wrong figure; a suite that grew or shrank by more than this is due a new measurement.
COUNT_DRIFT = 0.05


@pytest.mark.pipeline
def test_the_measured_test_counts_are_near_the_suites_size_now():
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
         "-p", "no:cacheprovider"],
        cwd=costs.CHECKOUT, capture_output=True, text=True, check=True).stdout
    total = int(re.search(r"(\d+) tests? collected", collected).group(1))
    steps = json.loads(costs.COSTS.read_text())["steps"]
    measured = steps["tests_passed"] + steps["tests_skipped"]
    assert abs(measured - total) <= COUNT_DRIFT * total, (
        f"docs/costs.json counts {measured} tests and the suite has {total}: measure again with "
        "scripts/measure_costs.py")
