"""Mixed precision at small scale (assignment 1.3, 1.4 (a), (b)): what rounding does to a sum,
which dtypes autocast gives a toy model's tensors, and where LayerNorm loses precision.

    accumulate("fp16", "fp16")                     the assignment's loop: 1000 x (s += 0.01)
    toy_model_dtypes("fp16", device)               dtypes read off real tensors with hooks
    layernorm_errors(activations(...), "bf16")     LayerNorm in a dtype against fp64

Dtypes are named as in `timing.PRECISIONS`; errors are measured in float64.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from cs336_systems.lm.precision import PRECISIONS, autocast_context

# mixed_precision_accumulation: (accumulator, value, cast the value up to the accumulator first)
ACCUMULATION_LOOPS: tuple[tuple[str, str, bool], ...] = (
    ("fp32", "fp32", False), ("fp16", "fp16", False), ("fp32", "fp16", False),
    ("fp32", "fp16", True))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def spacing(value: torch.Tensor) -> float:
    """Distance from `value` to the next representable number of its dtype, upward (on the CPU,
    whose nextafter takes every dtype)."""
    value = value.detach().cpu()
    up = torch.nextafter(value, torch.full_like(value, math.inf))
    return (up.double() - value.double()).item()


# --- 1.3: accumulation -----------------------------------------------------------------------

def accumulate(accumulator: str, value: str, cast_up: bool = False, steps: int = 1000,
               increment: float = 0.01, device: torch.device | str = "cpu") -> torch.Tensor:
    """The assignment's loop: s = 0 in `accumulator`; `steps` times s += increment in `value`
    (cast to `accumulator` first with `cast_up`). A 0-dim tensor of the accumulator's dtype."""
    s = torch.tensor(0, dtype=PRECISIONS[accumulator], device=device)
    for _ in range(steps):
        x = torch.tensor(increment, dtype=PRECISIONS[value], device=device)
        s += x.type(PRECISIONS[accumulator]) if cast_up else x
    return s


def accumulation_loop(accumulator: str, value: str, cast_up: bool, steps: int,
                      increment: float, device: torch.device | str) -> dict:
    """One loop's result and its error against steps * increment, split in two (float64):
    value_error, from 0.01 itself being rounded to `value` (steps * (stored - increment)), and
    accumulation_error, from rounding each partial sum (result - steps * stored)."""
    s = accumulate(accumulator, value, cast_up, steps, increment, device)
    stored = torch.tensor(increment, dtype=PRECISIONS[value]).double().item()
    result = s.double().item()
    return {"accumulator": accumulator, "value": value, "cast_up": cast_up,
            "result_dtype": dtype_name(s.dtype), "result": result,
            "exact": steps * increment, "error": result - steps * increment,
            "stored_value": stored, "value_error": steps * (stored - increment),
            "accumulation_error": result - steps * stored,
            "spacing_at_result": spacing(s)}


# --- 1.4 (a): the toy model under autocast ---------------------------------------------------

class ToyModel(nn.Module):
    """The assignment's toy model: fc1 -> ReLU -> LayerNorm -> fc2, no biases."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        x = self.fc2(x)
        return x


def toy_model_dtypes(precision: str, device: torch.device | str, batch_size: int = 8,
                     in_features: int = 20, out_features: int = 5, seed: int = 0) -> dict:
    """One forward (with cross-entropy) under `autocast_context(device, precision)` and one
    backward outside it; the dtype of each tensor, read where it is made: forward hooks on
    fc1, ln and fc2, the parameters from a forward pre-hook (inside autocast), the gradients
    from post-accumulate-grad hooks. Also whether autocast was on, its dtype and any warning
    made entering it (a device that does not support the dtype warns and disables it)."""
    device = torch.device(device)
    torch.manual_seed(seed)
    model = ToyModel(in_features, out_features).to(device)
    x = torch.randn(batch_size, in_features, device=device)   # (batch, in_features)
    targets = torch.randint(out_features, (batch_size,), device=device)
    seen: dict[str, str] = {}
    gradients: dict[str, str] = {}

    def read_parameters(module, args):
        for name, p in module.named_parameters():
            seen[f"parameter {name}"] = dtype_name(p.dtype)

    def read(name):
        def hook(module, args, output):
            seen[f"{name} input"] = dtype_name(args[0].dtype)
            seen[f"{name} output"] = dtype_name(output.dtype)
        return hook

    hooks = [model.register_forward_pre_hook(read_parameters)]
    hooks += [getattr(model, n).register_forward_hook(read(n)) for n in ("fc1", "ln", "fc2")]
    for name, p in model.named_parameters():
        hooks.append(p.register_post_accumulate_grad_hook(
            lambda p, name=name: gradients.__setitem__(name, dtype_name(p.grad.dtype))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        context = autocast_context(device, precision)
        with context:
            enabled = torch.is_autocast_enabled(device.type)
            autocast_dtype = dtype_name(torch.get_autocast_dtype(device.type))
            logits = model(x)                                   # (batch, out_features)
            loss = F.cross_entropy(logits, targets)
    loss.backward()
    for hook in hooks:
        hook.remove()
    parameters = [v for k, v in seen.items() if k.startswith("parameter ")]
    return {
        "autocast_enabled": enabled, "autocast_dtype": autocast_dtype,
        "autocast_warnings": [str(w.message) for w in caught],
        "dtypes": {"parameters": " / ".join(sorted(set(parameters))),
                   "fc1 output": seen["fc1 output"], "LayerNorm input": seen["ln input"],
                   "LayerNorm output": seen["ln output"], "logits": seen["fc2 output"],
                   "loss": dtype_name(loss.dtype),
                   "gradients": " / ".join(sorted(set(gradients.values())))},
        "parameter_dtypes": {k.removeprefix("parameter "): v for k, v in seen.items()
                             if k.startswith("parameter ")},
        "gradient_dtypes": gradients,
    }


# --- 1.4 (b): LayerNorm's precision ----------------------------------------------------------

LAYERNORM_METHODS = {
    "one-pass": "one-pass, E[x²] − E[x]²",
    "two-pass": "two-pass, mean((x − μ)²)",
    "torch": "F.layer_norm",
    "torch-fp32": "F.layer_norm in fp32 (input upcast)",
}


def activations(rows: int, width: int, offset: float, std_min: float, std_max: float,
                device: torch.device | str = "cpu", seed: int = 0) -> torch.Tensor:
    """(rows, width) float64: each row offset + std * N(0, 1), its std log-uniform in
    [std_min, std_max]: a common offset over a wide range of spreads."""
    g = torch.Generator().manual_seed(seed)
    log_std = torch.empty(rows, 1, dtype=torch.float64).uniform_(
        math.log(std_min), math.log(std_max), generator=g)
    z = torch.randn(rows, width, dtype=torch.float64, generator=g)
    return (offset + log_std.exp() * z).to(device)


def layer_norm_one_pass(x: torch.Tensor, eps: float) -> dict[str, torch.Tensor]:
    """In x's dtype: mean, var = E[x²] - E[x]², out = (x - mean) / sqrt(var + eps)."""
    squares = x * x                                             # (rows, width)
    mean = x.mean(-1, keepdim=True)                             # (rows, 1)
    var = squares.mean(-1, keepdim=True) - mean * mean          # (rows, 1)
    return {"squares": squares, "mean": mean, "var": var,
            "out": (x - mean) / torch.sqrt(var + eps)}


def layer_norm_two_pass(x: torch.Tensor, eps: float) -> dict[str, torch.Tensor]:
    """In x's dtype: mean, then var = mean((x - mean)²)."""
    mean = x.mean(-1, keepdim=True)
    squares = (x - mean) ** 2
    var = squares.mean(-1, keepdim=True)
    return {"squares": squares, "mean": mean, "var": var,
            "out": (x - mean) / torch.sqrt(var + eps)}


def layer_norm_torch(x: torch.Tensor, eps: float) -> dict[str, torch.Tensor]:
    """torch's kernel: `torch.native_layer_norm`, the op F.layer_norm runs, which also returns
    the mean and 1 / sqrt(var + eps) it computed."""
    out, mean, rstd = torch.native_layer_norm(x, x.shape[-1:], None, None, eps)
    return {"mean": mean, "var": rstd.double() ** -2 - eps, "out": out}


def _finite(t: torch.Tensor) -> torch.Tensor:
    return t[torch.isfinite(t)]


def _stat(t: torch.Tensor, how: str) -> float | None:
    t = _finite(t)
    if t.numel() == 0:
        return None
    return {"max": t.max, "median": t.median, "mean": t.mean}[how]().item()


def errors(stats: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict:
    """A LayerNorm's statistics and output against the fp64 reference. The mean's error is in
    units of the row's std (how far it shifts the output); the variance's is relative. Squares
    that overflowed and negative variances are counted where a method forms them (not torch's
    kernel, whose variance is only seen through 1 / sqrt(var + eps))."""
    mean, var, out = (stats[k].double() for k in ("mean", "var", "out"))
    sigma = reference["var"].sqrt()
    squares = stats.get("squares")
    return {
        "squares_inf": None if squares is None else int(torch.isinf(squares).sum()),
        "var_negative": None if squares is None else int((var < 0).sum()),
        "mean_err_std_max": _stat((mean - reference["mean"]).abs() / sigma, "max"),
        "var_rel_err_median": _stat((var - reference["var"]).abs() / reference["var"], "median"),
        "var_rel_err_max": _stat((var - reference["var"]).abs() / reference["var"], "max"),
        "out_abs_err_mean": _stat((out - reference["out"]).abs(), "mean"),
        "out_abs_err_max": _stat((out - reference["out"]).abs(), "max"),
        "out_nonfinite": int((~torch.isfinite(out)).sum()),
        "outputs": out.numel(),
    }


def layernorm_errors(x: torch.Tensor, precision: str, eps: float = 1e-5) -> list[dict]:
    """LayerNorm of the float64 activations `x` rounded to `precision`, each method of
    LAYERNORM_METHODS (the fp32 upcast only for a narrower dtype), against two-pass LayerNorm
    of `x` itself in float64."""
    reference = layer_norm_two_pass(x, eps)
    xd = x.to(PRECISIONS[precision])
    runs = {"one-pass": layer_norm_one_pass(xd, eps), "two-pass": layer_norm_two_pass(xd, eps),
            "torch": layer_norm_torch(xd, eps)}
    if xd.dtype != torch.float32:
        runs["torch-fp32"] = layer_norm_torch(xd.float(), eps)
    return [{"dtype": precision, "method": m, **errors(s, reference)} for m, s in runs.items()]


def rounded_input(x: torch.Tensor, precision: str) -> dict:
    """What storing `x` in `precision` does before any LayerNorm: the spacing of representable
    numbers at its mean magnitude, and the rows whose sum, or mean, is inf in that dtype."""
    xd = x.to(PRECISIONS[precision])
    level = x.abs().mean().to(xd.dtype)
    finfo = torch.finfo(xd.dtype)
    return {"dtype": precision, "dtype_max": finfo.max, "square_overflows_above": finfo.max**0.5,
            "significant_bits": round(-math.log2(finfo.eps)) + 1,
            "magnitude": level.double().item(), "spacing": spacing(level),
            "largest_abs": x.abs().max().item(),
            "row_sums_inf": int(torch.isinf(xd.sum(-1)).sum()),
            "row_means_inf": int(torch.isinf(xd.mean(-1)).sum()), "rows": x.shape[0]}
