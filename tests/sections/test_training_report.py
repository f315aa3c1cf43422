"""The training section: its jobs on a CPU (what runs, what is skipped and why), and its facts and
prose on synthetic records, where other numbers must give other words (faster, slower, a tie)."""

import json

import pytest

from cs336_systems.pipeline.records import make_record
from cs336_systems.records import write_json_atomic
from cs336_systems.sections.training import report as section
from cs336_systems.sections.training import time_optimizer, time_training
from cs336_systems.sections.training.runs import RUNS
from support.sections import section_text

ENV = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11", "triton": "3.6",
       "git": "abc"}
SHAPE = {"size": "small", "context_length": 512, "batch_size": 4, "precision": "bf16",
         "warmup_steps": 3, "measure_steps": 5, "seed": 0}


def _training(tmp_path, run, loop_ms, spread=0.1, optimizer_ms=2.0, status="ok", peak=3.0,
              size="small", ceiling=750.0, git="abc"):
    metrics = {} if status != "ok" else {
        **{f"loop_step_ms_{s}": v for s, v in (("mean", loop_ms), ("std", spread),
                                              ("median", loop_ms), ("min", loop_ms - spread),
                                              ("max", loop_ms + spread))},
        "step_ms_median": loop_ms + 1, "optimizer_ms_median": optimizer_ms, "peak_gib": peak,
        "matmul_tflops": ceiling, "model_flops": 1.6e12}
    path = tmp_path / f"{size}-{run}.json"
    write_json_atomic(path, make_record("training", {**SHAPE, "size": size, "run": run}, status,
                                        metrics, {**ENV, "git": git},
                                        "CUDA out of memory" if status == "oom" else None))
    return str(path)


def _optimizer(tmp_path, fused_rounds, torch_rounds=(36.3, 36.3, 36.4)):
    def entry(name, rounds, extra=0.0):
        return {"optimizer": name, "status": "ok", "ms_median": sorted(rounds)[1],
                "ms_min": min(rounds), "ms_max": max(rounds), "rounds_ms": list(rounds),
                "extra_gib": extra}
    metrics = {"parameters": 3.4e9, "copy_gbps": 3020.0, "floor_ms": 31.6,
               "bytes_per_parameter": 28, "state_gib": 25.4,
               "optimizers": [entry("adamw", (101.5, 101.6, 101.5), 12.75),
                              entry("adamw-fused", fused_rounds),
                              entry("torch-adamw-fused", torch_rounds)]}
    path = tmp_path / "2.7b.json"
    write_json_atomic(path, make_record("optimizer", {"size": "2.7b", "rounds": 3,
                                                      "optimizers": list(metrics)}, "ok",
                                        metrics, ENV))
    return str(path)


def _facts(tmp_path, training, optimizer):
    outputs = {"training_table": str(tmp_path / "t.csv"),
               "optimizer_table": str(tmp_path / "o.csv")}
    facts = section.build({"training": training, "optimizer": optimizer}, {}, outputs)
    text = " ".join(section_text("training", facts, link_base=tmp_path).split())
    return facts, text


def test_the_ceiling_share_says_how_far_the_jobs_own_ceilings_move_it(tmp_path):
    """Each job measures the matmul ceiling: the share is against their median, and the
    jobs' range bounds it (1.6e12 FLOPs in 4 ms: 400 TFLOP/s against 720 to 800)."""
    training = [_training(tmp_path, "ours-flash-triton-fused-graphs", 4.0, ceiling=800.0),
                _training(tmp_path, "ours-sdpa-fused-graphs", 5.0, ceiling=720.0),
                _training(tmp_path, "hf-llama-compiled", 8.0, ceiling=760.0)]
    facts, text = _facts(tmp_path, training, [])
    size = facts["training"][0]
    assert size["ceiling_tflops"] == 760.0 and size["ceiling_range"]["jobs"] == 3
    assert size["best"]["ceiling_share_range"] == pytest.approx({"min": 0.5, "max": 400 / 720})
    assert ("53% of the 760 TFLOP/s a large bf16 matrix product reached in the same jobs, at "
            "the median; the 3 jobs' own products reached 720 to 800 TFLOP/s, so the share is "
            "50% to 56% within that spread") in text


def test_the_fastest_of_ours_against_each_stock_part(tmp_path):
    training = [_training(tmp_path, "ours-flash-triton-fused-compiled", 10.0),
                _training(tmp_path, "ours-sdpa-adamw", 30.0),
                _training(tmp_path, "stock-compiled", 12.0),
                _training(tmp_path, "hf-llama-compiled", 20.0)]
    facts, text = _facts(tmp_path, training, [])
    (small,) = facts["training"]
    assert small["best"]["label"] == RUNS["ours-flash-triton-fused-compiled"].label
    hf = small["against"]["hf-llama-compiled"]
    assert hf["ratio"] == pytest.approx(0.5) and hf["speedup"]["word"] == "faster"
    assert "It is 2.00x faster than HF Llama, SDPA, torch AdamW (fused), compiled" in text
    # model FLOPs over the step, against the ceiling measured beside it
    assert small["best"]["tflops"] == pytest.approx(160.0)
    assert small["best"]["ceiling_share"] == pytest.approx(160 / 750)


def test_the_stock_step_with_flashattention_4_is_a_reference_too(tmp_path):
    """The peers' attention in the stock step: ours against it as against the others, each
    sentence from its own ratio (our FA4 run may be our fastest: a stock part ours may use)."""
    training = [_training(tmp_path, "ours-flash-triton-fused-bf16w-graphs", 9.0),
                _training(tmp_path, "ours-fa4-fused-bf16w-graphs", 8.0),
                _training(tmp_path, "stock-compiled", 12.0),
                _training(tmp_path, "stock-fa4-compiled", 10.0)]
    facts, text = _facts(tmp_path, training, [])
    (small,) = facts["training"]
    assert small["best"]["label"] == RUNS["ours-fa4-fused-bf16w-graphs"].label
    assert "FlashAttention-4" in small["best"]["label"]
    fa4 = small["against"]["stock-fa4-compiled"]
    assert fa4["ratio"] == pytest.approx(0.8) and fa4["speedup"]["word"] == "faster"
    assert (f"Against our model with stock parts, {RUNS['stock-fa4-compiled'].label} (10.0 ms), "
            "it is 1.25x faster") in text
    assert f"{RUNS['stock-compiled'].label} (12.0 ms), it is 1.50x faster" in text


def test_a_stock_step_is_compared_only_with_ours_of_its_own_job_matrix(tmp_path):
    """Our fastest row came from an older matrix (commit "old"): the references measured in a
    newer one are compared with the fastest of ours measured beside them, and the prose names
    it; a reference with none of ours beside it is not compared."""
    training = [_training(tmp_path, "ours-sdpa-fused-bf16w-graphs", 5.0, git="old"),
                _training(tmp_path, "ours-flash-triton-fused-bf16w-graphs", 6.0, git="new"),
                _training(tmp_path, "hf-llama-compiled", 18.0, git="new"),
                _training(tmp_path, "stock-compiled", 12.0, git="other")]
    facts, text = _facts(tmp_path, training, [])
    (small,) = facts["training"]
    assert small["best"]["label"] == RUNS["ours-sdpa-fused-bf16w-graphs"].label
    hf = small["against"]["hf-llama-compiled"]
    assert hf["ours_label"] == RUNS["ours-flash-triton-fused-bf16w-graphs"].label
    assert not hf["ours_is_best"] and hf["ratio"] == pytest.approx(6.0 / 18.0)
    assert "stock-compiled" not in small["against"]
    assert (f"our fastest there, {RUNS['ours-flash-triton-fused-bf16w-graphs'].label} (6.0 ms), "
            "is 3.00x faster") in text
    assert "3.60x" not in text  # 18 / 5: the rows of two matrices, never compared
    # nor is a lever's run with its twin of another matrix
    training.append(_training(tmp_path, "ours-sdpa-fused-graphs", 5.5, git="new"))
    facts, _ = _facts(tmp_path, training, [])
    assert facts["training"][0]["masters_gain"] == []


def test_slower_and_tied_say_so(tmp_path):
    facts, text = _facts(tmp_path, [_training(tmp_path, "ours-flash-triton-fused-compiled", 15.0),
                                    _training(tmp_path, "hf-llama-compiled", 12.0),
                                    _training(tmp_path, "stock-compiled", 15.05)], [])
    assert "1.25x slower than HF Llama" in text
    assert "it is a tie (1.00x, inside the spread)" in text


def test_a_run_that_ran_out_of_memory_is_listed_not_compared(tmp_path):
    facts, text = _facts(tmp_path, [_training(tmp_path, "ours-flash-triton-fused-compiled", 15.0),
                                    _training(tmp_path, "hf-llama-compiled", 0, status="oom")],
                         [])
    assert facts["training"][0]["against"] == {}
    assert "Not measured: HF Llama, SDPA, torch AdamW (fused), compiled, oom" in text


def test_the_fused_optimizer_against_the_floor_and_torch(tmp_path):
    facts, text = _facts(tmp_path, [], [_optimizer(tmp_path, (32.5, 32.5, 32.6))])
    fused = facts["optimizer"][0]["fused"]
    assert fused["ratio_to_floor"] == pytest.approx(32.5 / 31.6)
    assert fused["ratio_to_torch"] == pytest.approx(32.5 / 36.3)
    assert fused["vs_torch"]["word"] == "faster" and not fused["vs_torch"]["within_spread"]
    assert "1.12x faster than torch's fused AdamW" in text
    assert "the written-out AdamW allocates 12.75 GiB" in text
    # rounds that overlap torch's: a tie, and the prose says so
    facts, text = _facts(tmp_path, [], [_optimizer(tmp_path, (36.2, 36.35, 36.5))])
    assert facts["optimizer"][0]["fused"]["vs_torch"]["within_spread"]
    assert "a tie with torch's fused AdamW" in text


def test_on_a_cpu_the_jobs_run_what_they_can_and_say_why_not_the_rest(tmp_path):
    out = tmp_path / "r.json"
    time_training.main(["--run", "ours-sdpa-adamw", "--size", "tiny", "--context-length", "16",
                        "--batch-size", "2", "--precision", "fp32", "--warmup-steps", "1",
                        "--measure-steps", "2", "--device", "cpu", "--output", str(out)])
    record = json.loads(out.read_text())
    assert record["status"] == "ok" and len(record["metrics"]["loop_step_ms_samples"]) == 3
    time_training.main(["--run", "stock-compiled", "--size", "tiny", "--context-length", "16",
                        "--device", "cpu", "--output", str(out)])
    assert json.loads(out.read_text())["message"].endswith("needs CUDA")
    for run in ("stock-fa4-compiled", "ours-fa4-fused-bf16w-graphs"):  # the peer's package
        time_training.main(["--run", run, "--size", "tiny", "--context-length", "16",
                            "--device", "cpu", "--output", str(out)])
        record = json.loads(out.read_text())
        assert record["status"] == "skipped" and record["message"], run
    time_optimizer.main(["--size", "tiny", "--device", "cpu", "--output", str(out)])
    assert json.loads(out.read_text())["status"] == "skipped"


def test_the_fused_optimizer_lowers_the_peak_by_what_the_written_out_one_allocates(tmp_path):
    training = [_training(tmp_path, "ours-sdpa-fused-compiled", 100.0, peak=52.7, size="2.7b"),
                _training(tmp_path, "ours-sdpa-adamw-compiled", 150.0, peak=65.4, size="2.7b")]
    facts, text = _facts(tmp_path, training, [_optimizer(tmp_path, (26.0, 26.1, 26.0))])
    (gain,) = facts["training"][0]["fused_gain"]
    assert gain["peak_gib"] == pytest.approx(12.7) and gain["peak_word"] == "lower"
    assert "(whose temporaries measure 12.75 GiB in the optimizer's step alone" in text
    assert "1.50x faster, its peak 12.70 GiB lower; the optimizer's phase, timed apart, " \
        "takes 2.00 ms against 2.00 ms, so most of the step's difference (-50.0 ms) lies " \
        "outside the optimizer" in text
    higher = [_training(tmp_path, "ours-sdpa-fused-compiled", 100.0, peak=66.0, size="2.7b"),
              _training(tmp_path, "ours-sdpa-adamw-compiled", 150.0, peak=65.4, size="2.7b")]
    _, text = _facts(tmp_path, higher, [])
    assert "its peak 0.60 GiB higher;" in text


def test_the_fused_optimizer_is_credited_only_with_what_its_phase_changed(tmp_path):
    """A step that is faster by its optimizer's phase is the lever's doing; one whose phases
    outside the optimizer differ says so (the small model's eager steps, bound by the host)."""
    def text_for(fused_step, fused_phase):
        training = [_training(tmp_path, "ours-sdpa-fused", fused_step, optimizer_ms=fused_phase),
                    _training(tmp_path, "ours-sdpa-adamw", 30.0, optimizer_ms=3.5)]
        return _facts(tmp_path, training, [])[1]

    text = text_for(28.5, 2.0)
    assert "1.05x faster" in text and "takes 2.00 ms against 3.50 ms." in text
    assert "lies outside the optimizer" not in text
    text = text_for(52.0, 2.0)
    assert "1.73x slower" in text
    assert "so most of the step's difference (23.5 ms) lies outside the optimizer" in text


def test_what_the_bf16_weight_copies_buy_is_their_run_against_its_twin(tmp_path):
    def facts_and_text(with_copies_ms, spread=0.1):
        training = [_training(tmp_path, "ours-flash-triton-fused-bf16w-graphs", with_copies_ms,
                              spread=spread, peak=40.0, size="2.7b"),
                    _training(tmp_path, "ours-flash-triton-fused-graphs", 110.0, peak=45.0, size="2.7b")]
        return _facts(tmp_path, training, [])

    facts, text = facts_and_text(100.0)
    (gain,) = facts["training"][0]["masters_gain"]
    assert gain["twin"] == RUNS["ours-flash-triton-fused-graphs"].label
    assert ": 100.0 ms against 110.0 ms without the copies, 1.10x faster, its peak 5.00 GiB " \
        "lower." in text
    _, text = facts_and_text(121.0)
    assert "1.10x slower, its peak" in text
    _, text = facts_and_text(110.5, spread=1.0)
    assert "a tie inside the measured spread" in text
    facts, text = _facts(tmp_path, [_training(tmp_path, "ours-flash-triton-fused-bf16w-graphs", 100.0,
                                               size="2.7b")], [])
    assert facts["training"][0]["masters_gain"] == [] and "without the copies" not in text


def test_a_table_of_several_commits_names_each_rows_commit(tmp_path):
    one = [_training(tmp_path, "ours-sdpa-fused-compiled", 10.0),
           _training(tmp_path, "hf-llama-compiled", 12.0)]
    facts, _ = _facts(tmp_path, one, [])
    assert "commit" not in facts["training"][0]["table"]
    record = json.loads((tmp_path / "small-hf-llama-compiled.json").read_text())
    record["env"]["git"] = "def"
    (tmp_path / "small-hf-llama-compiled.json").write_text(json.dumps(record))
    facts, _ = _facts(tmp_path, one, [])
    assert "| commit" in facts["training"][0]["table"] and "| def" in facts["training"][0]["table"]


def test_every_attention_of_the_runs_names_its_kernels_as_sources():
    """A run names its attention's kernel modules (its rule's sources): editing the Gluon
    kernels redoes the runs that use them, and only those."""
    gluon = RUNS["ours-flash-gluon-fused-graphs"]
    assert gluon.label.startswith("ours, Gluon FA2 (sm90)")
    assert "cs336_systems.kernels.flash_gluon" in gluon.modules()
    triton = RUNS["ours-flash-triton-fused-graphs"]
    assert "cs336_systems.kernels.flash_gluon" not in triton.modules()
