"""The memory section: the CLI on a CPU (skipped, with the reason), and the report on synthetic
CUDA records (ok, out of memory, skipped) whose answers are known."""

from pathlib import Path

import pytest
import torch

from cs336_systems.analysis.memory_model import analytic_peak, step_memory
from cs336_systems.measure.memory import GIB
from cs336_systems.measure.memory_timeline import Timeline, reduce_snapshot
from cs336_systems.pipeline.records import make_record
from cs336_systems.records import read_record, write_json_atomic
from cs336_systems.report.facts import jsonable
from cs336_systems.sections.memory import memory_history
from cs336_systems.sections.memory import record_memory as memory
from cs336_systems.sections.memory import report as section
from support.checkout import project_yaml
from support.memory_traces import MODEL, PACKAGE, Trace, frames
from support.sections import section_text

DEFAULTS = project_yaml()["defaults"]
MIB = 2**20
D_MODEL = 2560  # 2.7b
# the SwiGLU's first projection: where an FFN-sized activation comes from
FFN_LINE = Path(MODEL).read_text().splitlines().index("        a = self.w1(x)") + 1


def _build(paths, tmp_path, modes=("forward", "train-step")):
    outputs = {"peak_table": str(tmp_path / "peaks.csv"),
               "allocations_table": str(tmp_path / "largest.csv"),
               **{"timeline_" + m.replace("-", "_"): str(tmp_path / f"timeline_{m}.png")
                  for m in modes}}
    facts = jsonable(section.build({"records": [str(p) for p in paths]},
                                   {"assignment": DEFAULTS["memory"]}, outputs))
    return facts, section_text("memory", facts, link_base=tmp_path), outputs


def _config(context, mode, precision, size="2.7b"):
    return {"size": size, "context_length": context, "mode": mode, "precision": precision,
            "warmup_steps": 2, "measure_steps": 1, "batch_size": 4, "attention": "eager",
            "checkpoint_block_size": None, "max_entries": 200000, "seed": 0}


def test_the_cli_on_a_cpu_records_skipped_with_the_reason(tmp_path):
    out = tmp_path / "r.json"
    memory.main(["--size", "tiny", "--context-length", "16", "--mode", "train-step",
                 "--device", "cpu", "--output", str(out)])
    record = read_record(out)
    assert record["status"] == "skipped" and record["metrics"] == {}
    assert record["message"].startswith("memory history needs CUDA")
    assert record["config"]["max_entries"] == 200000 and "output" not in record["config"]
    assert not list(tmp_path.glob("r.*.gz"))         # nothing beside a skipped record


@pytest.mark.skipif(not torch.cuda.is_available(), reason="memory history needs CUDA")
def test_the_cli_on_a_gpu_records_the_timeline_with_its_phases_and_sources(tmp_path):
    out = tmp_path / "r.json"
    memory.main(["--size", "tiny", "--context-length", "64", "--mode", "train-step",
                 "--measure-steps", "2", "--device", "cuda", "--output", str(out)])
    record = read_record(out)
    assert record["status"] == "ok", record.get("message")
    m = record["metrics"]
    for kind in memory_history.SIDECARS:
        assert (tmp_path / m[f"{kind}_file"]).stat().st_size > 0
    # the allocator's clock and ours agree: every phase start falls on an event
    assert m["phase_marks"] == 6 and m["phases_marked"] == 6
    assert m["peak_stage"] in ("forward", "backward", "optimizer")
    # requested bytes never exceed the allocator's blocks, and differ by its rounding only
    assert m["trace_start_gib"] <= m["start_gib"] and m["trace_peak_gib"] <= m["peak_gib"]
    assert m["peak_gib"] - m["trace_peak_gib"] < 0.1 * m["peak_gib"]
    assert m["peak_reserved_gib"] >= m["peak_gib"]
    timeline = Timeline.load(tmp_path / m["timeline_file"])
    labels = {timeline.sites[s]["label"] for s in timeline.site}
    assert any(label.startswith("lm/model.py:") for label in labels)
    assert "no Python frame (backward)" in labels          # autograd's engine thread
    assert m["residual_allocations"] > 0
    assert m["residual_lines"][0]["label"].startswith(("lm/model.py:", "no Python frame"))


@pytest.mark.parametrize("argv, message", [
    (["--context-length", "512"], "longer than size 'tiny' supports"),
    (["--context-length", "16", "--max-entries", "0"], "must be a positive integer"),
    (["--context-length", "16", "--mode", "inference"], "invalid choice: 'inference'"),
])
def test_bad_input_is_a_usage_error(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        memory.main(["--size", "tiny", "--mode", "forward", *argv, "--output",
                     str(tmp_path / "r.json")])
    assert exit.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def _snapshot(context, mode, precision, residual_per_step):
    """A step of known shape, in bytes of the real configuration (so the GiB are plausible):
    before recording the weights (and AdamW's moments); forward makes `residual_per_step`
    residual-sized activations at lm/model.py:90 and one FFN-sized one at the SwiGLU's line, and
    bf16 makes them half as large; train-step's backward makes gradients (no frame) and frees
    the activations, its optimizer a parameter-sized temporary."""
    weights = 13 * GIB
    residual = 4 * context * D_MODEL * 4
    scale = 1 if precision == "fp32" else 0.5
    trace, marks = Trace(), []
    marks.append({"step": 1, "phase": "forward", "time_us": trace.t + 1})
    acts = [(trace.alloc(residual, frames((MODEL, 90, "forward"))), residual)
            for _ in range(residual_per_step)]
    ffn = int(4 * context * 10240 * 4 * scale)
    acts.append((trace.alloc(ffn, frames((MODEL, FFN_LINE, "forward"))), ffn))
    before = [(7 << 40, weights)]
    if mode == "forward":
        for a in acts:
            trace.free(*a)
    else:
        before.append((8 << 40, 2 * weights))
        marks.append({"step": 1, "phase": "backward", "time_us": trace.t + 1})
        grads = [(trace.alloc(weights // 4), weights // 4) for _ in range(4)]
        for a in reversed(acts):
            trace.free(*a)
        marks.append({"step": 1, "phase": "optimizer", "time_us": trace.t + 1})
        temporary = trace.alloc(weights, frames((str(PACKAGE / "lm/optimizer.py"), 60, "step")))
        trace.free(temporary, weights)
        for g in grads:
            trace.free(*g)
    return trace.snapshot(live_before=before), marks


def _record(tmp_path, context, mode, precision, status="ok", residual_per_step=3):
    config = _config(context, mode, precision)
    path = tmp_path / f"2.7b_ctx{context}_{mode}_{precision}.json"
    if status != "ok":
        message = {"oom": "CUDA out of memory. Tried to allocate 2.00 GiB",
                   "skipped": "CUDA was requested but no CUDA device is available"}[status]
        write_json_atomic(path, make_record("memory", config, status, message=message,
                                            env={"device": "cuda", "gpu": "H200"}))
        return path
    snapshot, marks = _snapshot(context, mode, precision, residual_per_step)
    timeline = reduce_snapshot(snapshot, 0, marks, PACKAGE)
    timeline.save(memory_history.sidecar(path, "timeline"))
    metrics = memory_history.timeline_metrics(timeline, config)
    peak = metrics["trace_peak_gib"] + 0.001                 # the allocator's rounding
    metrics.update({"parameters": 3_400_000_000, "weights_gib": 13.0,
                    "start_gib": metrics["trace_start_gib"] + 0.01, "peak_gib": peak,
                    "peak_reserved_gib": peak + 0.5, "trace_full": False,
                    "step_ms_mean": 100.0, "step_ms_std": 1.0,
                    **{f"{k}_file": memory_history.sidecar(path, k).name for k in memory_history.SIDECARS}})
    write_json_atomic(path, make_record("memory", config, "ok", metrics,
                                        env={"device": "cuda", "gpu": "H200"}))
    return path


@pytest.fixture
def cuda_records(tmp_path):
    paths = []
    for context in (128, 2048):
        for mode in ("forward", "train-step"):
            for precision in ("fp32", "bf16"):
                status = "oom" if (context, mode, precision) == (2048, "train-step", "fp32") \
                    else "ok"
                paths.append(_record(tmp_path, context, mode, precision, status))
    return paths


def test_known_answers_from_cuda_records(cuda_records, tmp_path, real_figures):
    facts, text, outputs = _build(cuda_records, tmp_path)
    assert facts["any_ok"]
    cover = facts["coverage"]["memory_profiling"]
    assert cover["status"] == "partly answered"              # contexts 256 and 512 left out
    assert "not in this preset: sizes 10B; contexts 256, 512" in cover["note"]
    assert "1 of 8 configurations oom" in cover["note"] and "residuals section" in cover["note"]
    # (a) the stage of each peak, from the timelines: the forward's activations in inference,
    # the optimizer's temporary over weights, moments and gradients in a training step
    stages = {(s["context_length"], s["mode"], s["precision"]): s["stage"]
              for s in facts["stages"]}
    assert stages[(128, "forward", "fp32")] == "forward"
    assert stages[(128, "train-step", "fp32")] == "optimizer"
    assert (2048, "train-step", "fp32") not in stages
    for mode in ("forward", "train-step"):
        assert Path(outputs["timeline_" + mode.replace("-", "_")]).stat().st_size > 20_000
    # (b), (c): in inference bf16 halves the FFN activation; in training the peak is the
    # optimizer step, parameter-shaped memory only, which bf16 leaves alone
    modes = {m["mode"]: m for m in facts["bf16"]["modes"]}
    assert modes["train-step"]["word"] == "barely changes"
    forward = [r for r in facts["bf16"]["rows"] if r["mode"] == "forward"]
    residual = 4 * 128 * D_MODEL * 4
    fp32 = (13 * GIB + 3 * residual + 4 * 128 * 10240 * 4) / GIB
    bf16 = (13 * GIB + 3 * residual + 4 * 128 * 10240 * 2) / GIB
    assert forward[0]["ratio"] == pytest.approx((bf16 + 0.001) / (fp32 + 0.001))
    assert modes["forward"]["word"] in ("lowers", "barely changes", "changes by context")
    assert modes["forward"]["raised"] == 0  # never above fp32 by more than the tie
    parts = step_memory("2.7b", 4, 128, "train-step")
    fixed = sum(parts[k] for k in ("weights", "gradients", "optimizer state",
                                   "optimizer temporary")) / GIB
    assert modes["train-step"]["fixed_gib"] == pytest.approx(fixed)
    assert modes["forward"]["bf16_weight_copies_gib"] == pytest.approx(3.4e9 * 2 / GIB)
    # the model beside each peak: the allocator's rounding and cache, as recorded
    comparison = {(c["context_length"], c["mode"], c["precision"]): c
                  for c in facts["comparison"]["configs"]}
    c = comparison[(128, "train-step", "fp32")]
    assert c["rounding_gib"] == pytest.approx(0.001) and c["cache_gib"] == pytest.approx(0.5)
    assert c["analytic_gib"] == pytest.approx(
        analytic_peak(step_memory("2.7b", 4, 128, "train-step"))["bytes"] / GIB)
    assert c["stage_agrees"] and c["analytic_stage"] == "optimizer step"
    # at the peak: the gradients (backward's thread, no frame) and the optimizer's temporary
    assert {x["category"]: x["gib"] for x in c["live_top"]} == pytest.approx(
        {"no Python frame (backward)": 13.0, "lm/optimizer.py": 13.0})
    # (d) the residual stream: derived, and three allocations of its size per step
    derived = {d["context_length"]: d for d in facts["residual"]["derived"]}
    assert derived[128]["mib"] == pytest.approx(4 * 128 * 2560 * 4 / MIB) == 5.0
    assert derived[2048]["mib"] == 80.0
    found = {(f["context_length"], f["mode"], f["precision"]): f
             for f in facts["residual"]["found"]}
    assert found[(128, "forward", "fp32")]["count"] == 3
    assert found[(128, "forward", "fp32")]["top_line"] == "lm/model.py:90"
    # (e) the largest allocations of the focus configurations, with their code
    focus = {(t["mode"], t["context_length"], t["precision"]): t
             for t in facts["largest"]["tables"]}
    assert set(focus) == {("forward", 2048, "fp32"), ("train-step", 2048, "bf16")}
    top = focus[("forward", 2048, "fp32")]["top"]
    assert top["label"] == f"lm/model.py:{FFN_LINE}" and top["mib"] == pytest.approx(320.0)
    assert top["source"] == "a = self.w1(x)" and top["function"] == "forward"
    # the prose
    flat = " ".join(text.split())
    assert "## 1.5 `memory_profiling`" in text and '<a id="memory_profiling"></a>' in text
    assert "[1.5 (f)](#memory_profiling_f)" in flat
    assert "xl ctx 128 train-step fp32: 65.00 GiB, in the optimizer of step 1." in flat
    assert f"by lm/model.py:{FFN_LINE} (`forward`): `a = self.w1(x)`." in flat
    assert "within 1% (a tie) at 1" in flat
    assert "they do not show in the measured peaks, where bf16 - fp32 is at most -" in flat
    assert "= 5.00 MiB" in flat and "= 80.00 MiB" in flat
    assert ("Not measured (oom: CUDA out of memory. Tried to allocate 2.00 GiB): "
            "xl ctx 2048 train-step fp32.") in flat
    assert "needs a network" in flat and "pytorch.org/memory_viz" in flat
    assert "{{" not in text and "nan" not in flat.lower().replace("nano", "")
    # the answers open the section, each from the facts above: where the peaks fall (the
    # training step's one fp32 run at 2048 ran out of memory, so its fp32 line has one context)
    answers = flat[flat.index("**Answers.**"):flat.index("`python -m")]
    assert "**(a), (b)** xl forward: the peak falls in the forward in 4 of 4 runs; in fp32" \
        in answers
    assert "**(a), (b)** xl train-step: the peak falls in the optimizer in 3 of 3 runs; in " \
        "fp32 it is 65.00 GiB at context 128." in answers
    assert "**(c)** xl train-step: bf16 / fp32 peak" in answers
    assert "5.00 MiB for xl at context 128, 80.00 MiB at 2048" in answers
    assert f"320.0 MiB, made 1 time by lm/model.py:{FFN_LINE} (`forward`)" in answers


def test_the_tables_hold_every_record_and_every_largest_row(cuda_records, tmp_path):
    import pandas as pd

    _, _, outputs = _build(cuda_records, tmp_path)
    peaks = pd.read_csv(outputs["peak_table"])
    assert len(peaks) == 8 and (peaks["status"] == "oom").sum() == 1
    assert {"peak_gib", "peak_reserved_gib", "analytic_gib", "analytic_stage"} <= set(peaks)
    largest = pd.read_csv(outputs["allocations_table"])
    assert f"lm/model.py:{FFN_LINE}" in set(largest["label"]) and len(largest) >= 7


def test_a_cpu_run_renders_the_model_and_says_why_nothing_was_measured(tmp_path, real_figures):
    paths = []
    for context in (16, 32):
        for mode in ("forward", "train-step"):
            path = tmp_path / f"tiny_ctx{context}_{mode}.json"
            memory.main(["--size", "tiny", "--context-length", str(context), "--mode", mode,
                         "--device", "cpu", "--output", str(path)])
            paths.append(path)
    facts, text, outputs = _build(paths, tmp_path)
    assert not facts["any_ok"] and facts["coverage"]["memory_profiling"]["status"] == "skipped"
    assert "memory history needs CUDA" in facts["coverage"]["memory_profiling"]["note"]
    assert "Nothing was measured in this run" in text
    assert text.count("| tiny ") == 4                        # the analytic model, every config
    assert "Not measured (skipped: memory history needs CUDA" in text
    assert "this job runs on the cpu): tiny ctx 16 forward fp32, tiny ctx 32 forward fp32, " \
        "tiny ctx 16 train-step fp32, tiny ctx 32 train-step fp32." in " ".join(text.split())
    for key in ("timeline_forward", "timeline_train_step"):
        assert Path(outputs[key]).stat().st_size > 5_000     # "not measured" panels


@pytest.mark.parametrize("delta_gib, shows", [(0.02, False), (3.5, True)])
def test_autocast_weight_copies_are_claimed_only_where_the_peaks_show_them(delta_gib, shows):
    """Whether autocast's cached bf16 weight copies show follows the measured peaks: not with
    bf16 about level with fp32; yes with bf16 higher by half the copies or more. (The prose of
    the first case: `test_known_answers_from_cuda_records`.)"""
    import pandas as pd

    from cs336_systems.sections.memory.report import bf16_facts

    frame = pd.DataFrame([
        {"status": "ok", "size": "2.7b", "mode": "forward", "context_length": 128,
         "precision": precision, "peak_gib": 13.0 + (delta_gib if precision == "bf16" else 0),
         "peak_stage": "forward", "parameter_shaped_gib": 12.7, "parameters": 3.4e9}
        for precision in ("fp32", "bf16")])
    (mode,) = bf16_facts(frame)["modes"]
    assert mode["copies_show"] is shows and mode["delta_max_gib"] == pytest.approx(delta_gib)
