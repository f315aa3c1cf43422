"""The mixed-precision library and its CLI on the CPU: the accumulation loops against an
independent IEEE simulation, the toy model's dtypes against the tensors themselves, LayerNorm's
errors against float64 on fresh random activations."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cs336_systems.analysis import mixed_precision as mp
from cs336_systems.sections.mixed_precision import run_study as experiment


def _simulate(accumulator, value, increment, steps):
    """The loop in numpy scalars: each addition rounded to the accumulator's type."""
    s, x = accumulator(0), value(increment)
    for _ in range(steps):
        s = accumulator(s + accumulator(x))
    return float(s)


def _increment():
    return 0.005 + 0.01 * torch.rand(()).item()  # fresh per test, never a round number


def test_each_loop_is_the_ieee_sum_of_its_dtypes():
    increment, steps = _increment(), 500
    expected = {("fp32", "fp32"): _simulate(np.float32, np.float32, increment, steps),
                ("fp16", "fp16"): _simulate(np.float16, np.float16, increment, steps),
                ("fp32", "fp16"): _simulate(np.float32, np.float16, increment, steps)}
    for accumulator, value, cast_up in mp.ACCUMULATION_LOOPS:
        s = mp.accumulate(accumulator, value, cast_up, steps, increment)
        assert s.dtype == mp.PRECISIONS[accumulator]
        assert s.item() == expected[(accumulator, value)]


def test_fp16_accumulation_loses_far_more_than_fp32():
    increment = _increment()
    loops = {(a, v, c): mp.accumulation_loop(a, v, c, 1000, increment, "cpu")
             for a, v, c in mp.ACCUMULATION_LOOPS}
    fp32 = loops[("fp32", "fp32", False)]
    fp16 = loops[("fp16", "fp16", False)]
    assert 0 < abs(fp32["error"]) < 1e-3  # small, but not exact
    assert abs(fp16["error"]) > 100 * abs(fp32["error"])
    assert fp16["spacing_at_result"] > 1000 * fp32["spacing_at_result"]
    for loop in loops.values():  # the two parts add up to the error
        assert loop["value_error"] + loop["accumulation_error"] == pytest.approx(loop["error"])
    # the fp16 value in an fp32 accumulator: casting it up first changes nothing
    assert loops[("fp32", "fp16", True)]["result"] == loops[("fp32", "fp16", False)]["result"]


def test_spacing_is_the_gap_to_the_next_number():
    assert mp.spacing(torch.tensor(10.0, dtype=torch.float16)) == 2**-7
    assert mp.spacing(torch.tensor(300.0, dtype=torch.bfloat16)) == 2.0
    assert mp.spacing(torch.tensor(300.0, dtype=torch.float16)) == 0.25


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_toy_model_dtypes_are_those_of_the_real_tensors(precision):
    batch, d_in, d_out, seed = 6, 12, 3, int(torch.randint(1000, ()))
    got = mp.toy_model_dtypes(precision, "cpu", batch, d_in, d_out, seed)
    # the same forward by hand, under the same autocast
    torch.manual_seed(seed)
    model = mp.ToyModel(d_in, d_out)
    x = torch.randn(batch, d_in)
    targets = torch.randint(d_out, (batch,))
    with torch.autocast("cpu", dtype=mp.PRECISIONS[precision]):
        first = model.fc1(x)
        h = model.relu(first)
        normed = model.ln(h)
        logits = model.fc2(normed)
        loss = F.cross_entropy(logits, targets)
    loss.backward()
    name = mp.dtype_name
    assert got["dtypes"] == {
        "parameters": name(model.fc1.weight.dtype), "fc1 output": name(first.dtype),
        "LayerNorm input": name(h.dtype),
        "LayerNorm output": name(normed.dtype), "logits": name(logits.dtype),
        "loss": name(loss.dtype), "gradients": name(model.fc2.weight.grad.dtype)}
    assert got["autocast_enabled"] and got["autocast_dtype"] == name(mp.PRECISIONS[precision])
    assert got["dtypes"]["fc1 output"] == name(mp.PRECISIONS[precision])  # autocast applied
    assert set(got["gradient_dtypes"]) == {"fc1.weight", "ln.weight", "ln.bias", "fc2.weight"}


def test_fp32_means_no_autocast():
    got = mp.toy_model_dtypes("fp32", "cpu")
    assert not got["autocast_enabled"]
    assert set(got["dtypes"].values()) == {"float32"}


def test_an_unsupported_autocast_dtype_is_recorded_with_its_warning(monkeypatch):
    monkeypatch.setattr(mp, "autocast_context",
                        lambda device, precision: torch.autocast("cpu", dtype=torch.float64))
    got = mp.toy_model_dtypes("fp16", "cpu")
    assert not got["autocast_enabled"]
    assert any("not supported" in w for w in got["autocast_warnings"])
    assert got["dtypes"]["fc1 output"] == "float32"


def _activations(offset, rows=64, width=512):
    return mp.activations(rows, width, offset, 0.1, 10.0, seed=int(torch.randint(1000, ())))


def _by_method(rows, dtype):
    return {r["method"]: r for r in rows if r["dtype"] == dtype}


def test_activations_have_the_offset_and_the_range_of_spreads():
    x = _activations(300.0, rows=256)
    std = x.std(-1)
    assert x.dtype == torch.float64 and x.shape == (256, 512)
    assert x.mean().item() == pytest.approx(300.0, abs=0.5)
    assert 0.08 < std.min().item() < 0.3 and 3 < std.max().item() < 12


def test_the_reference_is_layer_norm_in_float64():
    x = _activations(300.0)
    ref = mp.layer_norm_two_pass(x, 1e-5)["out"]
    assert torch.allclose(ref, F.layer_norm(x, x.shape[-1:], eps=1e-5), atol=1e-9)
    torch_stats = mp.layer_norm_torch(x, 1e-5)
    assert torch.allclose(torch_stats["var"], x.var(-1, unbiased=False, keepdim=True), rtol=1e-9)


def test_fp16_squares_overflow_at_a_large_offset_and_bf16_does_not():
    x = _activations(300.0)
    fp16, bf16 = _by_method(mp.layernorm_errors(x, "fp16"), "fp16"), \
        _by_method(mp.layernorm_errors(x, "bf16"), "bf16")
    assert fp16["one-pass"]["squares_inf"] == x.numel()  # every value is above 255.9
    assert fp16["one-pass"]["out_nonfinite"] == x.numel()
    assert fp16["two-pass"]["squares_inf"] == 0 and fp16["two-pass"]["out_nonfinite"] == 0
    assert fp16["torch"]["out_nonfinite"] == 0
    assert bf16["one-pass"]["squares_inf"] == 0
    # bf16's 8 significant bits: the input's rounding costs it more than fp16
    assert bf16["torch"]["out_abs_err_mean"] > 2 * fp16["torch"]["out_abs_err_mean"]
    inputs = {p: mp.rounded_input(x, p) for p in ("fp16", "bf16", "fp32")}
    assert inputs["fp16"]["row_sums_inf"] == x.shape[0] and inputs["fp16"]["row_means_inf"] == 0
    assert (inputs["fp16"]["spacing"], inputs["bf16"]["spacing"]) == (0.25, 2.0)
    assert [inputs[p]["significant_bits"] for p in ("fp16", "bf16", "fp32")] == [11, 8, 24]


def test_one_pass_variance_cancels_even_in_fp32():
    fp32 = _by_method(mp.layernorm_errors(_activations(300.0), "fp32"), "fp32")
    assert fp32["one-pass"]["out_abs_err_max"] > 1000 * fp32["two-pass"]["out_abs_err_max"]
    assert fp32["two-pass"]["out_abs_err_max"] < 1e-2
    assert "torch-fp32" not in fp32  # no upcast of what is fp32 already


def test_without_an_offset_every_dtype_is_finite_and_close():
    x = _activations(0.0)
    for precision, bound in (("fp16", 0.02), ("bf16", 0.1), ("fp32", 1e-5)):
        for method, row in _by_method(mp.layernorm_errors(x, precision), precision).items():
            assert row["out_nonfinite"] == 0, (precision, method)
            assert 0 < row["out_abs_err_max"] < bound, (precision, method)


def _run(tmp_path, *args):
    out = tmp_path / "r.json"
    experiment.main([*args, "--device", "cpu", "--output", str(out)])
    return json.loads(out.read_text())


def test_each_part_writes_one_record_of_its_own_options(tmp_path):
    record = _run(tmp_path, "--part", "accumulation", "--steps", "200")
    assert record["status"] == "ok" and record["section"] == "mixed_precision"
    assert record["config"] == {"part": "accumulation", "steps": 200, "increment": 0.01,
                                "seed": 0}
    assert len(record["metrics"]["loops"]) == 4
    record = _run(tmp_path, "--part", "toy-model", "--precision", "bf16")
    assert record["metrics"]["dtypes"]["logits"] == "bfloat16"
    record = _run(tmp_path, "--part", "layernorm", "--rows", "8", "--width", "300",
                  "--offsets", "0", "300")
    methods = record["metrics"]["methods"]
    assert {(r["offset"], r["dtype"]) for r in methods} == {
        (o, p) for o in (0.0, 300.0) for p in ("fp32", "bf16", "fp16")}
    assert len(methods) == 2 * (4 + 4 + 3) and len(record["metrics"]["inputs"]) == 6


def test_a_cuda_job_without_cuda_is_skipped(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "r.json"
    experiment.main(["--part", "toy-model", "--device", "cuda", "--output", str(out)])
    record = json.loads(out.read_text())
    assert record["status"] == "skipped" and "no CUDA device" in record["message"]


def test_bad_spreads_are_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        experiment.main(["--part", "layernorm", "--std-min", "5", "--std-max", "1",
                         "--output", str(tmp_path / "r.json")])
    assert "--std-min (5.0) must not exceed --std-max (1.0)" in capsys.readouterr().err
