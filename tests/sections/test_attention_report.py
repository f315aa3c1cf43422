"""The attention section's report math, checked on the real H200 records of the reference run."""

import copy
import json
import statistics

import numpy as np
import pytest

from cs336_systems.analysis.attention_memory import eager_attention_bytes
from cs336_systems.report.facts import jsonable, speedup
from cs336_systems.report.tables import to_markdown
from cs336_systems.sections.attention import report as attention
from cs336_systems.sections.flash import report as flash
from support.checkout import ROOT, project_yaml
from support.sections import section_text

QUICK = ROOT / "docs/reference-run/results/quick"
DEFAULTS = project_yaml()["defaults"]


def _metrics(name):
    return json.loads((QUICK / name).read_text())["metrics"]


@pytest.fixture(scope="module")
def facts(tmp_path_factory):
    out = tmp_path_factory.mktemp("attention")
    flash_table = out / "flash.csv"
    flash.build({"records": sorted(map(str, (QUICK / "flash").glob("*.json"))),
                 "leaderboard": sorted(map(str, (QUICK / "flash_leaderboard").glob("*.json"))),
                 "speed": sorted(map(str, (QUICK / "flash_speed").glob("*.json"))),
                 "kernels": sorted(map(str, (QUICK / "flash_kernels").glob("*.json")))},
                {"assignment": DEFAULTS["flash"]},
                {"table": str(flash_table), "leaderboard_table": str(out / "board.csv"),
                 "speed_table": str(out / "speed.csv"), "kernels_table": str(out / "k.csv"),
                 "latency_figure": str(out / "l.png"), "speedup_figure": str(out / "s.png")})
    compiled = sorted(map(str, (QUICK / "torch_compile").glob("*.json")))
    records = {"records": sorted(map(str, (QUICK / "attention").glob("*.json"))),
               "compiled_model": compiled,
               "vanilla_model": [p.replace("/torch_compile/", "/benchmark/") for p in compiled],
               "flash_table": [str(flash_table)]}
    outputs = {"table": str(out / "attention.csv"), "model_table": str(out / "model.csv"),
               "memory_figure": str(out / "memory.png")}
    built = attention.build(records, {"assignment": DEFAULTS["attention"]}, outputs)
    return jsonable(built)


def test_the_smallest_failing_configuration_and_its_count(facts):
    a = facts["accounting"]
    assert (a["d"], a["seq"], a["cap_gib"], a["pass"]) == (16, 16384, 24.0, "backward")
    assert a["parts_gib"]["scores"] == pytest.approx(8 * 16384**2 * 4 / 2**30)  # 8 GiB
    assert a["parts_gib"]["peak"] > a["cap_gib"]  # the count predicts the failure
    check = a["check"]
    ran = _metrics(f"attention/eager_d{check['d']}_seq{check['seq']}_cap24gib.json")
    assert check["peak_measured_gib"] == pytest.approx(ran["peak_gib"])
    assert check["before_backward_measured_gib"] == pytest.approx(
        ran["memory_before_backward_gib"])


def test_the_count_matches_the_measured_memory(facts):
    """The count of eager attention's tensors against the allocator's readings, within what
    the CUDA context's libraries hold besides (cuBLAS's workspace, tens of MiB)."""
    check = facts["accounting"]["check"]
    assert check["peak_model_gib"] == pytest.approx(check["peak_measured_gib"], abs=0.1)
    assert check["before_backward_model_gib"] == pytest.approx(
        check["before_backward_measured_gib"], abs=0.05)
    for d in DEFAULTS["attention"]["d_heads"]:  # and at the longest sequence, uncapped
        measured = _metrics(f"attention/eager_d{d}_seq16384_uncapped.json")["peak_gib"]
        model = eager_attention_bytes(8, 16384, d)["peak"] / 2**30
        assert model == pytest.approx(measured, abs=0.1)


def test_fragmentation_is_told_apart_from_need(facts):
    """The reference run's compiled out-of-memory (in a forward whose count fits the cap: the
    allocator's fragmentation, and which shape it strikes varies from run to run) is told apart
    from eager's (backwards whose count exceeds the cap)."""
    by_variant = {}
    for o in facts["oom"]:
        by_variant.setdefault(o["variant"], []).append(o)
    assert by_variant["compiled"] and by_variant["eager"]
    assert all(o["under_cap"] and o["pass"] == "forward" for o in by_variant["compiled"])
    assert all(not o["under_cap"] and o["pass"] == "backward" for o in by_variant["eager"])


def test_the_exponent_is_a_fit_of_the_records(facts):
    s = next(x for x in facts["scaling"] if x["d"] == 16)
    seqs = [4096, 8192, 16384]
    memory = [_metrics(f"attention/eager_d16_seq{q}_uncapped.json")["memory_before_backward_gib"]
              for q in seqs]
    assert s["exponent"] == pytest.approx(np.polyfit(np.log(seqs), np.log(memory), 1)[0])
    assert 1.8 < s["exponent"] < 2.0


def test_compiled_attention_speedup_is_the_median_of_the_ratios(facts):
    """Over the shapes where neither forward is overhead-bound: a sequence at least twice as
    long (4x the work at the same d) took at most 1.5x its time."""
    def forward_ms(variant, d, seq):
        record = json.loads((QUICK / f"attention/{variant}_d{d}_seq{seq}_uncapped.json")
                            .read_text())
        return record["metrics"]["forward_ms_mean"] if record["status"] == "ok" else None

    seqs = DEFAULTS["attention"]["seq_lengths"]
    ratios, flat = [], 0
    for d in DEFAULTS["attention"]["d_heads"]:
        for seq in seqs:
            times = {v: forward_ms(v, d, seq) for v in ("eager", "compiled")}
            if None in times.values():
                continue
            if any(forward_ms(v, d, longer) is not None
                   and forward_ms(v, d, longer) <= 1.5 * times[v]
                   for v in times for longer in seqs if longer >= 2 * seq):
                flat += 1
                continue
            ratios.append(times["eager"] / times["compiled"])
    forward = facts["compile"]["forward"]
    assert forward["shapes"] + forward["overhead_bound"] == 20
    assert (forward["shapes"], forward["overhead_bound"]) == (len(ratios), flat)
    assert forward["median"]["ratio"] == pytest.approx(statistics.median(ratios))
    assert forward["faster"] == sum(r > 1 for r in ratios)


def test_the_whole_model_comparison_uses_the_same_job_matrix(facts):
    row = next(m for m in facts["model_compile"] if (m["size"], m["mode"]) == ("2.7b", "train-step"))
    compiled = _metrics("torch_compile/2.7b_ctx512_train-step_fp32_warmup5.json")
    vanilla = _metrics("benchmark/2.7b_ctx512_train-step_fp32_warmup5.json")
    assert row["speedup"]["ratio"] == pytest.approx(vanilla["step_ms_mean"]
                                                    / compiled["step_ms_mean"])
    assert row["compile_ms"] == pytest.approx(
        compiled["step_warmup_ms_samples"][0] - compiled["step_ms_median"]
        - (vanilla["step_warmup_ms_samples"][0] - vanilla["step_ms_median"]))


def test_flash_memory_comes_from_the_flash_records(facts):
    row = next(r for r in facts["flash_memory"]["rows"] if (r["d"], r["precision"]) == (64, "bf16"))
    ours = _metrics("flash/flash-triton_seq16384_d64_bf16.json")["peak_gib"]
    eager = _metrics("flash/eager_seq16384_d64_bf16.json")["peak_gib"]
    baseline = _metrics("flash/flash-triton_seq256_d64_bf16.json")["peak_gib"]
    assert row["baseline_gib"] == pytest.approx(baseline)
    assert row["eager_over_flash"] == pytest.approx((eager - baseline) / (ours - baseline))


def test_coverage_and_rendering(facts, tmp_path):
    assert facts["coverage"]["pytorch_attention"]["status"] == "answered"  # an oom is a result
    assert facts["coverage"]["torch_compile"]["note"].startswith("whole model: sizes medium")
    text = " ".join(section_text("attention", facts, link_base=tmp_path).split())
    assert "The smallest configuration that ran out of memory is d 16, seq 16384" in text
    assert '<a id="pytorch_attention"></a>' in text and '<a id="torch_compile"></a>' in text


def test_no_compile_time_is_given_as_negative(facts, tmp_path):
    """A first compiled call that cost less than the eager one is no negative compilation:
    the shapes where that happened are counted and left out of the estimate's range."""
    compile_ms = facts["compile"]["compile_ms"]
    text = " ".join(section_text("attention", facts, link_base=tmp_path).split())
    if compile_ms["negative"]:
        assert compile_ms["min"] < 0
        assert (f"At {compile_ms['negative']} of {compile_ms['shapes']} shapes the difference "
                "came out below zero") in text
        assert f"({compile_ms['min']:.0f} to" not in text
    else:
        assert compile_ms["min"] >= 0 and "below zero" not in text


def test_a_negative_difference_is_counted(facts, tmp_path):
    changed = copy.deepcopy(facts)
    changed["compile"]["compile_ms"].update(min=-1500.0, negative=3, shapes=20)
    text = " ".join(section_text("attention", changed, link_base=tmp_path).split())
    assert "At 3 of 20 shapes the difference came out below zero (down to -1500 ms)" in text
    changed["compile"]["compile_ms"].update(min=200.0, negative=0)
    text = " ".join(section_text("attention", changed, link_base=tmp_path).split())
    assert "below zero" not in text and "(200 to" in text


def test_the_answers_open_the_section_with_the_records_numbers(facts, tmp_path):
    """3.1 opens with one line per part: the timings' range from the uncapped eager records,
    the first out-of-memory, how memory grows (a word from the fitted exponents) and what
    tiling saves."""
    ok = []
    for d in DEFAULTS["attention"]["d_heads"]:
        for seq in DEFAULTS["attention"]["seq_lengths"]:
            record = json.loads((QUICK / f"attention/eager_d{d}_seq{seq}_uncapped.json")
                                .read_text())
            if record["status"] == "ok":
                ok.append((record["metrics"]["forward_ms_mean"], d, seq))
    fastest, slowest = min(ok), max(ok)
    text = " ".join(section_text("attention", facts, link_base=tmp_path).split())
    answers = text[text.index("**Answers.**"):text.index("Attention alone, softmax")]
    assert (f"a forward takes {fastest[0]:.3f} ms (d {fastest[1]}, seq {fastest[2]}) to "
            f"{slowest[0]:.1f} ms (d {slowest[1]}, seq {slowest[2]})") in answers
    assert f"first at d {facts['accounting']['d']}, seq {facts['accounting']['seq']}" in answers
    assert "grows nearly quadratically" in answers and "less than plain PyTorch" in answers


@pytest.mark.parametrize("exponents, word", [
    ((1.95, 1.88), "nearly quadratically"), ((1.0, 1.1), "nearly linearly"),
    ((1.5, 1.9), "faster than linearly, slower than quadratically"),
    ((2.5,), "neither linearly nor quadratically")])
def test_the_growth_word_follows_the_fitted_exponents(exponents, word):
    assert attention.growth_word([{"exponent": b} for b in exponents]) == word


def test_the_whole_model_summary_counts_faster_slower_and_ties_per_mode():
    def row(size, mode, vanilla, compiled, std):
        return {"size": size, "mode": mode, "vanilla_ms": vanilla, "vanilla_std": std,
                "compiled_ms": compiled, "compiled_std": std, "compile_ms": 1000.0 * compiled,
                "speedup": speedup(compiled, vanilla, std, std)}
    rows = [row("small", "forward", 20.0, 10.0, 0.1), row("xl", "forward", 100.0, 101.0, 2.0),
            row("small", "train-step", 50.0, 60.0, 0.1)]
    summary = attention.model_compile_summary(rows)
    forward = summary["forward"]
    assert (forward["faster"], forward["slower"], forward["ties"]) == (1, 0, 1)
    assert (forward["min"], forward["max"]) == pytest.approx((100 / 101, 2.0))
    assert (forward["compile_s_min"], forward["compile_s_max"]) == pytest.approx((10.0, 101.0))
    assert (summary["train-step"]["slower"], summary["train-step"]["faster"]) == (1, 0)
    table = to_markdown(attention.model_compile_display(rows))
    assert "| 0.99x *" in table and "| 2.00x " in table
