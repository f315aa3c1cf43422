"""Several jobs at once on a machine with several GPUs (pipeline.gpus): each job holds GPUs of its
own until its process ends, waits while too few are free, and runs with CUDA_VISIBLE_DEVICES
naming them; jobs that ask for none, for more than the machine has, or that SLURM placed are
left alone."""

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from cs336_systems.measure import job_clock
from cs336_systems.pipeline import gpus
from cs336_systems.pipeline.jobs import Files, Job
from cs336_systems.pipeline.jobserver import run
from support.checkout import ROOT

POOL = ["0", "1", "2"]


@pytest.fixture(autouse=True)
def own_locks(monkeypatch, tmp_path):
    monkeypatch.setenv(gpus.LOCKS_ENV, str(tmp_path / "locks"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(gpus, "POLL_S", 0.01)


def _release(fds):
    for fd in fds:
        os.close(fd)


def test_jobs_at_once_get_gpus_of_their_own_and_count_the_busy_ones():
    first, held_a = gpus.claim(1, POOL)
    second, held_b = gpus.claim(2, POOL)
    assert first.gpus == ("0",) and second.gpus == ("1", "2")
    assert (first.busy, second.busy, first.pool) == (1, 3, 3)
    assert gpus.busy(POOL) == 3
    _release(held_a + held_b)
    assert gpus.busy(POOL) == 0


def test_a_job_waits_while_too_few_gpus_are_free_and_takes_them_once_freed():
    _, held = gpus.claim(2, POOL)
    with pytest.raises(TimeoutError, match="2 of the GPUs 0,1,2 were not free within"):
        gpus.claim(2, POOL, timeout_s=0.05)
    assert gpus.busy(POOL) == 2  # the waiting claim took nothing meanwhile
    _release(held[:1])
    placement, again = gpus.claim(2, POOL, timeout_s=1)
    assert placement.gpus == ("0", "2")
    _release(held[1:] + again)


def test_a_gpu_is_free_again_when_the_process_holding_it_dies():
    code = ("import sys, time; sys.path.insert(0, 'src'); from cs336_systems.pipeline import gpus; "
            "p, fds = gpus.claim(1, ['0', '1']); print(p.gpus[0], flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True, env=os.environ)
    try:
        assert holder.stdout.readline().strip() == "0"
        assert gpus.busy(["0", "1"]) == 1
        placement, held = gpus.claim(1, ["0", "1"], timeout_s=1)
        assert placement.gpus == ("1",)
        _release(held)
    finally:
        holder.kill()
        holder.wait()
    placement, held = gpus.claim(2, ["0", "1"], timeout_s=5)  # killed, its lock went with it
    assert placement.gpus == ("0", "1")
    _release(held)


def test_placed_names_the_gpus_for_the_block_and_restores_the_environment(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert gpus.machine_gpus() == ["4", "5", "6"]
    _, held = gpus.claim(1, ["4", "5", "6"])
    with gpus.placed(2) as placement:
        assert placement.gpus == ("5", "6")
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,6"
        assert gpus.placement_of_this_job() == {"gpus": ["5", "6"], "pool": 3, "busy": 3,
                                                "wait_s": pytest.approx(0.0, abs=0.5)}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6"
    assert gpus.placement_of_this_job() is None
    _release(held)


@pytest.mark.parametrize("count, slurm", [(0, False), (4, False), (1, True)])
def test_jobs_that_ask_for_no_gpu_too_many_or_that_slurm_placed_are_left_alone(
        monkeypatch, count, slurm):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    if slurm:
        monkeypatch.setenv("SLURM_JOB_ID", "42")
    with gpus.placed(count) as placement:
        assert placement is None and os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2"
    with pytest.raises(ValueError, match="cannot claim 4 of a pool of 3 GPUs"):
        gpus.claim(4, POOL)


def test_a_job_takes_its_gpu_count_from_its_rules_resources_and_waits_in_its_job_time(
        monkeypatch, tmp_path):
    smk = SimpleNamespace(params=_Named([], job="experiment", cli="m", args={}),
                          input=_Named([]), output=_Named(["r.json"]), log=_Named(["r.log"]),
                          resources=SimpleNamespace(gpu=2))  # as Snakemake's script sees it
    job = Job.from_snakemake(smk)
    assert job.gpus == 2 and Job.from_dict(json.loads(json.dumps(job.to_dict()))) == job

    # through run(): a CPU job that asks for one GPU of a pool of two, one of them held
    monkeypatch.setenv("CS336_JOBSERVER", "0")
    monkeypatch.setattr(gpus, "machine_gpus", lambda: ["0", "1"])
    _, held = gpus.claim(1, ["0", "1"])
    record, log = tmp_path / "r.json", tmp_path / "r.log"
    study = Job("experiment", {"cli": "cs336_systems.sections.mixed_precision.run_study",
                               "args": {"part": "accumulation", "steps": 10}},
                output=Files([str(record)]), log=Files([str(log)]), gpus=1)
    job_clock.restore({"entry": time.time()})
    assert run(study) == 0
    assert "gpu_wait" in json.loads(record.read_text())["env"]["job_time"]["stages_s"]
    assert gpus.busy(["0", "1"]) == 1  # the job's GPU went back when it ended
    _release(held)


class _Named(list):
    """Snakemake's Namedlist as far as Job.from_snakemake reads it."""

    def __init__(self, paths, **named):
        super().__init__(paths)
        self.named = named

    def items(self):
        return self.named.items()
