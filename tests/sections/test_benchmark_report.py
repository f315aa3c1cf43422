"""The benchmark section's report math, checked on the real GPU records of the reference run."""

import json
import statistics
from pathlib import Path

import pandas as pd
import pytest

from cs336_systems.report.facts import jsonable
from cs336_systems.sections.benchmark import report as benchmark
from support.checkout import ROOT, project_yaml
from support.sections import section_text

OPTIONS = {"main_warmup_steps": 5,
           "assignment": project_yaml()["defaults"]["benchmark"]}
RECORDS = sorted((ROOT / "docs/reference-run/results/quick/benchmark")
                 .glob("*.json"))


def _record(size, context, mode, precision, warmup=5):
    name = f"{size}_ctx{context}_{mode}_{precision}_warmup{warmup}.json"
    return json.loads(next(p for p in RECORDS if p.name == name).read_text())["metrics"]


@pytest.fixture(scope="module")
def facts(tmp_path_factory):
    out = tmp_path_factory.mktemp("benchmark")
    outputs = {"table": str(out / "benchmark.csv"), "scaling_figure": str(out / "a.png"),
               "warmup_figure": str(out / "b.png")}
    built = benchmark.build({"records": [str(p) for p in RECORDS]}, OPTIONS, outputs)
    return jsonable(built), outputs


def test_outputs_exist_and_facts_are_json(facts):
    built, outputs = facts
    assert all(Path(p).stat().st_size > 0 for p in outputs.values())
    json.dumps(built, allow_nan=False)
    assert len(pd.read_csv(outputs["table"])) == len(RECORDS)
    assert built["env"]["gpu"] == ["NVIDIA H200"]
    coverage = built["coverage"]["benchmarking_script"]
    assert coverage["status"] == "partly answered"  # quick: two sizes, two contexts
    assert coverage["note"] == "not in this preset: sizes medium, large, xl-2025, 10B; contexts 256, 1024"


def test_scaling_compares_the_smallest_and_largest_size(facts):
    built, _ = facts
    small = _record("small", 512, "train-step", "fp32")  # the longest context both ran
    large = _record("2.7b", 512, "train-step", "fp32")
    s = built["scaling"]
    assert (s["small"], s["large"], s["context_length"]) == ("small", "2.7b", 512)
    assert s["time_ratio"] == pytest.approx(large["step_ms_mean"] / small["step_ms_mean"])
    assert s["parameter_ratio"] == pytest.approx(large["parameters"] / small["parameters"])


def test_backward_over_forward_range_comes_from_the_training_steps(facts):
    """Over the steps that grow with the context: a context-128 step whose context-512 twin (4x
    the tokens) took at most 1.5x its time measured launches and is left out."""
    built, _ = facts
    ratios, flat = [], 0
    for s in ("small", "2.7b"):
        for p in ("fp32", "bf16"):
            short, long = (_record(s, c, "train-step", p) for c in (128, 512))
            if long["step_ms_mean"] <= 1.5 * short["step_ms_mean"]:
                flat += 1
            else:
                ratios.append(short["backward_ms_mean"] / short["forward_ms_mean"])
            ratios.append(long["backward_ms_mean"] / long["forward_ms_mean"])
    assert (built["backward"]["steps"], built["backward"]["overhead_bound"]) == (len(ratios), flat)
    b = built["backward"]["backward_over_forward"]
    assert (b["min"], b["max"]) == pytest.approx((min(ratios), max(ratios)))
    assert b["median"] == pytest.approx(statistics.median(ratios))


def test_warmup_ablation_compares_cold_and_warm_runs(facts):
    built, _ = facts
    cold = _record("2.7b", 128, "train-step", "fp32", warmup=0)
    warm = _record("2.7b", 128, "train-step", "fp32", warmup=5)
    config = next(c for c in built["warmup"]["configs"] if c["size"] == "2.7b")
    assert config["cold"]["first"] == pytest.approx(cold["step_ms_samples"][0])
    assert config["first_over_warm_median"] == pytest.approx(
        cold["step_ms_samples"][0] / statistics.median(warm["step_ms_samples"]))
    assert [b["warmup_steps"] for b in config["between"]] == [1, 2]


def test_warmup_differences_inside_the_spread_are_called_so(facts):
    built, _ = facts
    one = _record("small", 128, "train-step", "fp32", warmup=1)
    five = _record("small", 128, "train-step", "fp32", warmup=5)
    config = next(c for c in built["warmup"]["configs"] if c["size"] == "small")
    between = config["between"][0]["against_warm"]
    assert between["ratio"] == pytest.approx(one["step_ms_mean"] / five["step_ms_mean"])
    inside = (abs(one["step_ms_mean"] - five["step_ms_mean"])
              <= one["step_ms_std"] + five["step_ms_std"])
    assert between["within_spread"] is inside is True


def test_bf16_against_fp32_is_left_to_the_mixed_precision_section(facts):
    built, _ = facts
    assert set(built["coverage"]) == {"benchmarking_script"}
    assert "precision" not in built


def test_the_template_renders_the_facts(facts, tmp_path):
    built, _ = facts
    text = section_text("benchmark", built, link_base=tmp_path)
    assert '<a id="benchmarking_script"></a>' in text
    assert '<a id="benchmarking_mixed_precision"></a>' not in text  # the new section's anchor
    assert "[1.4 (c)](#benchmarking_mixed_precision)" in " ".join(text.split())
    assert "![time per step against model size](" in text


def test_a_skipped_sweep_is_covered_as_skipped(tmp_path):
    record = {"section": "benchmark", "status": "skipped", "metrics": {},
              "message": "CUDA was requested but no CUDA device is available on this machine",
              "config": {"size": "small", "context_length": 128, "mode": "forward",
                         "precision": "fp32", "warmup_steps": 5, "measure_steps": 10,
                         "batch_size": 4, "attention": "eager"},
              "env": {"device": "cpu"}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record))
    outputs = {"table": str(tmp_path / "t.csv"), "scaling_figure": str(tmp_path / "a.png"),
               "warmup_figure": str(tmp_path / "b.png")}
    built = jsonable(benchmark.build({"records": [str(path)]}, OPTIONS, outputs))
    assert built["coverage"]["benchmarking_script"] == {
        "status": "skipped", "anchor": "benchmarking_script",
        "note": "CUDA was requested but no CUDA device is available on this machine"}
    section_text("benchmark", built, link_base=tmp_path)  # renders with nothing measured


def test_the_assignment_sweep_shows_a_step_summary_and_links_its_csv(tmp_path):
    """The assignment run's 80 configurations are too many rows for the text: it shows the
    step's mean per context, one row per size, mode and precision, and links the CSV."""
    records = sorted((ROOT / "docs/reference-run/results/assignment/benchmark").glob("*.json"))
    outputs = {"table": str(tmp_path / "benchmark.csv"), "scaling_figure": str(tmp_path / "a.png"),
               "warmup_figure": str(tmp_path / "b.png")}
    built = jsonable(benchmark.build({"records": [str(p) for p in records]}, OPTIONS, outputs))
    timing = built["timing"]
    assert not timing["whole"] and timing["rows"] == 96
    lines = [line for line in timing["markdown"].splitlines() if line.startswith("| ")]
    assert len(lines) == 1 + 6 * 2 * 2  # the header, then size x mode x precision
    metrics = json.loads((ROOT / "docs/reference-run/results/assignment/benchmark/"
                          "xl_ctx512_train-step_bf16_warmup5.json").read_text())["metrics"]
    row = next(line for line in lines if line.startswith("| xl-2025 ") and "train-step" in line
               and "bf16" in line)
    assert f"{metrics['step_ms_mean']:.1f}" in row.split("|")[6]  # the ctx-512 column
    text = section_text("benchmark", built, link_base=tmp_path)
    assert "_The whole table has 96 rows; its data are in [benchmark.csv](benchmark.csv)._" \
        in " ".join(text.split())
