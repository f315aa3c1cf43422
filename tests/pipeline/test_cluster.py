"""The pipeline on a SLURM cluster (a dry run through the executor plugin) and across a
killed run, in a temporary copy of the repository."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from support.checkout import copy_checkout, snakemake

pytestmark = pytest.mark.pipeline

# Rules that only read records and render: they take no GPU, and neither does the analytic
# accounting job.
CPU_RULES = {"section_markdown", "writeup", "archive", "communication_accounting"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("cluster") / "repo"
    copy_checkout(workdir)
    return workdir


def _preset(workdir: Path, name: str) -> dict:
    from cs336_systems.pipeline.config import merged_presets

    return merged_presets(yaml.safe_load((workdir / "config.yaml").read_text()))[name]


def planned_jobs(out: str) -> list[dict]:
    """Each job of a dry run's output: its rule, wildcards, threads and resources."""
    jobs = []
    for block in re.split(r"^(?:local)?rule ", out, flags=re.M)[1:]:
        job = {"rule": block[:block.index(":")], "threads": 1, "wildcards": {},
               "resources": {}}
        for key, value in re.findall(r"^    (\w+): (.*)$", block, re.M):
            if key == "threads":
                job["threads"] = int(value)
            elif key in ("wildcards", "resources"):
                pairs = (item.partition("=") for item in value.split(", "))
                job[key] = {k: int(v) if v.isdigit() else v for k, _, v in pairs}
        jobs.append(job)
    return jobs


def sbatch_call(job: dict) -> str:
    """The sbatch command line the SLURM executor plugin would submit for a planned job."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    class Resources(dict):
        __getattr__ = dict.__getitem__

    job = type("Job", (), {"resources": Resources(job["resources"]), "threads": job["threads"],
                           "is_group": lambda self: False})()
    params = {"run_uuid": "test", "slurm_logfile": "test.log", "comment_str": "test",
              "account": "", "partition": "-p gpu", "workdir": "."}
    return get_submit_command(job, params) + set_gres_string(job)


@pytest.mark.parametrize("preset", ["smoke", "assignment"])
def test_the_slurm_profile_asks_each_job_for_what_its_rule_needs(workdir, preset):
    pytest.importorskip("snakemake_executor_plugin_slurm",
                        reason="the SLURM executor plugin: pip install -e '.[slurm]'")
    out = snakemake(workdir, "report/writeup.md", "archive", "--workflow-profile",
                    "profiles/slurm", "--dry-run", "--forceall", "--config",
                    f"preset={preset}").stdout
    jobs = planned_jobs(out)
    config = _preset(workdir, preset)
    distributed = config["distributed"]
    board_world = {m["name"]: m["world_size"] for m in config["leaderboard"]["matrices"]}
    on_gpus = config["device"] != "cpu"  # a preset on the CPU asks for no GPU but nccl's
    want_gpus = {  # GPUs each measuring rule takes on this preset
        "benchmark": lambda w: 1 if on_gpus else 0,
        "allreduce": lambda w: w["world_size"] if w["backend"] == "nccl" else 0,
        "ddp": lambda w: distributed["ddp"]["world_size"] if on_gpus else 0,
        "sharded_optimizer": lambda w: (distributed["sharded_optimizer"]["world_size"]
                                        if on_gpus else 0),
        "leaderboard": lambda w: board_world[w["matrix"]] if on_gpus else 0,
    }
    seen = set()
    for job in jobs:
        rule, resources = job["rule"], job["resources"]
        # every job: one node, a time limit, memory; measuring ones an hour and 32 GB a process
        assert resources["nodes"] == 1 and resources["runtime"] > 0, job
        assert resources["mem_mb"] > 0, job
        gpus = resources.get("gpu", 0)
        if rule in CPU_RULES or rule.endswith("_tables"):
            assert gpus == 0 and job["threads"] == 1, job
            seen.add("cpu")
        if rule in want_gpus:
            assert gpus == want_gpus[rule](job["wildcards"]), job
            seen.add(rule)
        if rule in ("allreduce", "ddp", "sharded_optimizer"):  # one process per rank
            ranks = job["wildcards"].get("world_size") or distributed[rule]["world_size"]
            assert job["threads"] == ranks, job
        if rule == "leaderboard":
            assert job["threads"] == board_world[job["wildcards"]["matrix"]], job
        if gpus:  # a rule that takes GPUs states its resources with measuring_job()
            assert resources["runtime"] == 60, job
            assert resources["mem_mb"] == 32000 * job["threads"], job
    assert seen == {"cpu", *want_gpus}

    by_rule = {}
    for job in jobs:
        by_rule.setdefault(job["rule"], job)
    ddp, writeup = sbatch_call(by_rule["ddp"]), sbatch_call(by_rule["writeup"])
    world_size = distributed["ddp"]["world_size"]
    for flag in (f"--gpus={world_size}", "--nodes=1", f"--cpus-per-task={world_size}",
                 f"--mem {32000 * world_size}", "-t 60"):
        assert f" {flag} " in f" {ddp} ", (flag, ddp)
    assert "--ntasks-per-gpu" not in ddp  # one task: torchrun starts the ranks
    for job in jobs:  # gloo's all-reduce: its ranks on CPUs, no GPU
        if job["rule"] == "allreduce" and job["wildcards"]["backend"] == "gloo":
            call = sbatch_call(job)
            assert "--gpus" not in call, call
            assert f" --cpus-per-task={job['wildcards']['world_size']} " in f"{call} ", call
    assert "--gpus" not in writeup, writeup
    assert " --cpus-per-task=1 " in f"{writeup} " and " -t 15 " in writeup, writeup


def test_the_leaderboard_plans_for_two_gpus(workdir):
    """The leaderboard's run on two GPUs is one command: the assignment preset plans every
    variant of its full matrix as a two-GPU, two-process job at the full shape (no SLURM
    plugin needed), beside the one-GPU proxy's."""
    out = snakemake(workdir, "results/assignment/sections/leaderboard.md", "--dry-run",
                    "--forceall", "--cores", "2", "--config", "preset=assignment").stdout
    board = _preset(workdir, "assignment")["leaderboard"]
    (matrix,) = [m for m in board["matrices"] if m["name"] == "full"]
    jobs = [job for job in planned_jobs(out) if job["rule"] == "leaderboard"
            and job["wildcards"]["matrix"] == "full"]
    assert sorted(job["wildcards"]["variant"] for job in jobs) == sorted(matrix["variants"])
    assert {job["wildcards"]["matrix"] for job in jobs} == {matrix["name"]}
    assert matrix["world_size"] == 2 and matrix["layers"] is None and board["shape"] == "8b"
    for job in jobs:
        assert job["resources"]["gpu"] == 2 and job["threads"] == 2, job
        assert job["resources"]["mem_mb"] == 2 * 32000, job


def _benchmark_records(workdir: Path, count: int) -> list[Path]:
    """`count` records of the smoke preset's benchmark, each a job of a few seconds."""
    bench = _preset(workdir, "smoke")["benchmark"]
    records = [f"results/smoke/benchmark/{bench['sizes'][0]}_ctx{ctx}_{mode}_{precision}"
               f"_warmup{bench['warmup_steps']}.json"
               for ctx in bench["context_lengths"] for mode in bench["modes"]
               for precision in bench["precisions"]]
    assert len(records) >= count
    return [workdir / record for record in records[:count]]


def _log(workdir: Path, record: Path) -> Path:
    relative = record.relative_to(workdir / "results/smoke")
    return (workdir / "results/smoke/logs" / relative).with_suffix(".log")


def test_a_killed_run_redoes_only_its_unfinished_jobs_and_trusts_no_partial_record(
        workdir, tmp_path):
    records = _benchmark_records(workdir, 4)
    targets = [str(record.relative_to(workdir)) for record in records]
    env = {**os.environ, "CS336_GIT_COMMIT": "test-copy"}
    output = tmp_path / "killed_run.log"
    with output.open("w") as log:
        run = subprocess.Popen([sys.executable, "-m", "snakemake", *targets, "--cores", "1"],
                               cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    # With --cores 1 Snakemake starts a job only after it has recorded the one before as
    # finished: once a third job's log exists, the first two are done and the third runs.
    deadline = time.monotonic() + 600
    try:
        while True:
            done = [r for r in records if r.exists()]
            running = [r for r in records if not r.exists() and _log(workdir, r).exists()]
            if len(done) >= 2 and running:
                break
            assert run.poll() is None, f"the run ended before the kill:\n{output.read_text()}"
            assert time.monotonic() < deadline, f"no third job started:\n{output.read_text()}"
            time.sleep(0.01)
    finally:
        with contextlib.suppress(ProcessLookupError):  # Snakemake and its job, with no chance
            os.killpg(run.pid, signal.SIGKILL)         # to clean up
        run.wait()
    finished = {record: record.stat().st_mtime_ns for record in done}
    # what the kill left: whole records only (they are written to a temp file, then renamed)
    for record in (workdir / "results/smoke/benchmark").glob("*.json"):
        assert json.loads(record.read_text())["status"] == "ok", record
    # The killed job's record as a half-written file would be: it must not be trusted.
    killed = running[0]
    killed.write_text('{"section": "benchmark", "status": "ok", "metr')

    snakemake(workdir, "--unlock", *targets)  # a killed Snakemake leaves its lock behind
    rerun = snakemake(workdir, *targets, "--cores", "1")
    redone = re.findall(r"^    output: (\S+)$", rerun.stdout + rerun.stderr, re.M)
    assert sorted(redone) == sorted(t for t, r in zip(targets, records) if r not in finished)
    assert {record: record.stat().st_mtime_ns for record in finished} == finished
    for record in records:
        assert json.loads(record.read_text())["status"] == "ok", record
