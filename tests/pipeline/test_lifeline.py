"""A job ends with the Snakemake that started it: killed outright, Snakemake leaves no job
running on to write records (pipeline.lifeline, which the job's client starts)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cs336_systems.pipeline import lifeline
from support.checkout import ROOT

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")

JOB = """
import os, sys, time
sys.path.insert(0, {src!r})
from cs336_systems.pipeline import lifeline
watched = lifeline.watch(lambda: os._exit(3), poll_s=0.05)
open({pid_file!r}, "w").write(f"{{os.getpid()}} {{watched is not None}}")
time.sleep(20)
open({late_file!r}, "w").write("a record nobody asked for")
"""

FAKE_SNAKEMAKE = """
import subprocess, sys, time
# as Snakemake runs a job's script: through a shell that does not exec it
subprocess.Popen(["bash", "-c", f"{{sys.executable}} {job!r}; true"])
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[1][0] != "Z"


def test_a_job_ends_when_snakemake_is_killed(tmp_path):
    job = tmp_path / "job.py"
    pid_file, late_file = tmp_path / "pid", tmp_path / "late"
    job.write_text(JOB.format(src=str(ROOT / "src"), pid_file=str(pid_file),
                              late_file=str(late_file)))
    snakemake = tmp_path / "bin" / "snakemake"  # a process whose command names snakemake
    snakemake.parent.mkdir()
    snakemake.write_text(FAKE_SNAKEMAKE.format(job=str(job)))
    parent = subprocess.Popen([sys.executable, str(snakemake)])
    try:
        deadline = time.time() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.time() < deadline, "the job never started"
            time.sleep(0.05)
        pid, watched = pid_file.read_text().split()
        assert watched == "True"  # it found Snakemake among its ancestors
        assert _alive(int(pid))
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 10
        while _alive(int(pid)) and time.time() < deadline:
            time.sleep(0.05)
        assert not _alive(int(pid))
        assert not late_file.exists()
    finally:
        parent.kill()


def test_outside_snakemake_there_is_nothing_to_watch():
    assert lifeline.snakemake_ancestor() is None or "snakemake" in " ".join(sys.argv)
    assert lifeline.alive((os.getpid(), lifeline._stat(os.getpid())[1]))
    assert not lifeline.alive((os.getpid(), "0"))  # the same pid, another start: another process
