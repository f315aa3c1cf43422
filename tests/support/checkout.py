"""A clean copy of this checkout, and Snakemake run in it.

A copy holds what git tracks plus the untracked files git does not ignore: never what a user's
own runs left in the tree (results/, report/writeup.md, .snakemake/, .venv/), so that no test
depends on them (README: the two commands work in either order on one clone).
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# What a copy leaves out where there is no git to ask: this project's generated paths.
GENERATED = ("results", ".git", ".venv", ".snakemake", "__pycache__", ".pytest_cache", ".whl",
             "*.egg-info")


def _files() -> list[str] | None:
    """The checkout's files as git sees them (tracked, and untracked but not ignored); None
    where git cannot say (a copy without .git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def copy_checkout(dest: Path) -> Path:
    """Copy the checkout's own files to `dest` (see the module docstring); returns `dest`."""
    files = _files()
    if files is None:
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(*GENERATED))
        (dest / "report/writeup.md").unlink(missing_ok=True)
        return dest
    for name in files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return dest


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "CS336_GIT_COMMIT": "test-copy"}
    result = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=workdir, env=env,
                            capture_output=True, text=True, timeout=900)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def stale_jobs(workdir: Path, *args: str) -> dict[str, int]:
    """Jobs per rule that a dry run of the writeup would execute (from the job-stats table)."""
    out = snakemake(workdir, "report/writeup.md", "--dry-run", "--quiet", "rules", *args).stdout
    jobs = {}
    for line in out.splitlines():
        match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if match and match.group(1) != "total":
            jobs[match.group(1)] = int(match.group(2))
    return jobs


@functools.cache
def _parsed(path: Path) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml: 10x the pure-Python parser
    return yaml.load(path.read_text(), Loader=loader)


def project_yaml(relative: str = "config.yaml") -> dict:
    """A YAML file of the checkout (config.yaml by default), parsed once per process; each
    caller gets its own copy to change."""
    return copy.deepcopy(_parsed(ROOT / relative))
