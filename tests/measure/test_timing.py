import statistics
import time

import pytest
import torch

from cs336_systems.lm.adamw import AdamW
from cs336_systems.lm.model import VOCAB_SIZE, build_model
from cs336_systems.lm.precision import autocast_context
from cs336_systems.lm.step import lm_step_phases
from cs336_systems.measure.timing import summarize, time_callable, time_phases


def test_time_phases_counts_steps_and_sums_phases():
    calls = []
    phases = [("a", lambda: calls.append("a")), ("b", lambda: calls.append("b"))]
    times = time_phases(phases, "cpu", warmup_steps=2, measure_steps=3)
    assert calls == ["a", "b"] * 5
    assert {k: len(v) for k, v in times.warmup_ms.items()} == {"a": 2, "b": 2, "step": 2}
    assert {k: len(v) for k, v in times.measured_ms.items()} == {"a": 3, "b": 3, "step": 3}
    for i in range(3):
        assert times.measured_ms["step"][i] == pytest.approx(
            times.measured_ms["a"][i] + times.measured_ms["b"][i])


def test_time_phases_measures_wall_clock():
    times = time_callable(lambda: time.sleep(0.02), "cpu", warmup_steps=0, measure_steps=2,
                          name="sleep")
    assert all(20.0 <= t < 500.0 for t in times.measured_ms["sleep"])


def test_metrics_are_named_with_units_and_match_statistics():
    samples = [3.0, 1.0, 2.0, 10.0]
    stats = summarize(samples)
    assert stats == {"mean": statistics.fmean(samples), "std": statistics.stdev(samples),
                     "min": 1.0, "max": 10.0, "median": 2.5}
    times = time_callable(lambda: None, "cpu", warmup_steps=1, measure_steps=2, name="forward")
    metrics = times.metrics()
    assert {"forward_ms_mean", "forward_ms_std", "forward_ms_first", "forward_ms_samples",
            "forward_warmup_ms_samples"} <= set(metrics)


@pytest.mark.parametrize("warmup, measure", [(-1, 3), (0, 0)])
def test_time_phases_rejects_bad_step_counts(warmup, measure):
    with pytest.raises(ValueError, match="steps must be"):
        time_phases([("a", lambda: None)], "cpu", warmup, measure)


@pytest.mark.parametrize("mode, phases", [
    ("forward", ["forward"]),
    ("forward-backward", ["forward", "backward"]),
    ("train-step", ["forward", "backward", "optimizer"]),
])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_lm_step_phases_run_on_cpu(mode, phases, precision):
    model = build_model("tiny", context_length=8)
    token_ids = torch.randint(0, VOCAB_SIZE, (2, 8))
    targets = torch.randint(0, VOCAB_SIZE, (2, 8))
    optimizer = AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    steps = lm_step_phases(model, token_ids, targets, mode, precision, optimizer)
    assert [name for name, _ in steps] == phases
    times = time_phases(steps, "cpu", warmup_steps=1, measure_steps=2)
    assert all(t > 0 for t in times.measured_ms["step"])
    changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert changed == (mode == "train-step")  # only the train step updates weights
    assert all(p.grad is None for p in model.parameters())  # no gradient left behind


def test_lm_step_phases_rejects_bad_arguments():
    model = build_model("tiny", context_length=8)
    ids = torch.randint(0, VOCAB_SIZE, (1, 8))
    with pytest.raises(ValueError, match="unknown mode 'sprint'; allowed: forward"):
        lm_step_phases(model, ids, ids, "sprint", "fp32")
    with pytest.raises(ValueError, match="needs an optimizer"):
        lm_step_phases(model, ids, ids, "train-step", "fp32")
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        autocast_context("cpu", "fp8")


def test_bf16_autocast_runs_matmuls_in_bf16():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with autocast_context("cpu", "bf16"):
        assert (x @ w).dtype == torch.bfloat16
    with autocast_context("cpu", "fp32"):
        assert (x @ w).dtype == torch.float32
