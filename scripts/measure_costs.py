"""Time the README's two commands on this machine from a fresh clone, and write docs/costs.json.

    python scripts/measure_costs.py

It clones this checkout's HEAD into a temporary folder and times, in the order a new user (and
`.ci/run`) runs them: `scripts/setup.sh`, the main job, the main job again (nothing to redo),
`pytest -m "not pipeline"` and the whole test command, recording the test counts, and writes
docs/costs.json and README.md's cost block. The README's own tests check those two, so they run
last, in the clone, once the figures are written there. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(command: str, cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    run = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                         check=False)
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        sys.exit(f"`{command}` failed ({run.returncode}):\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
    print(f"{seconds:8.1f} s  {command}", flush=True)
    return seconds, run.stdout + run.stderr


def counts(output: str) -> tuple[int, int]:
    """(passed, skipped) from pytest's summary line (the last that counts tests and ends with
    their time: plugins' warnings may follow it on stderr)."""
    summaries = re.findall(r"^.*\d+ (?:passed|failed|skipped).* in [\d.]+s.*$", output,
                           re.MULTILINE)
    summary = summaries[-1] if summaries else ""
    passed = re.search(r"(\d+) passed", summary)
    skipped = re.search(r"(\d+) skipped", summary)
    return int(passed.group(1)) if passed else 0, int(skipped.group(1)) if skipped else 0


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.strip()
    readme_tests = "tests/report/test_readme.py"  # they check this script's output: run last
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        steps = {}
        steps["setup_s"], _ = timed("bash scripts/setup.sh", clone)
        steps["main_job_s"], _ = timed(".venv/bin/snakemake --cores 1 report/writeup.md", clone)
        steps["main_job_again_s"], _ = timed(".venv/bin/snakemake --cores 1 report/writeup.md",
                                             clone)
        # the figures so far stand in the clone while its tests run (a file the docs name
        # must exist); the README's own tests, which check them, run once they are whole
        write(record(commit, {**steps, "quick_tests_s": 0.0, "quick_tests_passed": 0,
                              "tests_s": 0.0, "tests_passed": 0, "tests_skipped": 0}), clone)
        steps["quick_tests_s"], out = timed(
            f'.venv/bin/python -m pytest -m "not pipeline" -q --ignore={readme_tests}', clone)
        steps["quick_tests_passed"], _ = counts(out)
        steps["tests_s"], out = timed(f".venv/bin/python -m pytest -q --ignore={readme_tests}",
                                      clone)
        steps["tests_passed"], steps["tests_skipped"] = counts(out)
        # The README tests need the figures: write them into the clone, then run those tests
        # there, both ways, and count them in.
        source = (clone / readme_tests).read_text()
        n_readme = len(re.findall(r"^def test_", source, re.MULTILINE))
        n_quick = n_readme - source.count("@pytest.mark.pipeline")
        steps["quick_tests_passed"] += n_quick
        steps["tests_passed"] += n_readme
        costs = record(commit, steps)
        write(costs, clone)
        for marker, key, expected in (('-m "not pipeline"', "quick_tests", n_quick),
                                      ("", "tests", n_readme)):
            seconds, out = timed(f".venv/bin/python -m pytest -q {marker} {readme_tests}", clone)
            steps[f"{key}_s"] += seconds
            if counts(out)[0] != expected:
                sys.exit(f"{readme_tests} passed {counts(out)[0]} tests, not {expected}")
        costs = record(commit, steps)
    write(costs, ROOT)
    print(json.dumps(costs, indent=1))


def record(commit: str, steps: dict) -> dict:
    return {"commit": commit, "date": dt.date.today().isoformat(),
            "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
            "steps": {k: round(v, 1) if isinstance(v, float) else v for k, v in steps.items()}}


def write(costs: dict, checkout: Path) -> None:
    """docs/costs.json in `checkout`, and its README's cost block rendered from it."""
    (checkout / "docs" / "costs.json").write_text(json.dumps(costs, indent=1) + "\n")
    subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-m",
                    "cs336_systems.report.costs"], cwd=checkout, check=True)


if __name__ == "__main__":
    main()
