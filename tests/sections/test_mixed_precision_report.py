"""The mixed-precision section's report math: on records its CLI writes on the CPU, on
synthetic benchmark records with known times, and on the reference run's GPU timings."""

import copy
import json
import re
import statistics
from pathlib import Path

import pandas as pd
import pytest

from cs336_systems.report.facts import jsonable
from cs336_systems.sections.mixed_precision import report as section
from cs336_systems.sections.mixed_precision import run_study as experiment
from support.checkout import ROOT, project_yaml
from support.sections import section_text

ASSIGNMENT = project_yaml()["defaults"]["benchmark"]
QUICK = ROOT / "docs/reference-run/results/quick/benchmark"
OUTPUTS = ("accumulation_table", "toy_model_table", "layernorm_table", "speedup_table")


@pytest.fixture(scope="module")
def cpu_records(tmp_path_factory):
    """The three parts, measured here: accumulation, toy model in fp16 and bf16, LayerNorm."""
    out = tmp_path_factory.mktemp("records")
    runs = {"accumulation": ["--part", "accumulation"],
            "toy_fp16": ["--part", "toy-model", "--precision", "fp16"],
            "toy_bf16": ["--part", "toy-model", "--precision", "bf16"],
            "layernorm": ["--part", "layernorm", "--rows", "32", "--width", "512"]}
    for name, args in runs.items():
        experiment.main([*args, "--device", "cpu", "--output", str(out / f"{name}.json")])
    return {"accumulation": [str(out / "accumulation.json")],
            "toy_model": [str(out / "toy_fp16.json"), str(out / "toy_bf16.json")],
            "layernorm": [str(out / "layernorm.json")]}


def _bench(path: Path, size, context, mode, precision, ms, std, parameters, device="cuda"):
    metrics = {"parameters": parameters}
    phases = {"step": ms} if mode == "forward" else {"step": ms, "forward": ms / 3,
                                                     "backward": 2 * ms / 3}
    if mode == "forward":
        phases["forward"] = ms
    for phase, mean in phases.items():
        metrics.update({f"{phase}_ms_mean": mean, f"{phase}_ms_std": std})
    record = {"section": "benchmark", "status": "ok", "metrics": metrics,
              "config": {"size": size, "context_length": context, "mode": mode,
                         "precision": precision, "warmup_steps": 5, "measure_steps": 10,
                         "batch_size": 4, "attention": "eager"},
              "env": {"device": device, "gpu": "GPU", "torch": "2", "git": "x"}}
    name = path / f"{size}_ctx{context}_{mode}_{precision}.json"
    name.write_text(json.dumps(record))
    return str(name)


def _build(tmp_path, records):
    outputs = {k: str(tmp_path / f"{k}.csv") for k in OUTPUTS}
    outputs["speedup_figure"] = str(tmp_path / "speedup.png")
    return jsonable(section.build(records, {"assignment": ASSIGNMENT}, outputs)), outputs


@pytest.fixture
def synthetic(tmp_path, cpu_records):
    """Three sizes: the train-step speed-up grows with size (1.25x, 2x, 3x), the forward one
    does not (1.5x, 1.2x, 1.6x), and small's forward pair is inside the spread."""
    steps = {("small", "train-step"): (100, 80), ("medium", "train-step"): (300, 150),
             ("large", "train-step"): (900, 300), ("small", "forward"): (30, 20),
             ("medium", "forward"): (60, 50), ("large", "forward"): (160, 100)}
    params = {"small": 1.3e8, "medium": 4.2e8, "large": 9.7e8}
    paths = []
    for (size, mode), (fp32, bf16) in steps.items():
        std = 6.0 if (size, mode) == ("small", "forward") else 1.0
        paths += [_bench(tmp_path, size, 128, mode, "fp32", fp32, std, params[size]),
                  _bench(tmp_path, size, 128, mode, "bf16", bf16, std, params[size])]
    return _build(tmp_path, {**cpu_records, "benchmark": paths})


def test_outputs_exist_and_facts_are_json(synthetic):
    facts, outputs = synthetic
    json.dumps(facts, allow_nan=False)
    assert all(Path(p).stat().st_size > 0 for p in outputs.values())
    assert len(pd.read_csv(outputs["speedup_table"])) == 6
    assert len(pd.read_csv(outputs["accumulation_table"])) == 4


def test_accumulation_verdicts(synthetic):
    a = synthetic[0]["accumulation"]
    by = {loop["label"]: loop for loop in a["loops"]}
    assert a["largest"] == "fp16 += fp16" and a["smallest"] == "fp32 += fp32"
    assert a["narrow_accumulator_worst"]
    assert by["fp32 += fp16 cast to fp32"]["same_as"] == "fp32 += fp16"
    assert by["fp32 += fp32"]["same_as"] is None
    assert by["fp16 += fp16"]["larger_source"] == "the partial sums' rounding"
    assert by["fp16 += fp16"]["times_smallest"] == pytest.approx(
        abs(by["fp16 += fp16"]["error"] / by["fp32 += fp32"]["error"]))


def test_toy_model_facts_say_whether_layer_norm_was_treated_apart(synthetic, tmp_path,
                                                                  cpu_records):
    toy = synthetic[0]["toy"]
    assert [r["precision"] for r in toy["runs"]] == ["fp16", "bf16"]
    assert toy["devices"] == ["cpu"] and not toy["on_cuda"]
    assert toy["cpu_fp16"]["works"] == toy["runs"][0]["enabled"]
    # a CUDA-like record: LayerNorm output upcast to float32 while fc1's is float16
    record = json.loads(Path(cpu_records["toy_model"][0]).read_text())
    record["env"]["device"] = "cuda"
    record["metrics"]["dtypes"]["LayerNorm output"] = "float32"
    path = tmp_path / "cuda_toy.json"
    path.write_text(json.dumps(record))
    facts, _ = _build(tmp_path, {**cpu_records, "toy_model": [str(path)], "benchmark": []})
    run = facts["toy"]["runs"][0]
    assert run["ln_differs"] and run["ln_upcast"] and facts["toy"]["on_cuda"]
    text = " ".join(section_text("mixed_precision", facts, link_base=tmp_path).split())
    assert ("The LayerNorm is treated differently from the linear layers: its output is float32 "
            "where fc1's is float16") in text
    assert "whose autocast is not CUDA's" not in facts["coverage"][
        "benchmarking_mixed_precision"]["note"]


def test_layernorm_findings(synthetic):
    f = synthetic[0]["layernorm"]["findings"]
    fp16, bf16 = f["dtypes"]["fp16"], f["dtypes"]["bf16"]
    assert f["offset"] == 300.0 and f["outputs"] == 32 * 512
    assert fp16["squares_overflow"] and fp16["squares_inf"] == f["outputs"]
    assert fp16["squares_verdict"] == "overflow" and bf16["squares_verdict"] == "stay finite"
    assert fp16["max"] == 65504.0
    assert fp16["square_overflows_above"] == pytest.approx(255.94, abs=0.01)
    assert f["bf16_vs_fp16_error"]["word"] == "larger"
    assert f["bf16_vs_fp16_error"]["ratio"] == pytest.approx(
        bf16["torch_err_mean"] / fp16["torch_err_mean"])
    assert f["fp32_one_vs_two_pass"]["word"] == "larger"
    assert 0 < bf16["upcast_share"] <= 1.01


def test_speedups_trends_and_spread(synthetic):
    s = synthetic[0]["speedup"]
    trends = {t["mode"]: t for t in s["trends"]}
    assert trends["train-step"]["trend"] == "grows with every larger size"
    assert [x["ratio"] for x in trends["train-step"]["sizes"]] == pytest.approx([1.25, 2.0, 3.0])
    assert trends["forward"]["trend"] == "does not change monotonically with size"
    assert (trends["forward"]["first"], trends["forward"]["last"]) == ("small", "large")
    assert s["summary"]["faster"] == 6 and s["summary"]["within_spread"] == 1
    assert s["summary"]["largest"]["size"] == "large" and s["summary"]["largest"]["ratio"] == 3.0
    assert "1.50x *" in s["table"]["markdown"]  # small forward: 30 +- 6 against 20 +- 6
    assert s["on_cuda"]


def test_steps_flat_in_the_context_are_overhead_bound_and_left_out_of_the_counts(
        tmp_path, cpu_records):
    """small's bf16 train step takes 40 ms at context 128 and 44 ms at 512 (4x the tokens):
    launches, not the model. Its pair is marked and left out of faster/slower; when the
    context-512 step grows (80 ms), nothing is overhead-bound."""
    def built(bf16_at_512):
        steps = {128: (50.0, 40.0), 512: (150.0, bf16_at_512)}
        paths = [_bench(tmp_path, "small", ctx, "train-step", precision, ms, 0.5, 1.3e8)
                 for ctx, pair in steps.items() for precision, ms in zip(("fp32", "bf16"), pair)]
        facts, _ = _build(tmp_path, {**cpu_records, "benchmark": paths})
        return facts["speedup"], section_text("mixed_precision", facts,
                                        link_base=tmp_path)

    speed, text = built(44.0)
    assert speed["summary"]["overhead_bound"] == 1 and speed["summary"]["count"] == 1
    assert speed["summary"]["smallest"]["context_length"] == 512
    assert "1.25x †" in speed["table"]["markdown"]
    assert "1 configuration is overhead-bound (`†`) and left out" in " ".join(text.split())
    speed, text = built(80.0)
    assert speed["summary"]["overhead_bound"] == 0 and speed["summary"]["count"] == 2
    assert "†" not in speed["table"]["markdown"] and "are overhead-bound (`†`)" not in text


def test_a_trend_along_sizes_leaves_out_the_overhead_bound_steps(tmp_path, cpu_records):
    """At context 128 small's step is flat (its context-512 step takes as long): the trend is
    read over medium and large; with only one size left it says there is none to read."""
    def built(large_512):
        steps = {("small", 128): (40.0, 40.0), ("small", 512): (50.0, 45.0),
                 ("medium", 128): (100.0, 50.0), ("medium", 512): (400.0, 200.0),
                 ("large", 128): (300.0, 100.0), ("large", 512): large_512}
        params = {"small": 1.3e8, "medium": 4.2e8, "large": 9.7e8}
        paths = [_bench(tmp_path, size, ctx, "train-step", precision, ms, 0.5, params[size])
                 for (size, ctx), pair in steps.items()
                 for precision, ms in zip(("fp32", "bf16"), pair)]
        facts, _ = _build(tmp_path, {**cpu_records, "benchmark": paths})
        text = " ".join(section_text("mixed_precision", facts,
                               link_base=tmp_path).split())
        return {t["context_length"]: t for t in facts["speedup"]["trends"]}, text

    trends, text = built((1200.0, 400.0))
    assert trends[128]["trend"] == "is larger at the larger size"
    assert (trends[128]["first"], trends[128]["first_ratio"]) == ("medium", 2.0)
    assert "small 1.00x †, medium 2.00x, large 3.00x" in text
    assert "(over the sizes not marked †), from 2.00x (medium) to 3.00x (large)" in text
    trends, text = built((310.0, 105.0))  # large's context-128 step is flat too
    assert trends[128]["trend"] is None
    assert "context 128: too few sizes whose steps are not overhead-bound" in text


def test_coverage_claims_both_problems(synthetic):
    coverage = synthetic[0]["coverage"]
    assert coverage["mixed_precision_accumulation"]["status"] == "answered"
    claim = coverage["benchmarking_mixed_precision"]
    assert claim["status"] == "partly answered"
    assert claim["note"] == ("(c) lacks sizes xl-2025, xl, 10B; (a) read on cpu, whose autocast is "
                             "not CUDA's")


def test_the_template_renders_every_part(synthetic, tmp_path):
    facts, _ = synthetic
    text = section_text("mixed_precision", facts, link_base=tmp_path)
    flat = " ".join(text.split())
    assert '<a id="mixed_precision_accumulation"></a>' in text
    assert '<a id="benchmarking_mixed_precision"></a>' in text
    assert "`fp16 += fp16`: 9.953125" in flat
    assert "The result is bit for bit `fp32 += fp16`'s" in flat
    assert "in fp16 the squares overflow" in flat and "in bf16 they stay finite" in flat
    assert ("train-step, context 128: the step speed-up grows with every larger size, from "
            "1.25x (small) to 3.00x (large) (small 1.25x, medium 2.00x, large 3.00x)") in flat
    assert "These are the cpu's autocast dtypes" in flat
    assert "These timings are from a CPU" not in flat  # the synthetic timings are CUDA's
    assert not re.search(r"\b(None|nan|NaN)\b",
                         flat.replace("inf or nan", "").replace("inf/nan", ""))


def test_bf16_speedup_on_the_reference_run_is_the_ratio_of_step_means(tmp_path, cpu_records):
    paths = sorted(str(p) for p in QUICK.glob("*_warmup5.json"))
    facts, outputs = _build(tmp_path, {**cpu_records, "benchmark": paths})
    table = pd.read_csv(outputs["speedup_table"])
    row = table[(table["size"] == "2.7b") & (table["context_length"] == 512)
                & (table["mode"] == "train-step")].iloc[0]

    def metrics(precision):
        name = f"2.7b_ctx512_train-step_{precision}_warmup5.json"
        return json.loads((QUICK / name).read_text())["metrics"]
    fp32, bf16 = metrics("fp32"), metrics("bf16")
    assert row["step_speedup"] == pytest.approx(fp32["step_ms_mean"] / bf16["step_ms_mean"])
    assert row["backward_speedup"] == pytest.approx(
        fp32["backward_ms_mean"] / bf16["backward_ms_mean"])
    ratios = [t["last_ratio"] / t["first_ratio"] for t in facts["speedup"]["trends"]]
    assert len(ratios) == 4 and statistics.median(ratios) > 1  # 2.7b gains more than small
    assert facts["env"]["gpu"] == ["NVIDIA H200"]


def test_the_assignment_runs_speed_ups_show_one_row_per_size_and_mode(tmp_path, cpu_records):
    """40 fp32/bf16 pairs are too many rows for the text: the step's speed-up per context, one
    row per size and mode, each cell the ratio of the two records' step means."""
    bench = ROOT / "docs/reference-run/results/assignment/benchmark"
    facts, _ = _build(tmp_path, {**cpu_records, "benchmark": sorted(
        str(p) for p in bench.glob("*_warmup5.json"))})
    table = facts["speedup"]["table"]
    assert not table["whole"] and table["rows"] == 48
    lines = [line for line in table["markdown"].splitlines() if line.startswith("| ")]
    assert len(lines) == 1 + 6 * 2  # the header, then size x mode

    def step_ms(precision):
        name = f"large_ctx1024_forward_{precision}_warmup5.json"
        return json.loads((bench / name).read_text())["metrics"]["step_ms_mean"]
    row = next(line for line in lines if line.startswith("| large ") and "forward" in line)
    cell = row.split("|")[-2].strip()  # the ctx-1024 column
    assert cell.rstrip(" *") == f"{step_ms('fp32') / step_ms('bf16'):.2f}x"


def test_skipped_parts_are_said_so(tmp_path, cpu_records):
    records = copy.deepcopy(cpu_records)
    for name in ("accumulation", "layernorm"):
        record = json.loads(Path(records[name][0]).read_text())
        record.update(status="skipped", metrics={},
                      message="CUDA was requested but no CUDA device is available on this machine")
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(record))
        records[name] = [str(path)]
    facts, _ = _build(tmp_path, {**records, "benchmark": []})
    assert facts["coverage"]["mixed_precision_accumulation"]["status"] == "skipped"
    text = " ".join(section_text("mixed_precision", facts, link_base=tmp_path).split())
    assert ("_(not measured: skipped, CUDA was requested but no CUDA device is available on this "
            "machine)_") in text
    assert "_(no configuration was timed in both fp32 and bf16)_" in text


@pytest.mark.parametrize("ratios, word", [
    ([1.2, 2.0, 3.0], "grows with every larger size"),
    ([3.0, 2.0, 1.2], "shrinks with every larger size"),
    ([1.2, 3.0, 2.0], "does not change monotonically with size"),
    ([1.2, 3.0], "is larger at the larger size"),
    ([3.0, 1.2], "is smaller at the larger size")])
def test_a_trend_needs_three_sizes(ratios, word):
    """Two sizes are compared, never called a trend."""
    from cs336_systems.sections.mixed_precision.report import trend_word

    assert trend_word(ratios) == word
