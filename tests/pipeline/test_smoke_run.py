"""End to end: the smoke preset through Snakemake in a temporary copy of the repository."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.checkout import copy_checkout, snakemake, stale_jobs

pytestmark = pytest.mark.pipeline



def stale_rules(workdir: Path) -> set[str]:
    return set(stale_jobs(workdir))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("pipeline") / "repo"
    copy_checkout(workdir)
    run = snakemake(workdir, "report/writeup.md", "--cores", "2")
    (workdir.parent / "run.log").write_text(run.stdout + run.stderr)
    return workdir


def test_the_log_shows_each_section_s_progress_and_no_empty_shell_command(smoke_run):
    log = (smoke_run.parent / "run.log").read_text()
    assert "Shell command: None" not in log
    lines = [line for line in log.splitlines() if line.startswith("progress: ")]
    assert len(lines) >= 100  # one a finished job
    assert any(line.startswith("progress: benchmark ") for line in lines)
    assert lines[-1].startswith("progress: report ") and "the run" in lines[-1]
    assert "no reference job times for this preset on a machine without a GPU" in lines[-1]


def _read(workdir: Path) -> tuple[str, str, str]:
    """The writeup, its companion pages one after the other, and the run's page."""
    report = workdir / "report"
    details = "\n\n".join(p.read_text() for p in sorted((report / "details").glob("*.md"))
                          if p.name != "run.md")
    return ((report / "writeup.md").read_text(), details,
            (report / "details" / "run.md").read_text())


def test_writeup_holds_the_benchmark_table_with_measured_numbers(smoke_run):
    writeup, details, run = _read(smoke_run)
    assert "| preset | smoke |" in run and "| device | cpu |" in run
    # where the run's time went: every measuring job of the run, by section
    total = re.search(r"^\| all \| (\d+) \| \d+ \| [\d.]+ \| [\d.]+ \| \d+ \|$", run, re.M)
    # a section whose jobs were all skipped (no CUDA) measured nothing: no start-up share
    assert re.search(r"^\| memory \| (\d+) \| \1 \| [\d.]+ \| 0.00 \| none measured \|$",
                     run, re.M)
    records = [p for p in (smoke_run / "results/smoke").rglob("*.json")
               if "sections" not in p.parts and "status" in json.loads(p.read_text())]
    assert total and int(total.group(1)) == len(records)
    assert "code commit of the measurements | test-copy" in run
    # the answer's table: the training step by size, each phase mean ± std
    answer = writeup[writeup.index("## 1.1 "):writeup.index("## 1.2 ")]
    row = next(line for line in answer.splitlines() if line.startswith("| tiny "))
    times = [c for c in row.strip("|").split("|") if "±" in c]
    assert len(times) == 4, row  # forward, backward, optimizer, step
    # every configuration on the companion page
    section = details[details.index("## 1.1 "):details.index("## 1.2 ")]
    train_rows = [r for r in section.splitlines()
                  if r.startswith("| tiny ") and "| train-step " in r and "| ok " in r]
    assert len(train_rows) >= 4  # 2 contexts x 2 precisions
    for row in train_rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for cell in (c for c in cells if "±" in c):
            mean, std = (float(x) for x in cell.split("±"))
            assert mean > 0 and std >= 0
    flat = " ".join((writeup + details).split())
    assert re.search(r"backward pass takes [\d.]+x to [\d.]+x the time of the forward pass", flat)
    flash_rows = [line for line in writeup.splitlines() if re.match(r"^\| 16 +\| fp32 ", line)]
    assert len(flash_rows) == 2 and all(re.search(r"\d+\.\d{3} / \d+\.\d{3}", r)
                                        for r in flash_rows)
    assert "Speed-up of Triton FA2 over plain PyTorch" in flat
    ddp_rows = [line for line in writeup.splitlines()
                if re.match(r"^\| tiny +\| (naive|flat|overlap|bucketed [\d.]+ MiB|torch) +\| ok ",
                            line)]
    assert len(ddp_rows) == 6, ddp_rows
    assert re.search(r"^\| nccl +\| 2 +\| 1 +\| skipped ", writeup, re.M)
    fsdp_rows = re.findall(r"^\| (fsdp|fsdp2|bucketed 1 MB) +\| ok +\|", writeup, re.M)
    assert fsdp_rows == ["fsdp", "fsdp2", "bucketed 1 MB"]
    assert "C / W_ici = 2556 FLOPs a byte" in flat
    for page, text in (("report", writeup), ("report/details", details)):
        for figure in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
            assert (smoke_run / page / figure).resolve().is_file(), figure


def test_writeup_opens_with_every_problem_and_its_answer(smoke_run):
    from cs336_systems.report.coverage import PROBLEMS

    text, _, _ = _read(smoke_run)
    table = text[text.index("## Results at a glance"):]
    table = table[:table.index("\n## ")]
    rows = [line for line in table.splitlines() if line.startswith("| [`") or line.startswith("| `")]
    assert len(rows) == len(PROBLEMS)
    for problem, row in zip(PROBLEMS, rows):
        assert f"`{problem.name}`" in row, row
        link = re.match(r"\| \[`[^`]+`\]\(#([^)]+)\)", row)
        if link:  # an answered problem links to an anchor that exists
            assert f'<a id="{link.group(1)}"></a>' in text, row
        else:
            assert "| _skipped_" in row or "| _not implemented yet_" in row, row
    assert "| `memory_profiling` | 1.5 | _skipped_: memory history needs CUDA" in text
    assert re.search(r"\| \[`fsdp_accounting`\]\(#fsdp_accounting\) \| 6.2 \(2026\) "
                     r"\|.*_Partly: this preset runs size tiny \(the assignment's xl\)", text)
    assert re.search(r"\| \[`nsys_profile`\]\(#nsys_profile\) \| 1.2 "
                     r"\|.*_Partly: not in this preset: sizes small, xl", text)
    assert re.search(r"\| \[`benchmarking_script`\]\(#benchmarking_script\) \| 1.1 "
                     r"\| A fp32 training step at context 32 takes [\d.]+ ms \(tiny\)", text)


def test_the_smoke_writeup_reads_cleanly(smoke_run):
    writeup, details, _ = _read(smoke_run)
    pages = sorted((smoke_run / "report").rglob("*.md"))
    assert len(pages) > 10
    for page in pages:
        text = page.read_text()
        assert "\n\n\n" not in text, page
        assert not re.search(r"\b1 warm-up steps\b|\bon 1 GPU\b", text)
        assert not re.search(r"(?<![\w.])(\d[\d.]*x)(–|\s+to\s+)\1(?![\w.])", text)
    # the two tiny shapes have two names; the size note's names, never the config's keys
    assert "`tiny-8b`" in details
    assert not re.search(r"sizes [^;|_]*\b2\.7b\b", writeup)


def test_writeup_holds_every_mixed_precision_table(smoke_run):
    writeup, details, _ = _read(smoke_run)
    section = details[details.index("## 1.3–1.4 Mixed precision"):]
    section = section[:section.index("\n# ")] if "\n# " in section else section
    loops = [line for line in section.splitlines() if re.match(r"^\| fp(16|32) \+= ", line)]
    assert len(loops) == 4 and "| fp16 += fp16              | 9.953125 " in section
    answer = writeup[writeup.index("## 1.3–1.4 Mixed precision"):]
    assert re.search(r"^\| LayerNorm output +\| \w+ +\| \w+ +\|$", answer, re.M)  # fp16, bf16
    layernorm = [line for line in section.splitlines()
                 if re.match(r"^\| (fp16|bf16|fp32) +\| (one|two)-pass|^\| \w+ +\| F.layer_norm",
                             line)]
    assert len(layernorm) == 2 * (4 + 4 + 3)  # two offsets; no fp32 upcast of fp32
    speedups = [line for line in section.splitlines() if re.match(r"^\| tiny .*x", line)]
    assert len(speedups) == 6  # 2 contexts x 3 modes
    assert "These timings are from a CPU" in " ".join(section.split())
    assert re.search(r"\| \[`mixed_precision_accumulation`\]\(#mixed_precision_accumulation\) "
                     r"\| 1.3 \| `fp32 \+= fp32` is off by", writeup)


def test_no_smoke_record_is_an_error(smoke_run):
    records = [json.loads(p.read_text()) for p in (smoke_run / "results/smoke").rglob("*.json")
               if "sections" not in p.parts]
    records = [r for r in records if "status" in r]
    assert {r["section"] for r in records} == {"benchmark", "profile", "mixed_precision",
                                               "memory", "residuals", "checkpointing",
                                               "attention", "flash", "flash_speed",
                                               "flash_kernels", "allreduce", "ddp",
                                               "ddp_check", "fsdp", "sharded_optimizer",
                                               "communication_accounting", "parallelism",
                                               "training", "optimizer", "leaderboard",
                                               "leaderboard_loss"}
    errors = [(r["section"], r["config"], r.get("message", "")) for r in records
              if r["status"] == "error"]
    assert not errors, errors


def test_every_job_logs_its_configuration(smoke_run):
    log = next((smoke_run / "results/smoke/logs/benchmark").glob("tiny_ctx16_train-step_*.log"))
    text = log.read_text()
    assert "python -m cs336_systems.sections.benchmark.time_step --size tiny" in text
    assert '"context_length": 16' in text and "step 1/" in text and "status ok" in text


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


def test_editing_a_template_redoes_its_section_and_the_writeup_only(smoke_run):
    with _edited(smoke_run / "src/cs336_systems/sections/benchmark/template.md.j2"):
        assert stale_jobs(smoke_run) == {"section_markdown": 1, "writeup": 1}
    with _edited(smoke_run / "src/cs336_systems/sections/benchmark/details.md.j2"):
        assert stale_jobs(smoke_run) == {"section_details": 1, "writeup": 1}
    with _edited(smoke_run / "src/cs336_systems/report/templates/writeup.md.j2"):
        assert stale_jobs(smoke_run) == {"writeup": 1}
    assert stale_rules(smoke_run) == set()  # content restored: nothing to redo


def test_editing_the_model_redoes_the_benchmarks(smoke_run):
    with _edited(smoke_run / "src/cs336_systems/lm/model.py"):
        # every job that builds the LM, and nothing of the attention or all-reduce benchmarks
        assert stale_rules(smoke_run) == {"benchmark", "benchmark_tables", "benchmark_compiled",
                                          "profile", "profile_tables",
                                          "memory", "memory_tables", "residuals_block",
                                          "residuals_rmsnorm", "residuals_tables", "checkpointing",
                                          "checkpointing_nested", "checkpointing_tables",
                                          "attention_tables", "ddp", "ddp_check",
                                          "sharded_optimizer", "fsdp", "fsdp_tables",
                                          "distributed_tables", "mixed_precision_tables",
                                          "parallelism_tables", "training", "optimizer_step",
                                          "training_tables", "leaderboard",
                                          "leaderboard_tables", "section_markdown",
                                          "section_details", "writeup"}


def _smoke_preset(workdir: Path) -> dict:
    from cs336_systems.pipeline.config import merged_presets

    return merged_presets(yaml.safe_load((workdir / "config.yaml").read_text()))["smoke"]


def test_editing_the_triton_kernel_redoes_only_the_triton_flash_jobs(smoke_run):
    from cs336_systems.sections.flash.targets import GROUPS
    from cs336_systems.sections.leaderboard.runs import VARIANTS as LEADERBOARD_VARIANTS

    config = _smoke_preset(smoke_run)["flash"]
    triton_jobs = len(config["seq_lengths"]) * len(config["d_heads"]) * len(config["precisions"])
    with _edited(smoke_run / "src/cs336_systems/kernels/flash_triton.py"):
        # the attention section reads the flash table (its measured memory): re-rendered too;
        # every speed group and every kernel profile times our kernels,
        # and the leaderboard's variants that run our kernel
        board = sum(LEADERBOARD_VARIANTS[v].attention.startswith("flash-triton")
                    for matrix in _smoke_preset(smoke_run)["leaderboard"]["matrices"]
                    for v in matrix["variants"])
        assert stale_jobs(smoke_run) == {"flash": triton_jobs, "flash_leaderboard": 1,
                                         "flash_speed": len(GROUPS),
                                         "flash_kernels": len(config["kernels"]["shapes"]),
                                         "flash_tables": 1, "attention_tables": 1,
                                         "leaderboard": board, "leaderboard_tables": 1,
                                         "section_markdown": 3, "section_details": 3,
                                         "writeup": 1}


def test_editing_ddp_redoes_the_data_parallel_jobs_only(smoke_run):
    preset = _smoke_preset(smoke_run)
    ddp = preset["distributed"]["ddp"]
    # per model size, bucketed: one job per bucket size; the check against one process; and
    # the FSDP benchmark, whose unsharded baseline is DDPBucketed
    jobs = len(ddp["sizes"]) * (len(ddp["variants"]) - 1 + len(ddp["bucket_sizes_mb"]))
    with _edited(smoke_run / "src/cs336_systems/distributed/ddp.py"):
        assert stale_jobs(smoke_run) == {"ddp": jobs, "ddp_check": 1, "distributed_tables": 1,
                                         "fsdp": len(preset["fsdp"]["variants"]),
                                         "fsdp_tables": 1, "section_markdown": 2,
                                         "section_details": 2, "writeup": 1}


def test_editing_the_report_code_does_not_remeasure(smoke_run):
    with _edited(smoke_run / "src/cs336_systems/sections/benchmark/report.py"):
        assert stale_jobs(smoke_run) == {"benchmark_tables": 1, "section_markdown": 1,
                                         "section_details": 1, "writeup": 1}


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


@pytest.mark.parametrize("preset", ["assignment", "quick"])
def test_gpu_presets_plan_on_a_machine_without_a_gpu(smoke_run, preset):
    out = snakemake(smoke_run, "report/writeup.md", "--dry-run", "--quiet", "rules",
                    "--config", f"preset={preset}").stdout
    assert re.search(r"^benchmark\s+\d+$", out, re.M) and re.search(r"^writeup\s+1$", out, re.M)


def test_a_cuda_job_on_a_cpu_machine_records_skipped(smoke_run):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    record = "results/quick/benchmark/small_ctx128_forward_fp32_warmup5.json"
    snakemake(smoke_run, record, "--config", "preset=quick")
    result = json.loads((smoke_run / record).read_text())
    assert result["status"] == "skipped"
    assert result["message"] == "CUDA was requested but no CUDA device is available on this machine"


@pytest.fixture(scope="module")
def smoke_archive(smoke_run) -> Path:
    snakemake(smoke_run, "--cores", "1", "archive")
    return smoke_run / "results/smoke.tar.gz"


def test_the_archive_holds_results_writeup_config_and_manifest(smoke_archive):
    import tarfile

    with tarfile.open(smoke_archive) as tar:
        names = set(tar.getnames())
        manifest = json.loads(tar.extractfile("manifest.json").read())
        config = yaml.safe_load(tar.extractfile("config.resolved.yaml").read())
    assert {"report/writeup.md", "results/smoke/tables/benchmark.csv",
            "results/smoke/sections/attention.json", "results/smoke/figures/flash_speedup.png",
            "results/smoke/benchmark/tiny_ctx16_forward_fp32_warmup1.json"} <= names
    assert not any(n.endswith(".trace.json.gz") for n in names)  # heavy: only when asked
    assert manifest["preset"] == "smoke" and manifest["git_commit"] == "test-copy"
    assert manifest["gpus"] == [] and "torch" in manifest["packages"]
    assert config["preset"] == "smoke" and config["benchmark"]["sizes"] == ["tiny"]


def _tree(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in folder.rglob("*") if p.is_file()} \
        if folder.exists() else {}


def test_an_archive_rerenders_to_the_same_writeup_without_measuring(smoke_run, smoke_archive,
                                                                    tmp_path):
    """From any folder, into a new folder of its own, with the code of the checkout it runs
    from (the copy that made the archive): the same writeup, every report rule run again,
    nothing measured, nothing of the checkout touched."""
    import tarfile

    from cs336_systems.sections import SECTIONS

    elsewhere, into = tmp_path / "elsewhere", tmp_path / "rendered"
    elsewhere.mkdir()
    checkout_before = {**_tree(smoke_run / "results"), **_tree(smoke_run / "report")}
    env = {**os.environ, "CS336_GIT_COMMIT": "test-copy",
           "PYTHONPATH": str(smoke_run / "src")}
    run = subprocess.run([sys.executable, "-m", "cs336_systems.pipeline.archive", "rerender",
                          str(smoke_archive), "--into", str(into)], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    with tarfile.open(smoke_archive) as tar:
        archived = tar.extractfile("report/writeup.md").read().decode()
    assert (into / "report/writeup.md").read_text() == archived
    assert f"writeup: {into / 'report/writeup.md'} (the same as the archived one)" in run.stdout
    ran = set(re.findall(r"^(?:local)?rule (\w+):", run.stdout + run.stderr, re.M))
    # every report rule, and nothing that measures
    assert ran == {f"{section}_tables" for section in SECTIONS} | {"section_markdown",
                                                                    "section_details", "writeup"}
    assert list(elsewhere.iterdir()) == []
    assert {**_tree(smoke_run / "results"), **_tree(smoke_run / "report")} == checkout_before


def test_a_deleted_record_is_measured_again(smoke_run):
    """Snakemake alone would say "Nothing to be done" and keep the old numbers."""
    record = smoke_run / "results/smoke/ddp/tiny/naive.json"
    kept = record.read_bytes()
    record.unlink()
    try:
        stale = stale_rules(smoke_run)
        assert {"ddp", "distributed_tables", "section_markdown", "writeup"} <= stale
        assert not stale & {"benchmark", "flash_tables"}
    finally:
        record.write_bytes(kept)
        snakemake(smoke_run, "--touch", "report/writeup.md")
    assert stale_rules(smoke_run) == set()


def test_the_html_report_shows_every_section(smoke_run):
    snakemake(smoke_run, "--report", "report/report.html")
    html = (smoke_run / "report/report.html").read_text()
    figures = sorted((smoke_run / "results/smoke/figures").glob("*.png"))
    assert len(figures) >= 7
    for figure in figures:
        assert figure.name in html, figure.name
    for category in ("1.1 benchmarking_script", "1.3-1.4 mixed precision",
                     "3 Attention and torch.compile",
                     "4 FlashAttention-2", "5 Distributed data parallel",
                     "7 Parallelism strategies", "Writeup"):
        assert category in html, category
