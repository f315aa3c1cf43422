"""pytorch_attention and torch_compile (assignment 3.1, 3.2): tables, a figure and facts.

`build` is the section's report module entry (see `cs336_systems.sections`); the prose
is in `template.md.j2`. Inputs: the attention records (eager and compiled, per
memory cap), the benchmark records of the whole model compiled and vanilla, and the flash
section's table (whose measured memory shows how tiling removes the quadratic term).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336_systems.analysis.attention_memory import eager_attention_bytes
from cs336_systems.lm.attention import attention_label
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.records import read_record
from cs336_systems.report import facts, figures, tables
from cs336_systems.report.render import fmt, fmt_ratio

GIB = 2**30
SHAPE = ["d", "seq"]
PASSES = ("forward", "backward")
METRICS = (["forward_ms_mean", "forward_ms_std", "forward_ms_median", "backward_ms_mean",
            "backward_ms_std", "backward_ms_median", "first_forward_ms", "first_backward_ms",
            "memory_before_backward_gib", "peak_gib", "device_memory_gib", "oom_pass"])
SIZE_ORDER = {name: i for i, name in enumerate(MODEL_SIZES)}


# --- tables ----------------------------------------------------------------------------------

def cap_label(cap) -> str:
    return "uncapped" if pd.isna(cap) else f"{cap:g} GiB cap"


def attention_table(paths: list[str]) -> pd.DataFrame:
    frame = tables.ensure_columns(tables.records_frame(paths),
                           ["memory_cap_gib", "message", *METRICS])
    frame["variant"] = np.where(frame["compile"].astype(bool), "compiled", "eager")
    frame["cap"] = frame["memory_cap_gib"].map(cap_label)
    frame = frame.sort_values(["memory_cap_gib", "d", "seq", "variant"], na_position="first")
    return frame[["variant", "d", "seq", "batch_size", "causal", "warmup_steps", "measure_steps",
                  "memory_cap_gib", "cap", "status", *METRICS, "message", *tables.env_columns(frame)]]


def _cell(row: pd.Series) -> str:
    if row["status"] == "oom":
        return f"oom ({row['oom_pass']})" if pd.notna(row["oom_pass"]) else "oom"
    if row["status"] != "ok":
        return str(row["status"])
    return f"{fmt(row['forward_ms_mean'], 3)} / {fmt(row['backward_ms_mean'], 3)}"


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (d, seq): each variant's forward / backward ms, and the eager run's memory."""
    rows = []
    for (d, seq), group in table.groupby(SHAPE, sort=True):
        row = {"d": d, "seq": seq}
        by_variant = group.set_index("variant")
        for variant in ("eager", "compiled"):
            if variant in by_variant.index:
                row[f"{variant} fwd / bwd ms"] = _cell(by_variant.loc[variant])
        if "eager" in by_variant.index:
            eager = by_variant.loc["eager"]
            row["eager memory before backward GiB"] = fmt(eager["memory_before_backward_gib"], 3)
            row["eager peak GiB"] = fmt(eager["peak_gib"], 3)
        rows.append(row)
    return pd.DataFrame(rows)


def model_table(compiled: list[str], vanilla: list[str]) -> pd.DataFrame:
    """The whole model, compiled and vanilla, one row per record: step times and the first
    (warm-up) step, which holds the compilation."""
    frames = []
    for paths, variant in ((vanilla, "vanilla"), (compiled, "compiled")):
        frame = tables.ensure_columns(tables.records_frame(paths),
                                      ["message", "step_ms_mean", "step_ms_std",
                                                      "step_ms_median", "forward_ms_mean",
                                                      "backward_ms_mean", "optimizer_ms_mean"])
        frame["variant"] = variant
        frame["first_step_ms"] = [_first_step(p) for p in paths]
        frames.append(frame)
    frame = pd.concat(frames, ignore_index=True)
    frame["size_rank"] = frame["size"].map(SIZE_ORDER)
    frame = frame.sort_values(["size_rank", "mode", "variant"]).drop(columns="size_rank")
    keep = ["size", "context_length", "mode", "precision", "warmup_steps", "variant", "status",
            "step_ms_mean", "step_ms_std", "step_ms_median", "forward_ms_mean",
            "backward_ms_mean", "optimizer_ms_mean", "first_step_ms", "message",
            *tables.env_columns(frame)]
    return frame[keep]


def _first_step(path: str) -> float | None:
    metrics = read_record(path)["metrics"]
    samples = metrics.get("step_warmup_ms_samples") or metrics.get("step_ms_samples")
    return samples[0] if samples else None


# --- memory ----------------------------------------------------------------------------------

def loglog_slope(x, y) -> float | None:
    """The exponent b of y ~ x^b, least squares in log space; None with fewer than 2 points."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = (x > 0) & (y > 0) & np.isfinite(y)
    if keep.sum() < 2:
        return None
    return float(np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)[0])


def scaling_facts(ok: pd.DataFrame, column: str, largest: int = 3) -> list[dict]:
    """Per d: the exponent of `column` against sequence length over the `largest` longest
    sequences that ran (where the seq x seq term dominates)."""
    out = []
    for d, group in ok.dropna(subset=[column]).groupby("d"):
        group = group.sort_values("seq").tail(largest)
        slope = loglog_slope(group["seq"], group[column])
        if slope is not None:
            out.append({"d": d, "exponent": slope, "from_seq": group["seq"].min(),
                        "to_seq": group["seq"].max(), "points": len(group)})
    return out


def accounting_facts(eager: pd.DataFrame) -> dict | None:
    """The smallest configuration that ran out of memory, its tensors by the model above, and
    the model checked against the largest configuration that ran under the same cap."""
    oom = eager[eager["status"] == "oom"]
    if oom.empty:
        return None
    first = oom.sort_values(["seq", "d"]).iloc[0]
    parts = eager_attention_bytes(int(first["batch_size"]), int(first["seq"]), int(first["d"]))
    same_cap = eager[(eager["cap"] == first["cap"]) & (eager["status"] == "ok")]
    check = None
    if len(same_cap):
        ran = same_cap.sort_values(["seq", "d"]).iloc[-1]
        model = eager_attention_bytes(int(ran["batch_size"]), int(ran["seq"]), int(ran["d"]))
        check = {"d": ran["d"], "seq": ran["seq"],
                 "before_backward_model_gib": model["before_backward"] / GIB,
                 "before_backward_measured_gib": ran["memory_before_backward_gib"],
                 "peak_model_gib": model["peak"] / GIB, "peak_measured_gib": ran["peak_gib"],
                 # the gap in units of one (batch x seq x seq) matrix
                 "peak_gap_matrices": (ran["peak_gib"] - model["peak"] / GIB)
                 / (model["scores"] / GIB)}
    return {"d": first["d"], "seq": first["seq"], "batch_size": first["batch_size"],
            "cap": first["cap"], "cap_gib": first["memory_cap_gib"], "pass": first["oom_pass"],
            "parts_gib": {k: v / GIB for k, v in parts.items()}, "check": check}


def oom_facts(table: pd.DataFrame) -> list[dict]:
    """Each out-of-memory, with the peak the same configuration reached uncapped: a peak under
    the cap means the allocator's fragmentation, not the tensors, ran out."""
    uncapped = table[table["memory_cap_gib"].isna() & (table["status"] == "ok")]
    peaks = uncapped.set_index(["variant", "d", "seq"])["peak_gib"]
    out = []
    for _, r in table[table["status"] == "oom"].iterrows():
        peak = peaks.get((r["variant"], r["d"], r["seq"]))
        out.append({"cap": r["cap"], "cap_gib": r["memory_cap_gib"], "variant": r["variant"],
                    "d": r["d"], "seq": r["seq"],
                    "pass": r["oom_pass"] if pd.notna(r["oom_pass"]) else None,
                    "uncapped_peak_gib": peak,
                    "under_cap": bool(peak is not None and pd.notna(r["memory_cap_gib"])
                                      and peak < r["memory_cap_gib"])})
    return out


def flash_memory_facts(flash: pd.DataFrame) -> dict | None:
    """From the flash section's table: how peak memory grows with sequence length for our
    FlashAttention-2 against plain PyTorch attention, and their ratio at the longest sequence
    both ran."""
    if flash.empty or "peak_gib" not in flash or flash["peak_gib"].isna().all():
        return None
    ok = flash[(flash["status"] == "ok") & flash["peak_gib"].notna()]
    out = {"batch_size": ok["batch_size"].iloc[0] if len(ok) else None,
           "causal": bool(ok["causal"].iloc[0]) if len(ok) else None, "rows": []}
    for (d, dtype), group in ok.groupby(["d", "precision"]):
        impls = {impl: g.sort_values("seq").set_index("seq")["peak_gib"]
                 for impl, g in group.groupby("attention")}
        if not {"flash-triton", "eager"} <= set(impls):
            continue
        both = sorted(set(impls["flash-triton"].index) & set(impls["eager"].index))
        if len(both) < 2:
            continue
        # what does not grow with the sequence (the benchmark's own buffers): the flash peak
        # at the shortest sequence; the rest is what attention itself holds
        baseline = impls["flash-triton"][both[0]]
        longest = both[-1]
        flash_extra = impls["flash-triton"][longest] - baseline
        eager_extra = impls["eager"][longest] - baseline
        out["rows"].append({
            "d": d, "precision": dtype, "seq": longest, "shortest_seq": both[0],
            "baseline_gib": baseline, "flash_gib": impls["flash-triton"][longest],
            "eager_gib": impls["eager"][longest], "flash_extra_gib": flash_extra,
            "eager_extra_gib": eager_extra,
            "eager_over_flash": eager_extra / flash_extra if flash_extra > 0 else None})
    out["flash_label"] = attention_label("flash-triton")
    return out if out["rows"] else None


def memory_figure(table: pd.DataFrame, path: str) -> None:
    """Memory in use before backward against sequence length (log-log), eager, per d and cap,
    with the fitted exponent."""
    fig, axes = figures.subplots(1, width=6.0)
    ax = axes[0][0]
    eager = table[(table["variant"] == "eager") & (table["status"] == "ok")]
    for (cap, d), group in eager.dropna(subset=["memory_before_backward_gib"]).groupby(
            ["cap", "d"]):
        group = group.sort_values("seq")
        slope = loglog_slope(group["seq"].tail(3), group["memory_before_backward_gib"].tail(3))
        label = f"d = {d}, {cap}" + (f" (slope {slope:.2f})" if slope is not None else "")
        ax.plot(group["seq"], group["memory_before_backward_gib"], marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="sequence length",
           ylabel="memory before backward (GiB)", title="Eager attention: memory saved for backward")
    ax.set_xscale("log", base=2)
    if ax.lines:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no memory readings (CPU run)", ha="center", transform=ax.transAxes)
    figures.save(fig, path)


# --- timing facts ----------------------------------------------------------------------------

def compile_facts(table: pd.DataFrame) -> dict | None:
    """torch_compile (a): compiled against eager attention per shape, forward and backward."""
    ok = table[table["status"] == "ok"]
    first_cap = table["cap"].iloc[0] if len(table) else None  # uncapped where it ran
    ok = ok[ok["cap"] == first_cap]  # a shape once: the capped runs repeat the same work
    pairs = {}
    for (cap, d, seq), group in ok.groupby(["cap", "d", "seq"]):
        by = group.reset_index().set_index("variant")  # `index`: the rows in `ok`
        if {"eager", "compiled"} <= set(by.index):
            pairs[(cap, d, seq)] = by
    if not pairs:
        return None
    out = {"cap": first_cap, "overhead": facts.overhead_rule()}
    # a pass whose time hardly grows with the shape's work (batch x seq^2 x d) measured
    # launches: its pair is counted apart
    work = ok["batch_size"] * ok["seq"].astype(float) ** 2 * ok["d"]
    for p in PASSES:
        flat = facts.overhead_bound(ok, ["variant", "d"], work, f"{p}_ms_mean")
        busy = [by for key, by in pairs.items() if not flat[by["index"]].any()]
        s = [facts.speedup(by.loc["compiled", f"{p}_ms_mean"], by.loc["eager", f"{p}_ms_mean"],
                     by.loc["compiled", f"{p}_ms_std"], by.loc["eager", f"{p}_ms_std"])
             for by in busy]
        ratios = pd.Series([x["ratio"] for x in s if x], dtype=float)
        out[p] = {"median": facts.speedup(1.0, ratios.median()) if len(ratios) else None,
                  "min": ratios.min(), "max": ratios.max(), "shapes": len(ratios),
                  "overhead_bound": len(pairs) - len(busy),
                  "faster": int((ratios > 1).sum()),
                  "within_spread": sum(bool(x and x["within_spread"]) for x in s)}
    # First calls over steady ones. Eager's first call pays the process's one-time start-up
    # (CUDA context, cuBLAS handles); what the compiled one pays beyond that is compilation.
    first = lambda by: (by["first_forward_ms"] - by["forward_ms_median"]
                        + by["first_backward_ms"] - by["backward_ms_median"])
    extra = pd.Series([first(by.loc["compiled"]) - first(by.loc["eager"])
                       for by in pairs.values()])
    startup = pd.Series([first(by.loc["eager"]) for by in pairs.values()])
    out["compile_ms"] = {"median": extra.median(), "min": extra.min(), "max": extra.max(),
                         # shapes where the difference came out below zero, which no
                         # compilation costs: the first calls' other costs varied more
                         "negative": int((extra < 0).sum()), "shapes": len(extra),
                         "eager_first_median": startup.median(), "eager_first_std": startup.std(),
                         # not resolved when it is smaller than how much eager's first calls vary
                         "resolved": bool(abs(extra.median()) > startup.std())}
    return out


def model_compile_facts(models: pd.DataFrame) -> list[dict]:
    """torch_compile (b): per size and mode, the compiled model against vanilla."""
    out = []
    ok = models[models["status"] == "ok"]
    for (size, mode), group in ok.groupby(["size", "mode"], sort=False):
        by = group.set_index("variant")
        if not {"vanilla", "compiled"} <= set(by.index):
            continue
        v, c = by.loc["vanilla"], by.loc["compiled"]
        out.append({"size": size, "mode": mode, "vanilla_ms": v["step_ms_mean"],
                    "vanilla_std": v["step_ms_std"], "compiled_ms": c["step_ms_mean"],
                    "compiled_std": c["step_ms_std"],
                    "speedup": facts.speedup(c["step_ms_mean"], v["step_ms_mean"], c["step_ms_std"],
                                       v["step_ms_std"]),
                    # the compiled first step's extra time beyond vanilla's (start-up in both)
                    "compile_ms": (c["first_step_ms"] - c["step_ms_median"])
                    - (v["first_step_ms"] - v["step_ms_median"])})
    return sorted(out, key=lambda r: (SIZE_ORDER[r["size"]], r["mode"]))


def model_compile_display(rows: list[dict]) -> pd.DataFrame:
    """One row per size and mode: vanilla and compiled step times, compiled's speed-up (`*`:
    inside the two times' spread) and the compilation the first step paid."""
    return pd.DataFrame([{
        "size": r["size"], "mode": r["mode"],
        "vanilla ms": tables.mean_pm_std(r["vanilla_ms"], r["vanilla_std"]),
        "compiled ms": tables.mean_pm_std(r["compiled_ms"], r["compiled_std"]),
        "compiled speed-up": fmt_ratio(r["speedup"]["ratio"])
        + (" *" if r["speedup"]["within_spread"] else ""),
        "compilation s": fmt(r["compile_ms"] / 1000, 1)} for r in rows])


def model_compile_summary(rows: list[dict]) -> dict:
    """Per mode: the range of compiled's speed-ups, how many are faster beyond the spread,
    slower beyond it, or ties, and the range of the compilation's seconds."""
    out = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        ratios = [r["speedup"]["ratio"] for r in mine]
        ties = [r for r in mine if r["speedup"]["within_spread"]]
        out[mode] = {"sizes": len(mine), "min": min(ratios), "max": max(ratios),
                     "faster": sum(r["speedup"]["ratio"] > 1 and not r["speedup"]["within_spread"]
                                   for r in mine),
                     "slower": sum(r["speedup"]["ratio"] < 1 and not r["speedup"]["within_spread"]
                                   for r in mine),
                     "ties": len(ties),
                     "compile_s_min": min(r["compile_ms"] for r in mine) / 1000,
                     "compile_s_max": max(r["compile_ms"] for r in mine) / 1000}
    return out


# --- the section -----------------------------------------------------------------------------

def _left_out(table: pd.DataFrame, models: pd.DataFrame, assignment: dict) -> tuple[str, str]:
    """What of the full matrix (the config's defaults) this preset leaves out: of the
    attention sweep, and of the sweep plus the whole-model sizes."""
    sweep = facts.not_in_preset({"d": (assignment["d_heads"], table["d"]),
                           "seq": (assignment["seq_lengths"], table["seq"])},
                          lead="not in this preset's sweep")
    sizes = facts.not_in_preset({"sizes": (assignment["model_compile"]["sizes"], models["size"])},
                          lead="whole model")
    return sweep, "; ".join(filter(None, [sweep, sizes]))


def timing_range(ok: pd.DataFrame) -> dict | None:
    """The eager sweep's fastest and slowest shape per pass, and backward over forward."""
    if ok.empty:
        return None
    out = {}
    for p in PASSES:
        timed = ok.dropna(subset=[f"{p}_ms_mean"])
        lo = timed.loc[timed[f"{p}_ms_mean"].idxmin()]
        hi = timed.loc[timed[f"{p}_ms_mean"].idxmax()]
        out[p] = {"min": lo[f"{p}_ms_mean"], "min_d": lo["d"], "min_seq": lo["seq"],
                  "max": hi[f"{p}_ms_mean"], "max_d": hi["d"], "max_seq": hi["seq"]}
    ratio = (ok["backward_ms_mean"] / ok["forward_ms_mean"]).dropna()
    out["backward_over_forward"] = {"min": ratio.min(), "max": ratio.max()}
    return out


def growth_word(scaling: list[dict]) -> str | None:
    """How memory before backward grows with seq, from the fitted exponents: 'nearly
    quadratically' where every one is within 0.2 of 2, else their range's words."""
    if not scaling:
        return None
    exponents = [s["exponent"] for s in scaling]
    if all(abs(b - 2) <= 0.2 for b in exponents):
        return "nearly quadratically"
    if all(abs(b - 1) <= 0.2 for b in exponents):
        return "nearly linearly"
    return "faster than linearly, slower than quadratically" if all(1 < b < 2 for b in exponents) \
        else "neither linearly nor quadratically"


def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    """Records -> outputs (the attention table, the whole-model table, the memory figure) and
    the section's facts. options: assignment, the attention part of the full matrix."""
    table = attention_table(records["records"])
    models = model_table(records["compiled_model"], records["vanilla_model"])
    flash = tables.read_table(records["flash_table"][0])
    tables.write_table(table, outputs["table"])
    tables.write_table(models, outputs["model_table"])
    memory_figure(table, outputs["memory_figure"])

    eager = table[table["variant"] == "eager"]
    eager_ok = eager[eager["status"] == "ok"]
    first = table.iloc[0] if len(table) else None
    sweep_missing, compile_missing = _left_out(table, models, options["assignment"])
    uncapped = eager_ok[eager_ok["cap"] == "uncapped"] if (eager_ok["cap"] == "uncapped").any() \
        else eager_ok
    scaling = scaling_facts(uncapped, "memory_before_backward_gib")
    model_compile = model_compile_facts(models)
    return {
        "env": tables.env_summary(table, models),
        "coverage": {
            "pytorch_attention": facts.covered(eager, missing=sweep_missing,
                                               anchor="pytorch_attention"),
            "torch_compile": facts.covered(
                pd.concat([table[table["variant"] == "compiled"], models]),
                missing=compile_missing, anchor="torch_compile"),
        },
        "setup": None if first is None else {
            "batch_size": first["batch_size"], "causal": bool(first["causal"]),
            "warmup_steps": first["warmup_steps"], "measure_steps": first["measure_steps"],
            "caps": list(dict.fromkeys(table["cap"]))},
        "on_cuda": bool("env_device" in table and (table["env_device"] == "cuda").any()),
        "tables": [{"cap": cap, "table": tables.to_markdown(display_table(group))}
                   for cap, group in table.groupby("cap", sort=False)],
        "oom": oom_facts(table),
        "failures": [f for f in facts.not_ok(table, ["variant", "d", "seq", "cap"])
                     if f["status"] != "oom"],
        "accounting": accounting_facts(eager),
        "scaling": scaling,
        "growth": growth_word(scaling),
        "timing": timing_range(uncapped),
        "flash_memory": flash_memory_facts(flash),
        "compile": compile_facts(table),
        "model_compile": model_compile,
        "model_compile_table": tables.to_markdown(model_compile_display(model_compile))
        if model_compile else "",
        "model_compile_summary": model_compile_summary(model_compile),
        "memory_figure": outputs["memory_figure"],
    }
