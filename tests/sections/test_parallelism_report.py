"""The parallelism section's report (§7) on synthetic records: C and W read from the right
records, the device counts they give (worked out here from the records' numbers, not by the
library), the nominal fallback said out loud, and the checks job's verdicts."""

import json
import math
from pathlib import Path

import pytest

from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.pipeline.records import make_record
from cs336_systems.records import write_json_atomic
from cs336_systems.report.coverage import PROBLEM_KEYS
from cs336_systems.report.facts import jsonable
from cs336_systems.sections.parallelism import check_parallelism as checks_cli
from cs336_systems.sections.parallelism.report import build
from support.checkout import project_yaml
from support.sections import section_text

CONFIG = project_yaml()["defaults"]["parallelism"]
OPTIONS = {"sizes": ["small", "2.7b"], "batch_tokens": 100_000, "devices": 8,
           "nominal": CONFIG["nominal"]}
OUTPUTS = {"limits_table": "tables/parallelism_limits.csv",
           "times_table": "tables/parallelism_times.csv",
           "collectives_table": "tables/parallelism_collectives.csv",
           "flops_table": "tables/parallelism_flops.csv",
           "ratio_figure": "figures/parallelism_ratio.png"}
PROBLEMS = ("alternate_ring_all_reduce", "data_parallel_calcs", "fsdp_calcs", "tp_calcs",
            "fsdp_tp_calcs")
GPU = {"device": "cuda", "gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0",
       "git": "abc"}
CPU = {**GPU, "device": "cpu", "gpu": None}


def _write(folder: Path, name: str, record: dict) -> str:
    path = folder / f"{name}.json"
    write_json_atomic(path, record)
    return str(path)


def _allreduce(folder: Path, backend, size_mb, world, busbw, env=GPU, status="ok") -> str:
    metrics = ({"size_bytes": int(size_mb * 1e6), "busbw_gbps": busbw, "algbw_gbps": busbw / 2,
                "allreduce_ms_median": 1.0} if status == "ok" else {})
    return _write(folder, f"{backend}_{size_mb}mb_world{world}", make_record(
        "allreduce", {"backend": backend, "size_mb": float(size_mb), "world_size": world},
        status, metrics, env, message=None if status == "ok" else "needs 4 GPUs"))


def _benchmark(folder: Path, name, precision, flops, step_ms, env=GPU) -> str:
    return _write(folder, name, make_record(
        "benchmark", {"size": "2.7b", "context_length": 512, "mode": "forward",
                      "precision": precision, "batch_size": 4, "warmup_steps": 5},
        "ok", {"model_flops_per_step": flops, "step_ms_mean": step_ms}, env))


@pytest.fixture(scope="module")
def checks_record(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("checks") / "checks.json"
    checks_cli.main(["--ring-devices", "2", "3", "--chunk-elements", "2", "--batch", "4",
                     "--d-model", "3", "--d-ff", "4", "--devices", "2", "--output", str(path)])
    return str(path)


@pytest.fixture(scope="module")
def gpu_records(tmp_path_factory, checks_record) -> dict[str, list[str]]:
    folder = tmp_path_factory.mktemp("records")
    allreduce = [
        _allreduce(folder, "nccl", 1000, 2, 300.0),
        _allreduce(folder, "nccl", 10, 4, 100.0),
        _allreduce(folder, "nccl", 1000, 4, 400.0),     # the widest world's largest size: W
        _allreduce(folder, "nccl", 2000, 4, 0, status="skipped"),
        _allreduce(folder, "gloo", 1000, 8, 999.0, env=CPU),
    ]
    benchmark = [
        _benchmark(folder, "bf16_slow", "bf16", 1e12, 10.0),        # 100 TFLOP/s
        _benchmark(folder, "bf16_fast", "bf16", 4e12, 20.0),        # 200 TFLOP/s: C
        _benchmark(folder, "fp32", "fp32", 1e13, 10.0),             # not 16-bit
        _benchmark(folder, "bf16_cpu", "bf16", 1e13, 1.0, env=CPU),  # not a GPU
    ]
    return {"checks": [checks_record], "allreduce": allreduce, "benchmark": benchmark}


def _build(records: dict, folder: Path) -> tuple[dict, str]:
    outputs = {k: str(folder / v) for k, v in OUTPUTS.items()}
    facts = json.loads(json.dumps(jsonable(build(records, OPTIONS, outputs)), allow_nan=False))
    for path in outputs.values():
        assert Path(path).is_file(), path
    return facts, section_text("parallelism", facts, link_base=folder)


@pytest.fixture(scope="module")
def measured(tmp_path_factory, gpu_records):
    return _build(gpu_records, tmp_path_factory.mktemp("measured"))


def test_c_and_w_come_from_the_right_gpu_records(measured, gpu_records):
    facts, markdown = measured
    hw = facts["hardware"]
    assert hw["C"]["value"] == pytest.approx(200e12) and not hw["C"]["nominal"]
    assert hw["C"]["record"] == gpu_records["benchmark"][1]
    assert hw["W"]["value"] == pytest.approx(400e9) and not hw["W"]["nominal"]
    assert hw["W"]["record"] == gpu_records["allreduce"][2] and hw["W"]["world_size"] == 4
    assert hw["flop_per_byte"] == pytest.approx(500)
    assert "C = 200.0 TFLOP/s, measured" in markdown and "W = 400.0 GB/s, measured" in markdown
    assert "nominal**" not in markdown


def test_the_device_counts_follow_from_the_records_numbers(measured):
    facts, markdown = measured
    c, w, b = 200e12, 400e9, OPTIONS["batch_tokens"]
    batch_split = math.floor(1 + b * w / c)                           # 201
    assert facts["batch_split_limit"] == batch_split
    by_size = {row["size"]: row for row in facts["limits"]}
    for size in OPTIONS["sizes"]:
        f = MODEL_SIZES[size].d_ff
        row = by_size[size]
        assert row["data parallel backward"] == row["FSDP forward"] == row["FSDP backward"] \
            == batch_split
        assert row["tensor parallel forward"] == math.floor(1 + 1.5 * f * w / c)
        assert row["tensor parallel backward"] == math.floor(1 + 3 * f * w / c)
        assert row["overlapped"] == {"n_tp": math.floor(1 + 1.5 * f * w / c),
                                     "n_fsdp": batch_split,
                                     "n": math.floor(1 + 1.5 * f * w / c) * batch_split}
        seq = row["sequential"]
        # on or under the non-overlapped budget, and no whole split beats it
        load = (seq["n_fsdp"] - 1) * c / (b * w) + 2 * (seq["n_tp"] - 1) * c / (3 * f * w)
        assert load <= 1 + 1e-12 and seq["n"] < row["overlapped"]["n"]
    assert f"**N_DP ≤ {batch_split}**" in " ".join(markdown.split())


def test_every_problem_is_answered_with_an_anchor(measured):
    facts, markdown = measured
    assert set(facts["coverage"]) == set(PROBLEMS) <= set(PROBLEM_KEYS)
    for problem in PROBLEMS:
        assert facts["coverage"][problem]["status"] == "answered", problem
        assert f'<a id="{problem}"></a>' in markdown
    assert "None" not in markdown and "nan" not in markdown


def test_the_formulas_in_the_writeup_are_sympys(measured):
    _, markdown = measured
    flat = " ".join(markdown.split())
    assert "T_alternate = `S*(N - 1)/W`" in flat and "T_alternate / T_ring = `N/2`" in flat
    assert "dX_i = dA_i @ W1_i.T + dV_i @ W2_i.T" in markdown
    assert "dX = all_reduce(dX_i) over the N devices" in markdown
    assert "communication dominates from N_DP = `B*W/C + 1` on" in flat


def test_the_checks_verdicts_are_read_from_the_record(measured, checks_record):
    facts, markdown = measured
    checks = facts["checks"]
    assert checks["ran"] and checks["collectives_agree"] and checks["flops_agree"]
    assert checks["collectives_exact"] and checks["alternate_steps_are_n_minus_1"]
    assert checks["tp_max_abs_error"] < 1e-12
    assert "The simulated time equals the formula's in every case" in " ".join(markdown.split())


def test_without_gpu_records_the_nominal_values_stand_in_and_say_so(tmp_path, checks_record):
    records = {"checks": [checks_record],
               "allreduce": [_allreduce(tmp_path, "nccl", 1, 2, 0, env=CPU, status="skipped")],
               "benchmark": [_benchmark(tmp_path, "cpu", "bf16", 1e9, 10.0, env=CPU)]}
    facts, markdown = _build(records, tmp_path)
    hw = facts["hardware"]
    assert hw["C"]["nominal"] and hw["W"]["nominal"] and hw["all_nominal"]
    assert hw["C"]["value"] == CONFIG["nominal"]["flop_per_s"]
    assert hw["W"]["value"] == CONFIG["nominal"]["egress_bytes_per_s"]
    flat = " ".join(markdown.split())
    assert flat.count("the config's **nominal** value for the NVIDIA H100/H200 SXM") == 2
    assert "because there is no NCCL all-reduce record from GPUs in this run" in flat
    assert "Some of these numbers rest on nominal, not measured, hardware" in flat
    assert facts["nominal_limits"] is None     # nothing measured to set them against
    note = facts["coverage"]["tp_calcs"]
    assert note["status"] == "answered" and "nominal C and W" in note["note"]
    expected = math.floor(1 + OPTIONS["batch_tokens"] / hw["flop_per_byte"])
    assert facts["batch_split_limit"] == expected


def test_a_failed_checks_job_fails_the_problems_and_says_so(tmp_path, gpu_records):
    failed = _write(tmp_path, "checks", make_record(
        "parallelism", {}, "error", env=CPU, message="Traceback ...\nValueError: bad split"))
    facts, markdown = _build({**gpu_records, "checks": [failed]}, tmp_path)
    assert all(facts["coverage"][p]["status"] == "failed" for p in PROBLEMS)
    assert "_The checks job did not run (error: ValueError: bad split)" in markdown
