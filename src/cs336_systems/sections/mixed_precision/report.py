"""mixed_precision_accumulation and benchmarking_mixed_precision (assignment 1.3, 1.4): tables,
a figure and facts.

`build` is the section's report module entry (see `cs336_systems.sections`); the prose
is in `template.md.j2`. Inputs: the accumulation record, one toy-model record
per autocast dtype, the LayerNorm record, and the benchmark's main-sweep records in fp32 and
bf16 (part (c): bf16 autocast against fp32, every size).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cs336_systems.analysis.mixed_precision import LAYERNORM_METHODS
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.sizes import size_label
from cs336_systems.lm.step import MODES
from cs336_systems.records import read_record
from cs336_systems.report import facts, figures
from cs336_systems.report.render import fmt_ratio
from cs336_systems.report.tables import (
    ensure_columns,
    env_summary,
    long_table,
    mean_pm_std,
    records_frame,
    to_markdown,
    write_table,
)

SIZE_ORDER = {name: i for i, name in enumerate(MODEL_SIZES)}
PHASES = ("step", "forward", "backward")


def _ok_metrics(path: str) -> tuple[dict, dict | None]:
    """A record, and its metrics if it ran (None otherwise)."""
    record = read_record(path)
    return record, record["metrics"] if record["status"] == "ok" else None


def _config(paths: list[str]) -> dict | None:
    return read_record(paths[0])["config"] if paths else None


def _not_measured(record: dict) -> dict:
    return {"status": record["status"], "reason": facts.reason(record.get("message"))}


# --- 1.3: accumulation -----------------------------------------------------------------------

def loop_label(loop: dict) -> str:
    cast = f" cast to {loop['accumulator']}" if loop["cast_up"] else ""
    return f"{loop['accumulator']} += {loop['value']}{cast}"


def accumulation_facts(path: str) -> tuple[pd.DataFrame, dict]:
    """The four loops: a table, and per loop its error split into the value's rounding and the
    partial sums' rounding, the larger of the two named, and any earlier loop it equals."""
    record, metrics = _ok_metrics(path)
    if metrics is None:
        return pd.DataFrame(), {"measured": False, **_not_measured(record)}
    loops = []
    for loop in metrics["loops"]:
        same = [x["label"] for x in loops if x["result"] == loop["result"]]
        value, summed = abs(loop["value_error"]), abs(loop["accumulation_error"])
        loops.append({**loop, "label": loop_label(loop), "same_as": same[0] if same else None,
                      "accumulation_exact": loop["accumulation_error"] == 0,
                      "spacing_pct_of_increment": 100 * loop["spacing_at_result"]
                      / record["config"]["increment"],
                      "larger_source": "the partial sums' rounding" if summed > value
                      else "the rounding of the value itself"})
    smallest = min(abs(x["error"]) for x in loops)
    for loop in loops:
        loop["times_smallest"] = abs(loop["error"]) / smallest if smallest else None
    table = pd.DataFrame(loops)[["label", "accumulator", "value", "cast_up", "result_dtype",
                                 "result", "exact", "error", "stored_value", "value_error",
                                 "accumulation_error", "spacing_at_result"]]
    display = pd.DataFrame({
        "loop": table["label"], "result": table["result"].map(lambda v: f"{v:.8g}"),
        "error": table["error"].map(lambda v: f"{v:.3g}"),
        f"{record['config']['increment']:g} as stored":
            table["stored_value"].map(lambda v: f"{v:.8g}"),
        "error from the stored value": table["value_error"].map(lambda v: f"{v:.3g}"),
        "error from the partial sums": table["accumulation_error"].map(lambda v: f"{v:.3g}"),
        "spacing at the result": table["spacing_at_result"].map(lambda v: f"{v:.3g}"),
    })
    worst = max(loops, key=lambda x: abs(x["error"]))
    best = min(loops, key=lambda x: abs(x["error"]))
    return table, {"measured": True, "steps": record["config"]["steps"],
                   "increment": record["config"]["increment"], "device": record["env"]["device"],
                   "exact": loops[0]["exact"], "loops": loops, "largest": worst["label"],
                   "smallest": best["label"], "table": to_markdown(display),
                   # the worst loop is the one whose accumulator is narrowest
                   "narrow_accumulator_worst": all(
                       worst["spacing_at_result"] > x["spacing_at_result"]
                       for x in loops if x["accumulator"] != worst["accumulator"])}


# --- 1.4 (a): the toy model's dtypes ---------------------------------------------------------

TOY_ROWS = ("parameters", "fc1 output", "LayerNorm input", "LayerNorm output", "logits", "loss",
            "gradients")


def toy_model_facts(paths: list[str]) -> tuple[pd.DataFrame, dict]:
    """One column per autocast run: the dtype of each tensor, whether autocast was on, and
    where LayerNorm's output dtype differs from the linear layers'."""
    runs, skipped, columns = [], [], {}
    for path in paths:
        record, metrics = _ok_metrics(path)
        precision = record["config"]["precision"]
        if metrics is None:
            skipped.append({"precision": precision, **_not_measured(record)})
            continue
        d = metrics["dtypes"]
        runs.append({
            "precision": precision, "device": record["env"]["device"],
            "torch": record["env"]["torch"], "enabled": metrics["autocast_enabled"],
            "autocast_dtype": metrics["autocast_dtype"], "warnings": metrics["autocast_warnings"],
            "dtypes": d,
            # autocast ran LayerNorm unlike the linear layers: its output's dtype is not fc1's
            "ln_differs": d["LayerNorm output"] != d["fc1 output"],
            "ln_upcast": d["LayerNorm output"] != d["LayerNorm input"]})
        columns[f"{precision} autocast, {record['env']['device']}"] = (
            [d[row] for row in TOY_ROWS] + [str(metrics["autocast_enabled"]).lower(),
                                             metrics["autocast_dtype"]])
    index = [*TOY_ROWS, "autocast enabled", "autocast dtype"]
    table = pd.DataFrame(columns, index=index).rename_axis("tensor").reset_index()
    devices = sorted({r["device"] for r in runs})
    cpu_fp16 = next((r for r in runs if (r["device"], r["precision"]) == ("cpu", "fp16")), None)
    return table, {"runs": runs, "skipped": skipped, "devices": devices,
                   # where autocast was measured running LayerNorm in a wider dtype than its input
                   "upcast_devices": sorted({r["device"] for r in runs if r["ln_upcast"]}),
                   "on_cuda": devices == ["cuda"], "config": _config(paths),
                   # what asking for fp16 autocast on a CPU did with this torch
                   "cpu_fp16": None if cpu_fp16 is None else {
                       "enabled": cpu_fp16["enabled"], "warnings": cpu_fp16["warnings"],
                       "torch": cpu_fp16["torch"],
                       "works": cpu_fp16["enabled"] and cpu_fp16["autocast_dtype"] == "float16"
                       and cpu_fp16["dtypes"]["fc1 output"] == "float16"},
                   "table": to_markdown(table) if runs else ""}


# --- 1.4 (b): LayerNorm ----------------------------------------------------------------------

METHOD_HOW = {
    "one-pass": "the variance as E[x²] − E[x]², in the dtype",
    "two-pass": "the mean first, then mean((x − μ)²), in the dtype",
    "torch": "torch's kernel on the dtype's tensor (its mean and 1/σ read from "
             "`torch.native_layer_norm`)",
    "torch-fp32": "the rounded input cast up to fp32 first, then torch's kernel (what autocast "
                  "does where it runs LayerNorm in fp32: see (a))",
}
LAYERNORM_COLUMNS = {
    "squares_inf": "squares → inf", "var_negative": "rows var < 0",
    "mean_err_std_max": "mean error / σ, max", "var_rel_err_median": "var rel. error, median",
    "var_rel_err_max": "var rel. error, max", "out_abs_err_mean": "output error, mean",
    "out_abs_err_max": "output error, max", "out_nonfinite": "outputs inf/nan"}


def _count(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and np.isnan(v)) else str(int(v))


def layernorm_display(rows: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"dtype": rows["dtype"], "method": rows["method"].map(LAYERNORM_METHODS)})
    for key, name in LAYERNORM_COLUMNS.items():
        if key in ("squares_inf", "var_negative", "out_nonfinite"):
            out[name] = rows[key].map(_count)
        else:
            out[name] = rows[key].map(lambda v: "" if pd.isna(v) else f"{v:.3g}")
    return out


def _compare(a: float | None, b: float | None) -> dict | None:
    """a against b, two errors: the factor and 'larger' / 'smaller' / 'the same'."""
    if a is None or b is None or pd.isna(a) or pd.isna(b) or b == 0:
        return None
    return {"ratio": a / b, "factor": max(a / b, b / a) if a else None,
            "word": "larger" if a > b else "smaller" if a < b else "the same"}


def layernorm_facts(path: str) -> tuple[pd.DataFrame, dict]:
    """Per offset, the errors of each dtype and method; and the findings that answer (b), read
    at the largest offset: overflow of the squares, cancellation in E[x²] - E[x]², what rounding
    the input to a dtype costs, and fp32 arithmetic on the rounded input (CUDA autocast's way)."""
    record, metrics = _ok_metrics(path)
    if metrics is None:
        return pd.DataFrame(), {"measured": False, **_not_measured(record)}
    config = record["config"]
    rows = pd.DataFrame(metrics["methods"])
    inputs = pd.DataFrame(metrics["inputs"])
    tables = [{"offset": offset, "table": to_markdown(layernorm_display(group))}
              for offset, group in rows.groupby("offset", sort=True)]
    by = rows.set_index(["offset", "dtype", "method"])
    at = inputs.set_index(["offset", "dtype"])

    def get(offset, dtype, method, key):
        value = by.loc[(offset, dtype, method), key] if (offset, dtype, method) in by.index \
            else None
        return None if value is None or pd.isna(value) else value

    high, low = max(config["offsets"]), min(config["offsets"])
    outputs = int(rows["outputs"].iloc[0])
    width, n_rows = config["width"], config["rows"]
    findings = {"offset": high, "low_offset": low, "outputs": outputs, "width": width,
                "rows": n_rows, "dtypes": {}}
    for dtype in ("fp16", "bf16", "fp32"):
        if (high, dtype) not in at.index:
            continue
        i = at.loc[(high, dtype)]
        squares_inf = get(high, dtype, "one-pass", "squares_inf")
        findings["dtypes"][dtype] = {
            "max": i["dtype_max"], "square_overflows_above": i["square_overflows_above"],
            "significant_bits": int(i["significant_bits"]),
            "largest_abs": i["largest_abs"], "magnitude": i["magnitude"], "spacing": i["spacing"],
            "row_sums_inf": int(i["row_sums_inf"]), "row_means_inf": int(i["row_means_inf"]),
            "squares_inf": squares_inf, "squares_overflow": bool(squares_inf),
            "squares_verdict": "overflow" if squares_inf else "stay finite",
            "one_pass_nonfinite": get(high, dtype, "one-pass", "out_nonfinite"),
            "one_pass_var_negative": get(high, dtype, "one-pass", "var_negative"),
            "one_pass_err_max": get(high, dtype, "one-pass", "out_abs_err_max"),
            "two_pass_err_max": get(high, dtype, "two-pass", "out_abs_err_max"),
            "two_pass_var_negative": get(high, dtype, "two-pass", "var_negative"),
            "torch_err_mean": get(high, dtype, "torch", "out_abs_err_mean"),
            "torch_err_max": get(high, dtype, "torch", "out_abs_err_max"),
            "torch_var_median": get(high, dtype, "torch", "var_rel_err_median"),
            "upcast_err_mean": get(high, dtype, "torch-fp32", "out_abs_err_mean"),
            "low_torch_err_max": get(low, dtype, "torch", "out_abs_err_max"),
            "low_nonfinite": int(rows.loc[(rows["offset"] == low) & (rows["dtype"] == dtype),
                                          "out_nonfinite"].sum()),
        }
    d = findings["dtypes"]
    if {"fp16", "bf16"} <= set(d):
        findings["bf16_vs_fp16_error"] = _compare(d["bf16"]["torch_err_mean"],
                                                  d["fp16"]["torch_err_mean"])
        findings["bf16_vs_fp16_spacing"] = d["bf16"]["spacing"] / d["fp16"]["spacing"]
    if "fp32" in d:
        findings["fp32_one_vs_two_pass"] = _compare(d["fp32"]["one_pass_err_max"],
                                                    d["fp32"]["two_pass_err_max"])
    for dtype in ("fp16", "bf16"):
        if dtype in d:  # fp32 arithmetic on the rounded input against torch's kernel in dtype
            up, narrow = d[dtype]["upcast_err_mean"], d[dtype]["torch_err_mean"]
            d[dtype]["upcast_share"] = up / narrow if up is not None and narrow else None
    table = rows.merge(inputs, on=["offset", "dtype"], how="left")
    return table, {"measured": True, "device": record["env"]["device"], "config": config,
                   "tables": tables, "findings": findings,
                   "methods": [{"label": label, "how": METHOD_HOW[key]}
                               for key, label in LAYERNORM_METHODS.items()]}


# --- 1.4 (c): bf16 against fp32 --------------------------------------------------------------

def speedup_table(paths: list[str]) -> pd.DataFrame:
    """One row per (size, context, mode): fp32 and bf16 step times and, per phase, fp32 / bf16
    (above 1: bf16 faster) and whether the two means lie within each other's spread."""
    if not paths:
        return pd.DataFrame()
    frame = ensure_columns(records_frame(paths), ["message", "parameters"]
                           + [f"{p}_ms_{s}" for p in PHASES for s in ("mean", "std")])
    keys = ["size", "context_length", "mode"]
    # a step whose time hardly grows with the context measured launches, not the model
    frame["overhead"] = facts.overhead_bound(frame, ["size", "mode", "precision"],
                                       frame["context_length"].astype(float), "step_ms_mean")
    rows = []
    for key, group in frame.groupby(keys, sort=False):
        by = group.set_index("precision")
        if not {"fp32", "bf16"} <= set(by.index):
            continue
        fp32, bf16 = by.loc["fp32"], by.loc["bf16"]
        row = dict(zip(keys, key))
        row["overhead_bound"] = bool(fp32["overhead"] or bf16["overhead"])
        row["parameters"] = fp32["parameters"] if pd.notna(fp32["parameters"]) \
            else bf16["parameters"]
        row["fp32_status"], row["bf16_status"] = fp32["status"], bf16["status"]
        for phase in PHASES:
            for name, r in (("fp32", fp32), ("bf16", bf16)):
                row[f"{name}_{phase}_ms_mean"] = r[f"{phase}_ms_mean"]
                row[f"{name}_{phase}_ms_std"] = r[f"{phase}_ms_std"]
            s = facts.speedup(bf16[f"{phase}_ms_mean"], fp32[f"{phase}_ms_mean"],
                        bf16[f"{phase}_ms_std"], fp32[f"{phase}_ms_std"])
            row[f"{phase}_speedup"] = s["ratio"] if s else None
            row[f"{phase}_within_spread"] = s["within_spread"] if s else None
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["size_rank"] = table["size"].map(SIZE_ORDER)
    table["mode_rank"] = table["mode"].map(MODES.index)
    return (table.sort_values(["mode_rank", "context_length", "size_rank"])
            .drop(columns=["size_rank", "mode_rank"]).reset_index(drop=True))


def _speedup_cell(ratio, within, overhead=False) -> str:
    """'2.91x', with * where the two times are within each other's spread and † where either
    is overhead-bound."""
    if ratio is None or pd.isna(ratio):
        return ""
    return fmt_ratio(ratio) + (" *" if within is True else "") + (" †" if overhead else "")


def speedup_display(table: pd.DataFrame) -> pd.DataFrame:
    def times(precision, phase="step"):
        return [mean_pm_std(m, s) if st == "ok" else st for m, s, st in
                zip(table[f"{precision}_{phase}_ms_mean"], table[f"{precision}_{phase}_ms_std"],
                    table[f"{precision}_status"])]
    out = pd.DataFrame({
        "size": table["size"],
        "parameters (M)": table["parameters"].map(
            lambda v: "" if pd.isna(v) else f"{v / 1e6:,.1f}"),
        "context": table["context_length"], "mode": table["mode"],
        "fp32 step ms": times("fp32"), "bf16 step ms": times("bf16")})
    for phase in PHASES:
        out[f"{phase} speed-up"] = [_speedup_cell(r, w, o and phase == "step") for r, w, o in
                                    zip(table[f"{phase}_speedup"], table[f"{phase}_within_spread"],
                                        table["overhead_bound"])]
    return out


def speedup_by_context(table: pd.DataFrame) -> pd.DataFrame:
    """The step's speed-up alone, one row per size and mode and one column per context."""
    contexts = sorted(set(table["context_length"]))
    groups = table.groupby(["size", "mode"])
    rows = []
    for (size, mode), g in sorted(groups, key=lambda kg: (SIZE_ORDER[kg[0][0]], kg[0][1])):
        at = g.set_index("context_length")
        rows.append({"size": size, "mode": mode,
                     **{f"ctx {c}": _speedup_cell(at.loc[c, "step_speedup"],
                                                  at.loc[c, "step_within_spread"],
                                                  at.loc[c, "overhead_bound"])
                        if c in at.index else "" for c in contexts}})
    return pd.DataFrame(rows)


# A trend along sizes is stated from this many sizes on; with fewer, the sizes are compared.
TREND_FROM = 3


def trend_word(ratios: list[float]) -> str:
    """How a speed-up changes along sizes in increasing order: a trend from TREND_FROM sizes
    on, else which of the two is larger."""
    if len(ratios) < TREND_FROM:
        first, last = ratios[0], ratios[-1]
        return ("is larger at the larger size" if last > first else
                "is smaller at the larger size" if last < first else "is the same at both sizes")
    steps = np.diff(ratios)
    if (steps > 0).all():
        return "grows with every larger size"
    if (steps < 0).all():
        return "shrinks with every larger size"
    return "does not change monotonically with size"


def trends(table: pd.DataFrame) -> list[dict]:
    """Per (mode, context) with at least two sizes: each size's step speed-up and, over the
    sizes whose steps are not overhead-bound (two at least, else `trend` is None), the
    speed-up from the smallest to the largest of them and the trend in words."""
    out = []
    if table.empty:
        return out
    ok = table.dropna(subset=["step_speedup", "parameters"])
    for (mode, context), group in ok.groupby(["mode", "context_length"], sort=False):
        group = group.sort_values("parameters")
        if len(group) < 2:
            continue
        busy = group[~group["overhead_bound"].astype(bool)]
        ratios = list(busy["step_speedup"])
        out.append({"mode": mode, "context_length": context,
                    "trend": trend_word(ratios) if len(busy) >= 2 else None,
                    "sizes": [{"size": s, "ratio": r, "within_spread": bool(w),
                               "overhead_bound": bool(o)}
                              for s, r, w, o in zip(group["size"], group["step_speedup"],
                                                    group["step_within_spread"],
                                                    group["overhead_bound"])],
                    "first": busy["size"].iloc[0] if len(busy) else None,
                    "last": busy["size"].iloc[-1] if len(busy) else None,
                    "first_ratio": ratios[0] if ratios else None,
                    "last_ratio": ratios[-1] if ratios else None})
    return out


def speedup_summary(table: pd.DataFrame) -> dict | None:
    """Over the configurations whose fp32 and bf16 steps both grow with the context (the
    overhead-bound ones counted apart): how many bf16 is faster at, slower at, and inside the
    spread; the largest and smallest step speed-ups and where."""
    timed = table.dropna(subset=["step_speedup"]) if not table.empty else table
    if timed.empty:
        return None
    overhead = timed[timed["overhead_bound"]]
    ok = timed[~timed["overhead_bound"]]
    if ok.empty:
        return {"count": 0, "overhead_bound": len(overhead)}
    best = ok.loc[ok["step_speedup"].idxmax()]
    worst = ok.loc[ok["step_speedup"].idxmin()]
    where = lambda r: {"size": r["size"], "context_length": r["context_length"],
                       "mode": r["mode"], "ratio": r["step_speedup"],
                       "verdict": facts.speedup(1.0, r["step_speedup"])}
    return {"count": len(ok), "overhead_bound": len(overhead),
            "faster": int((ok["step_speedup"] > 1).sum()),
            "slower": int((ok["step_speedup"] < 1).sum()),
            "within_spread": int(ok["step_within_spread"].fillna(False).astype(bool).sum()),
            "largest": where(best), "smallest": where(worst)}


def speedup_figure(table: pd.DataFrame, path: str | Path) -> None:
    """fp32 step time / bf16 step time against parameter count, a line per (mode, context)."""
    fig, axes = figures.subplots(1, width=6.0)
    ax = axes[0][0]
    ok = table.dropna(subset=["step_speedup", "parameters"]) if not table.empty else table
    for (mode, context), group in (ok.groupby(["mode", "context_length"], sort=False)
                                   if not ok.empty else []):
        group = group.sort_values("parameters")
        ax.plot(group["parameters"] / 1e6, group["step_speedup"], marker="o",
                linestyle="-" if mode == "train-step" else "--", label=f"{mode}, ctx {context}")
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.set(xscale="log", xlabel="model size (parameters)", ylabel="fp32 time / bf16 time",
           title="bf16 autocast against fp32, per step")
    if not ok.empty:
        sizes = ok.drop_duplicates("size").sort_values("parameters")
        ax.set_xticks(sizes["parameters"] / 1e6, [f"{s}\n{p / 1e6:,.0f}M" for s, p in
                                                 zip(sizes["size"], sizes["parameters"])])
        ax.minorticks_off()
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no size with both fp32 and bf16 timings", ha="center",
                transform=ax.transAxes)
    figures.save(fig, path)


# --- the section -----------------------------------------------------------------------------

def _left_out(bench: pd.DataFrame, table: pd.DataFrame, assignment: dict) -> str:
    """What of (c) this preset leaves out: sizes of the assignment without an fp32/bf16 pair."""
    if "bf16" not in set(bench.get("precision", [])):
        return "(c): no bf16 runs in this preset"
    have = set(table["size"]) if not table.empty else set()
    gone = [s for s in assignment["sizes"] if s not in have]
    return f"(c) lacks sizes {', '.join(map(size_label, gone))}" if gone else ""


def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    """Records -> the accumulation, toy-model, LayerNorm and speed-up tables, the speed-up
    figure, and the section's facts. options: assignment, the benchmark part of the full
    matrix (which sizes (c) should cover)."""
    accumulation_table, accumulation = accumulation_facts(records["accumulation"][0])
    toy_table, toy = toy_model_facts(records["toy_model"])
    layernorm_table, layernorm = layernorm_facts(records["layernorm"][0])
    bench = records_frame(records["benchmark"]) if records["benchmark"] else pd.DataFrame(
        columns=["status", "message", "precision", "size"])
    speedups = speedup_table(records["benchmark"])
    write_table(accumulation_table, outputs["accumulation_table"])
    write_table(toy_table, outputs["toy_model_table"])
    write_table(layernorm_table, outputs["layernorm_table"])
    write_table(speedups, outputs["speedup_table"])
    speedup_figure(speedups, outputs["speedup_figure"])

    frames = {name: records_frame(records[name])
              for name in ("accumulation", "toy_model", "layernorm")}
    part_c = bench[bench["precision"].isin(["fp32", "bf16"])] if len(bench) else bench
    missing = [_left_out(bench, speedups, options["assignment"])]
    if toy["runs"] and not toy["on_cuda"]:
        missing.append(f"(a) read on {', '.join(toy['devices'])}, whose autocast is not CUDA's")
    on_cuda = bool(len(bench) and (bench["env_device"] == "cuda").any())
    return {
        "env": env_summary(*frames.values(), bench),
        "coverage": {
            "mixed_precision_accumulation": facts.covered(frames["accumulation"],
                                                    anchor="mixed_precision_accumulation"),
            "benchmarking_mixed_precision": facts.covered(
                pd.concat([frames["toy_model"], frames["layernorm"], part_c],
                          ignore_index=True),
                missing="; ".join(m for m in missing if m),
                anchor="benchmarking_mixed_precision"),
        },
        "accumulation": accumulation,
        "toy": toy,
        "layernorm": layernorm,
        "speedup": {
            "table": long_table(speedup_display(speedups), outputs["speedup_table"],
                                speedup_by_context(speedups)) if not speedups.empty else None,
            "on_cuda": on_cuda, "trends": trends(speedups), "summary": speedup_summary(speedups),
            "overhead": facts.overhead_rule(),
            "sizes": sorted(set(speedups["size"]), key=SIZE_ORDER.get) if len(speedups) else [],
            "failures": facts.not_ok(bench, ["size", "context_length", "mode", "precision"])
            if len(bench) else [],
            "figure": outputs["speedup_figure"],
        },
    }
