"""End to end: the smoke preset through Snakemake in a temporary copy of the repository."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
_IGNORED_NAMES = shutil.ignore_patterns(".git", ".venv", ".snakemake", "__pycache__", "*.egg-info",
                                       ".pytest_cache", ".whl")


def _ignore(folder: str, names: list[str]) -> set[str]:
    """What not to copy: caches, environments and generated results of this checkout."""
    ignored = set(_IGNORED_NAMES(folder, names))
    if Path(folder) == ROOT:
        ignored |= {"results"} & set(names)
    if Path(folder) == ROOT / "report":
        ignored |= {"writeup.md"} & set(names)
    return ignored


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "CS336_GIT_COMMIT": "test-copy"}
    result = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=workdir, env=env,
                            capture_output=True, text=True, timeout=900)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def stale_jobs(workdir: Path) -> dict[str, int]:
    """Jobs per rule that a dry run would execute (from the job-stats table)."""
    out = snakemake(workdir, "report/writeup.md", "--dry-run", "--quiet", "rules").stdout
    jobs = {}
    for line in out.splitlines():
        match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if match and match.group(1) != "total":
            jobs[match.group(1)] = int(match.group(2))
    return jobs


def stale_rules(workdir: Path) -> set[str]:
    return set(stale_jobs(workdir))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("pipeline") / "repo"
    shutil.copytree(ROOT, workdir, ignore=_ignore)
    snakemake(workdir, "report/writeup.md", "--cores", "2")
    return workdir


def test_writeup_holds_the_benchmark_table_with_measured_numbers(smoke_run):
    text = (smoke_run / "report/writeup.md").read_text()
    assert "| preset | smoke |" in text and "| device | cpu |" in text
    assert "code commit of the measurements | test-copy" in text
    rows = [line for line in text.splitlines() if line.startswith("| tiny ")]
    train_rows = [r for r in rows if "| train-step " in r and "| ok " in r]
    assert len(train_rows) >= 4  # 2 contexts x 2 precisions
    for row in train_rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        times = [c for c in cells if "±" in c]
        assert len(times) == 4, row  # forward, backward, optimizer, step
        for cell in times:
            mean, std = (float(x) for x in cell.split("±"))
            assert mean > 0 and std >= 0
    assert "$" not in text  # every placeholder was filled
    assert re.search(r"backward pass takes [\d.]+x to [\d.]+x the forward pass", text)
    flash_rows = [line for line in text.splitlines() if re.match(r"^\| 16 +\| fp32 ", line)]
    assert len(flash_rows) == 2 and all(re.search(r"\d+\.\d{3} / \d+\.\d{3}", r) for r in flash_rows)
    assert "Speed-up of Triton FA2 over plain PyTorch" in text
    ddp_rows = [line for line in text.splitlines()
                if re.match(r"^\| (naive|flat|overlap|bucketed [\d.]+ MiB|torch) +\| ok ", line)]
    assert len(ddp_rows) == 6, ddp_rows
    assert "| nccl      | 2            | 1         | skipped" in text
    assert "(c) C / W_ici = 2556 FLOPs per byte" in text
    for figure in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (smoke_run / "report" / figure).resolve().is_file(), figure


def test_table_csv_and_records_agree(smoke_run):
    import pandas as pd

    table = pd.read_csv(smoke_run / "results/smoke/tables/benchmark.csv")
    records = list((smoke_run / "results/smoke/benchmark").glob("*.json"))
    assert len(table) == len(records) > 0
    assert (table["status"] == "ok").all(), table[["size", "mode", "message"]]


def test_nothing_is_stale_after_the_run(smoke_run):
    assert stale_rules(smoke_run) == set()


def _edited(path: Path):
    """Context manager: append a comment to `path` (a real edit, not a touch), then restore."""
    import contextlib

    @contextlib.contextmanager
    def edit():
        original = path.read_text()
        path.write_text(original + "\n# an edit\n")
        try:
            yield
        finally:
            path.write_text(original)
    return edit()


def test_editing_a_template_redoes_only_the_writeup(smoke_run):
    with _edited(smoke_run / "src/cs336_systems/report/templates/benchmark.md"):
        assert stale_rules(smoke_run) == {"writeup"}
    assert stale_rules(smoke_run) == set()  # content restored: nothing to redo


def test_editing_the_model_redoes_the_benchmarks(smoke_run):
    with _edited(smoke_run / "src/cs336_systems/model.py"):
        # every job that builds the LM, and nothing of the attention or all-reduce benchmarks
        assert stale_rules(smoke_run) == {"benchmark", "benchmark_table", "ddp",
                                          "sharded_optimizer", "distributed_tables", "writeup"}


def test_editing_the_triton_kernel_redoes_only_the_triton_flash_jobs(smoke_run):
    config = yaml.safe_load((smoke_run / "config.yaml").read_text())["presets"]["smoke"]["flash"]
    triton_jobs = len(config["seq_lengths"]) * len(config["d_heads"]) * len(config["dtypes"])
    with _edited(smoke_run / "src/cs336_systems/kernels/flash_triton.py"):
        assert stale_jobs(smoke_run) == {"flash": triton_jobs, "flash_leaderboard": 1,
                                         "flash_table": 1, "writeup": 1}


def test_editing_ddp_redoes_the_ddp_jobs_only(smoke_run):
    ddp = yaml.safe_load((smoke_run / "config.yaml").read_text())["presets"]["smoke"]["distributed"]["ddp"]
    jobs = len(ddp["variants"]) - 1 + len(ddp["bucket_sizes_mb"])  # bucketed: one job per size
    with _edited(smoke_run / "src/cs336_systems/distributed/ddp.py"):
        assert stale_jobs(smoke_run) == {"ddp": jobs, "distributed_tables": 1, "writeup": 1}


def test_editing_the_report_code_does_not_remeasure(smoke_run):
    with _edited(smoke_run / "src/cs336_systems/report/sections/benchmark.py"):
        assert stale_rules(smoke_run) == {"benchmark_table", "writeup"}


def test_a_changed_preset_value_redoes_exactly_its_jobs(smoke_run, tmp_path):
    config = yaml.safe_load((smoke_run / "config.yaml").read_text())
    config["presets"]["smoke"]["benchmark"]["context_lengths"].append(64)
    (tmp_path / "more.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(smoke_run, "report/writeup.md", "--dry-run", "--quiet", "rules",
                    "--configfile", str(tmp_path / "more.yaml")).stdout
    # one new context length: 3 modes x 2 precisions new jobs, nothing else re-measured
    assert re.search(r"^benchmark\s+6$", out, re.M), out


def test_bad_preset_fails_at_parse_time_with_a_clear_message(smoke_run):
    result = snakemake(smoke_run, "--dry-run", "--config", "preset=fast", check=False)
    assert result.returncode != 0
    assert "config key 'preset': 'fast' is not a preset; allowed: auto" in result.stderr + result.stdout
