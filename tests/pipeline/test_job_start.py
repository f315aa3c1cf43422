"""A job's start-up (issue 23): the entry point imports no torch, Triton or Inductor; the job
server runs each job in a forked child of its own, with the job's status, output and record;
each record says where its job's time went; the writeup adds that up by section."""

import json
import os
import subprocess
import sys
import time

import pytest

from cs336_systems.measure import job_clock
from cs336_systems.pipeline import jobserver
from cs336_systems.pipeline.jobs import Files, Job
from cs336_systems.pipeline.jobserver import run
from cs336_systems.report.job_times import record_times, section_rows
from support.checkout import ROOT

HEAVY = ("torch", "triton", "torch._inductor")


def test_the_job_entry_point_imports_nothing_heavy():
    """What workflow/scripts/job.py imports before it hands the job on, in a fresh interpreter:
    no torch at all, so neither Inductor nor Triton (start-up must not creep back)."""
    code = ("import sys; sys.path.insert(0, 'src'); "
            "import cs336_systems.pipeline.jobs, cs336_systems.pipeline.jobserver; "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_importing_a_flash_job_leaves_the_kernels_for_the_measurement():
    code = ("import sys; sys.path.insert(0, 'src'); "
            "import cs336_systems.sections.flash.time_flash, cs336_systems.kernels.checks; "
            "print([m for m in ('triton', 'torch._inductor', "
            "'cs336_systems.kernels.flash_triton') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_breakdown_adds_up_the_stages_between_marks(monkeypatch):
    marks = {"dispatched": 100.0, "process": 100.1, "entry": 100.3, "forked": 100.35,
             "imported": 100.5, "device": 101.0, "warmed": 103.0, "measured": 104.0,
             "written": 104.1}
    result = job_clock.breakdown(marks)
    assert result["stages_s"] == pytest.approx(
        {"dispatch": 0.1, "interpreter": 0.2, "server": 0.05, "imports": 0.15, "device": 0.5,
         "warm_up": 2.0, "measuring": 1.0, "teardown": 0.1})
    assert result["startup_s"] == pytest.approx(1.0) and result["measuring_s"] == pytest.approx(3.0)
    # without the server's hand-off or a warm-up, the neighbouring stages take their time
    del marks["forked"], marks["warmed"]
    result = job_clock.breakdown(marks)
    assert "server" not in result["stages_s"]
    assert result["stages_s"]["imports"] == pytest.approx(0.2)
    assert result["measuring_s"] == pytest.approx(3.0)
    assert job_clock.breakdown({"written": 1.0}) is None
    with pytest.raises(ValueError, match="unknown job mark 'done'"):
        job_clock.mark("done")


def test_the_server_key_follows_the_sources_and_the_environment(monkeypatch, tmp_path):
    package = tmp_path / "cs336_systems"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(jobserver, "PACKAGE_DIR", package)
    key = jobserver.server_key()
    monkeypatch.setenv("SNAKEMAKE_SOMETHING", "per job")  # volatile: the same server
    assert jobserver.server_key() == key
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # the job's GPUs: CUDA reads them in the
    monkeypatch.setenv("CS336_GPU_PLACEMENT", '{"busy": 4}')  # child, so the same server
    assert jobserver.server_key() == key
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # read at import: another server
    other_env = jobserver.server_key()
    assert other_env != key
    (package / "a.py").write_text("x = 22\n")  # an edit: another server
    assert jobserver.server_key() != other_env


def _study_job(tmp_path, *args) -> Job:
    record, log = tmp_path / "r.json", tmp_path / "r.log"
    return Job("experiment", {"cli": "cs336_systems.sections.mixed_precision.run_study",
                              "args": {"part": "accumulation", "steps": 10, **dict(args)}},
               output=Files([str(record)]), log=Files([str(log)]))


@pytest.fixture
def server_on(monkeypatch):
    monkeypatch.setenv("CS336_JOBSERVER", "1")


@pytest.mark.pipeline  # a job end to end through a server process of its own
def test_a_job_runs_in_a_forked_child_of_the_server(server_on, tmp_path):
    job = _study_job(tmp_path)
    job_clock.restore({"entry": time.time()})  # as workflow/scripts/job.py marks it
    assert run(job) == 0
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] == "ok"
    stages = record["env"]["job_time"]["stages_s"]
    assert "server" in stages and stages["measuring"] >= 0  # the child took the job
    log = (tmp_path / "r.log").read_text()
    assert "python -m cs336_systems.sections.mixed_precision.run_study --part accumulation" in log
    assert "job time: start-up" in log


@pytest.mark.pipeline  # a job end to end through a server process of its own
def test_a_failing_job_returns_its_status_through_the_server(server_on, tmp_path):
    job = _study_job(tmp_path, ("steps", -1))  # argparse refuses it: exit status 2
    assert run(job) == 2
    assert "must be a positive integer, got -1" in (tmp_path / "r.log").read_text()
    assert not (tmp_path / "r.json").exists()


@pytest.mark.pipeline  # a job end to end through a server process of its own
def test_a_server_that_exits_idle_leaves_nothing_behind(server_on, tmp_path, monkeypatch):
    """Its socket, lock and log lie in the runtime folder and go when it exits."""
    monkeypatch.setattr(jobserver, "IDLE_S", 1.0)
    folder = jobserver.runtime_dir()
    assert run(_study_job(tmp_path)) == 0
    assert any(folder.iterdir())  # the server's socket, lock and log while it runs
    deadline = time.time() + 30
    while any(folder.iterdir()) and time.time() < deadline:
        time.sleep(0.2)
    assert list(folder.iterdir()) == []


def test_the_runtime_folder_is_the_users_own(monkeypatch, tmp_path):
    monkeypatch.undo()  # the real runtime_dir, under a runtime folder of the test's
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    folder = jobserver.runtime_dir()
    assert folder == tmp_path / "cs336-jobs" and folder.stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert jobserver.runtime_dir().parent != tmp_path / "missing"  # falls back to the temp folder


def test_without_the_server_the_job_runs_here(monkeypatch, tmp_path):
    monkeypatch.setenv("CS336_JOBSERVER", "0")
    assert jobserver.submit(_study_job(tmp_path)) is None
    assert run(_study_job(tmp_path)) == 0
    assert "server" not in json.loads((tmp_path / "r.json").read_text())["env"]["job_time"][
        "stages_s"]


def test_a_job_spec_round_trips_as_json():
    job = Job("writeup", {"preset": "smoke"}, Files(["a.md", "b.json", "t.j2"],
                                                    {"sections": ["a.md"], "template": "t.j2"}),
              Files(["report/writeup.md"]), Files(["w.log"]))
    again = Job.from_dict(json.loads(json.dumps(job.to_dict())))
    assert again == job and again.input.template == "t.j2" and again.params.preset == "smoke"
    with pytest.raises(ValueError, match="unknown job entry 'nope'; allowed: experiment"):
        Job("nope")


def test_the_header_counts_each_record_once_in_its_first_section(tmp_path):
    def record(name, startup, measuring):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"status": "ok", "env": {"job_time": {
            "startup_s": startup, "measuring_s": measuring, "stages_s": {}}}}))
        return str(path)

    a, b, c = record("a", 1.0, 3.0), record("b", 2.0, 2.0), record("c", 0.5, 9.5)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"status": "ok", "env": {}}))  # measured before job times
    table = section_rows([("benchmark", record_times([a, b, str(old)])),
                          ("mixed_precision", record_times([a, c, str(tmp_path / "x.csv")]))])
    assert [(r["section"], r["jobs"]) for r in table["rows"]] == [("benchmark", 2),
                                                                  ("mixed_precision", 1)]
    total = table["total"]
    assert total["jobs"] == 3 and total["startup_s"] == 3.5 and total["measuring_s"] == 14.5
    assert total["startup_median_s"] == 1.0 and total["startup_share"] == pytest.approx(3.5 / 18)
    assert section_rows([("benchmark", record_times([str(old)]))]) == {"rows": [], "total": None}
    assert total["gpus_busy"] is None  # measured one at a time, before placement was recorded


def test_skipped_jobs_are_counted_but_not_in_the_start_up_share(tmp_path):
    def record(name, status, startup, measuring):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"status": status, "env": {"job_time": {
            "startup_s": startup, "measuring_s": measuring, "stages_s": {}}}}))
        return str(path)

    rows = section_rows([("memory", record_times([record("a", "skipped", 0.3, 0.0),
                                                  record("b", "skipped", 0.2, 0.0)])),
                         ("flash", record_times([record("c", "ok", 1.0, 3.0),
                                                 record("d", "skipped", 5.0, 0.0)]))])["rows"]
    memory, flash = rows
    assert (memory["jobs"], memory["skipped"], memory["startup_share"]) == (2, 2, None)
    assert (flash["jobs"], flash["skipped"], flash["startup_s"]) == (2, 1, 6.0)
    assert flash["startup_share"] == pytest.approx(1.0 / 4.0)


def test_the_header_says_how_many_gpus_jobs_held_at_once(tmp_path):
    def record(name, busy):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"status": "ok", "env": {
            "job_time": {"startup_s": 1.0, "measuring_s": 2.0, "stages_s": {}},
            "placement": {"gpus": ["0"], "pool": 4, "busy": busy, "wait_s": 0.0}}}))
        return str(path)

    total = section_rows([("flash", record_times([record("a", 1), record("b", 3)]))])["total"]
    assert (total["gpus_busy"], total["gpu_pool"]) == (3, 4)


@pytest.fixture(autouse=True)
def _own_server_folder(monkeypatch, tmp_path_factory):
    """Servers of these tests listen in a folder of their own and exit soon after."""
    folder = tmp_path_factory.mktemp("sockets")
    monkeypatch.setattr(jobserver, "runtime_dir", lambda: folder)
    monkeypatch.setattr(jobserver, "IDLE_S", 5.0)
    monkeypatch.setenv("CS336_GIT_COMMIT", os.environ.get("CS336_GIT_COMMIT", "test"))
