"""benchmarking_script (assignment 1.1): the table, figures and facts of the benchmark records.

`build` is the section's report module entry (see `cs336_systems.sections`); the prose is in
the section's template.md.j2 (the answers) and details.md.j2 (its companion page).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.step import MODES
from cs336_systems.records import read_record
from cs336_systems.report import figures, tables
from cs336_systems.report.facts import (
    covered,
    not_in_preset,
    not_ok,
    overhead_bound,
    overhead_rule,
    speedup,
)
from cs336_systems.report.render import fmt

CONFIG_COLUMNS = ["size", "context_length", "mode", "precision", "warmup_steps", "measure_steps",
                  "batch_size", "attention"]
PHASES = ["forward", "backward", "optimizer", "step"]
METRIC_COLUMNS = (["parameters", "model_flops_per_step"]
                  + [f"{p}_ms_{s}" for p in PHASES for s in ("mean", "std", "median", "first",
                                                             "max")]
                  + ["peak_gib"])
SIZE_ORDER = {name: i for i, name in enumerate(MODEL_SIZES)}


def build_table(record_paths: list[str], main_warmup_steps: int) -> pd.DataFrame:
    """One row per record; `main_sweep` marks the rows at the main sweep's warm-up count."""
    frame = tables.ensure_columns(tables.records_frame(record_paths),
                                  CONFIG_COLUMNS + METRIC_COLUMNS)
    frame["main_sweep"] = frame["warmup_steps"] == main_warmup_steps
    # Achieved model FLOP rate over the whole step (the optimizer's time included).
    frame["model_tflop_per_s"] = frame["model_flops_per_step"] / frame["step_ms_mean"] / 1e9
    frame["size_rank"] = frame["size"].map(SIZE_ORDER)
    frame = frame.sort_values(["size_rank", "context_length", "mode", "precision", "warmup_steps"])
    return frame[CONFIG_COLUMNS + ["main_sweep", "status"] + METRIC_COLUMNS
                 + ["model_tflop_per_s", "message"] + tables.env_columns(frame)]


def display_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean ± std per phase, one row per configuration."""
    out = pd.DataFrame({
        "size": rows["size"], "context": rows["context_length"], "mode": rows["mode"],
        "precision": rows["precision"], "warm-up": rows["warmup_steps"], "status": rows["status"],
    })
    for phase in PHASES:
        out[f"{phase} ms"] = [tables.mean_pm_std(m, s) for m, s in
                              zip(rows[f"{phase}_ms_mean"], rows[f"{phase}_ms_std"])]
    out["model TFLOP/s"] = [fmt(v, 1) if pd.notna(v) else ("n/a" if status == "ok" else "")
                            for v, status in zip(rows["model_tflop_per_s"], rows["status"])]
    out["peak GiB"] = rows["peak_gib"].map(lambda v: fmt(v, 2))
    return out


def step_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """The timing table in one row per size, mode and precision: the step's mean ms at each
    context (or the configuration's status where it has no time)."""
    contexts = sorted(set(rows["context_length"]))
    out = []
    groups = rows.groupby(["size", "mode", "precision"])
    for (size, mode, precision), g in sorted(groups, key=lambda kg: (SIZE_ORDER[kg[0][0]],
                                                                     kg[0][1:])):
        at = g.set_index("context_length")
        out.append({"size": size, "mode": mode, "precision": precision,
                    **{f"ctx {c} step ms": (fmt(at.loc[c, "step_ms_mean"], 1)
                                            if at.loc[c, "status"] == "ok" else at.loc[c, "status"])
                       if c in at.index else "" for c in contexts}})
    return pd.DataFrame(out)


def scaling_figure(table: pd.DataFrame, path: str | Path) -> None:
    ok = table[table["main_sweep"] & (table["status"] == "ok")]
    modes = [m for m in MODES if m in set(ok["mode"])]
    fig, axes = figures.subplots(max(len(modes), 1))
    for ax, mode in zip(axes[0], modes):
        for (context, precision), group in ok[ok["mode"] == mode].groupby(
                ["context_length", "precision"]):
            group = group.sort_values("parameters")
            ax.errorbar(group["parameters"] / 1e6, group["step_ms_mean"], yerr=group["step_ms_std"],
                        marker="o", capsize=3, linestyle="-" if precision == "fp32" else "--",
                        label=f"ctx {context}, {precision}")
        ax.set(xscale="log", yscale="log", xlabel="model size (parameters)",
               ylabel="time per step (ms)", title=mode)
        sizes = ok[ok["mode"] == mode].drop_duplicates("size").sort_values("parameters")
        ax.set_xticks(sizes["parameters"] / 1e6, [f"{s}\n{p / 1e6:,.0f}M" for s, p in
                                                 zip(sizes["size"], sizes["parameters"])])
        ax.minorticks_off()
        ax.legend(fontsize=7)
    figures.save(fig, path)


def warmup_figure(record_paths: list[str], path: str | Path) -> None:
    """Step time against step index, warm-up steps included, for the warm-up ablation runs."""
    fig, axes = figures.subplots(1)
    ax = axes[0][0]
    for record_path in record_paths:
        record = read_record(record_path)
        metrics, config = record["metrics"], record["config"]
        if record["status"] != "ok" or config["warmup_steps"] != 0:
            continue
        samples = metrics["step_ms_samples"]
        ax.plot(range(1, len(samples) + 1), samples, marker="o",
                label=f"{config['size']} ctx {config['context_length']} {config['mode']} "
                      f"{config['precision']}")
    ax.set(yscale="log", xlabel="step (no warm-up)", ylabel="time (ms)",
           title="Time of each step from a cold start")
    if ax.lines:
        ax.legend(fontsize=7)
    figures.save(fig, path)


# --- facts ---------------------------------------------------------------------------------

CONFIG_KEYS = ["size", "context_length", "mode", "precision"]


def _where(row: pd.Series) -> dict:
    return {k: row[k] for k in CONFIG_KEYS}


def variability(ok: pd.DataFrame) -> dict | None:
    """std / mean over every phase timing (a forward-only step counted once, as its forward)."""
    ratios = []
    for phase in PHASES:
        has = ok[f"{phase}_ms_mean"].notna()
        if phase == "step":
            has &= ok["mode"] != "forward"
        r = (ok.loc[has, f"{phase}_ms_std"] / ok.loc[has, f"{phase}_ms_mean"]).rename("ratio")
        ratios.append(pd.concat([ok.loc[has, CONFIG_KEYS], r], axis=1).assign(phase=phase))
    ratios = pd.concat(ratios, ignore_index=True) if ratios else pd.DataFrame()
    if ratios.empty:
        return None
    worst = ratios.loc[ratios["ratio"].idxmax()]
    return {"count": len(ratios), "median": ratios["ratio"].median(),
            "worst": {"ratio": worst["ratio"], "phase": worst["phase"], **_where(worst)}}


def backward_share(ok: pd.DataFrame) -> dict | None:
    """Backward / forward and optimizer / step over the training steps whose time grows with
    the context (the overhead-bound ones, where launches set both passes' times, counted
    apart; all of them where none grows)."""
    steps = ok[(ok["mode"] == "train-step") & ok["backward_ms_mean"].notna()]
    if steps.empty:
        return None
    flat = overhead_bound(steps, ["size", "precision"],
                          steps["context_length"].astype(float), "step_ms_mean")
    if not flat.all():
        steps = steps[~flat]
    ratio = steps["backward_ms_mean"] / steps["forward_ms_mean"]
    share = steps["optimizer_ms_mean"] / steps["step_ms_mean"]
    return {"backward_over_forward": {"min": ratio.min(), "median": ratio.median(),
                                      "max": ratio.max()},
            "optimizer_share": {"min": share.min(), "max": share.max()},
            "steps": len(steps), "overhead_bound": int(flat.sum()) if not flat.all() else 0,
            "overhead": overhead_rule()}


def scaling(ok: pd.DataFrame) -> dict | None:
    """Smallest against largest size measured: training step, fp32, at the longest context
    both ran (where the small model's step is furthest from launch overhead)."""
    steps = ok[(ok["mode"] == "train-step") & (ok["precision"] == "fp32")]
    sizes = sorted(set(steps["size"]), key=SIZE_ORDER.get)
    if len(sizes) < 2:
        return None
    small, large = sizes[0], sizes[-1]
    both = (set(steps.loc[steps["size"] == small, "context_length"])
            & set(steps.loc[steps["size"] == large, "context_length"]))
    if not both:
        return None
    context = max(both)
    at = steps[steps["context_length"] == context].set_index("size")
    return {"small": small, "large": large, "context_length": context,
            "parameter_ratio": at.loc[large, "parameters"] / at.loc[small, "parameters"],
            "time_ratio": at.loc[large, "step_ms_mean"] / at.loc[small, "step_ms_mean"],
            "small_ms": at.loc[small, "step_ms_mean"], "large_ms": at.loc[large, "step_ms_mean"]}


def warmup_ablation(table: pd.DataFrame) -> dict | None:
    """Per configuration with every warm-up count: its rows for the table, and the cold run
    (fewest warm-up steps) against the warm one (most)."""
    ablation = table[table["status"] == "ok"]
    counts = sorted(set(ablation["warmup_steps"]))
    if len(counts) < 2:
        return None
    groups = [(k, g.set_index("warmup_steps")) for k, g in ablation.groupby(CONFIG_KEYS)
              if g["warmup_steps"].nunique() == len(counts)]
    rows, configs = [], []
    for key, g in sorted(groups, key=lambda kg: SIZE_ORDER[kg[0][0]]):
        where = dict(zip(CONFIG_KEYS, key))
        for w in counts:
            rows.append({"size": where["size"], "context": where["context_length"],
                         "mode": where["mode"], "precision": where["precision"], "warm-up": w,
                         "step ms": tables.mean_pm_std(g.loc[w, "step_ms_mean"],
                                                       g.loc[w, "step_ms_std"]),
                         "std/mean %": fmt(100 * g.loc[w, "step_ms_std"]
                                             / g.loc[w, "step_ms_mean"], 1),
                         "first measured step ms": fmt(g.loc[w, "step_ms_first"], 2)})
        cold, warm = g.loc[counts[0]], g.loc[counts[-1]]
        configs.append({
            **where,
            "cold": {"warmup_steps": counts[0], "mean": cold["step_ms_mean"],
                     "spread": cold["step_ms_std"] / cold["step_ms_mean"],
                     "first": cold["step_ms_first"]},
            "warm": {"warmup_steps": counts[-1], "mean": warm["step_ms_mean"],
                     "spread": warm["step_ms_std"] / warm["step_ms_mean"]},
            "first_over_warm_median": cold["step_ms_first"] / warm["step_ms_median"],
            "between": [{"warmup_steps": w,
                         "against_warm": speedup(warm["step_ms_mean"], g.loc[w, "step_ms_mean"],
                                                 warm["step_ms_std"], g.loc[w, "step_ms_std"])}
                        for w in counts[1:-1]],
        })
    return {"table": tables.to_markdown(pd.DataFrame(rows)), "configs": configs,
            "summary": warmup_summary(configs)}


# The context of the by-size table: the 2026 handout's default where the run measured it.
BY_SIZE_CONTEXT = 512


def by_size(main: pd.DataFrame) -> dict | None:
    """(b)'s table: every size's training step in fp32 at one context (BY_SIZE_CONTEXT, else the
    longest measured), each phase's mean ± std, or the configuration's status."""
    steps = main[(main["mode"] == "train-step") & (main["precision"] == "fp32")]
    if steps.empty:
        return None
    contexts = set(steps["context_length"])
    context = BY_SIZE_CONTEXT if BY_SIZE_CONTEXT in contexts else max(contexts)
    at = steps[steps["context_length"] == context].sort_values("size", key=lambda s: s.map(
        SIZE_ORDER))
    rows, ok = [], at[at["status"] == "ok"]
    for _, r in at.iterrows():
        row = {"size": r["size"], "status": r["status"]}
        for phase in PHASES:
            row[f"{phase} ms"] = tables.mean_pm_std(r[f"{phase}_ms_mean"], r[f"{phase}_ms_std"])
        rows.append(row)
    first, last = (ok.iloc[0], ok.iloc[-1]) if len(ok) else (None, None)
    return {"context_length": int(context), "table": tables.to_markdown(pd.DataFrame(rows)),
            "smallest": None if first is None else {"size": first["size"],
                                                    "step_ms": first["step_ms_mean"]},
            "largest": None if last is None else {"size": last["size"],
                                                  "step_ms": last["step_ms_mean"]},
            "not_ok": [{"size": r["size"], "status": r["status"]}
                       for _, r in at[at["status"] != "ok"].iterrows()]}


def warmup_summary(configs: list[dict]) -> dict | None:
    """(c) in one line: across the ablation's configurations, how far the cold run's first step
    and mean sit above the warm run's, and after each middle warm-up count how many means are a
    tie with the warm one (inside the measured spread)."""
    if not configs:
        return None
    cold_over_warm = [c["cold"]["mean"] / c["warm"]["mean"] for c in configs]
    first = [c["first_over_warm_median"] for c in configs]
    after = []
    for i, step in enumerate(configs[0]["between"]):
        ratios = [c["between"][i]["against_warm"] for c in configs if len(c["between"]) > i]
        after.append({"warmup_steps": step["warmup_steps"], "of": len(ratios),
                      "ties": sum(bool(r["within_spread"]) for r in ratios),
                      "ratio_min": min(r["ratio"] for r in ratios),
                      "ratio_max": max(r["ratio"] for r in ratios)})
    return {"configs": len(configs), "cold_warmup_steps": configs[0]["cold"]["warmup_steps"],
            "warm_warmup_steps": configs[0]["warm"]["warmup_steps"],
            "first_over_warm": {"min": min(first), "max": max(first)},
            "cold_mean_over_warm": {"min": min(cold_over_warm), "max": max(cold_over_warm)},
            "after": after}


def size_table(table: pd.DataFrame) -> str:
    sizes = sorted(set(table["size"]), key=SIZE_ORDER.get)
    params = table.dropna(subset=["parameters"]).drop_duplicates("size").set_index("size")
    return tables.to_markdown(pd.DataFrame([
        {"size": s, "d_model": MODEL_SIZES[s].d_model, "d_ff": MODEL_SIZES[s].d_ff,
         "layers": MODEL_SIZES[s].num_layers, "heads": MODEL_SIZES[s].num_heads,
         "parameters (M, counted)": fmt(params.loc[s, "parameters"] / 1e6, 1)
         if s in params.index else ""}
        for s in sizes]))


def left_out(table: pd.DataFrame, assignment: dict) -> str:
    """What of the assignment's matrix (the config's defaults) the run did not include."""
    return not_in_preset({
        "sizes": (assignment["sizes"], table["size"]),
        "contexts": (assignment["context_lengths"], table["context_length"]),
        "warm-up counts": (assignment["warmup_ablation"]["warmup_steps"], table["warmup_steps"]),
    })


def facts(table: pd.DataFrame, outputs: dict[str, str], assignment: dict) -> dict:
    main = table[table["main_sweep"]]
    main_ok = main[main["status"] == "ok"]
    first = table.iloc[0] if len(table) else None
    # bf16 against fp32 (benchmarking_mixed_precision (c)) is the mixed_precision section's
    coverage = {"benchmarking_script": covered(table, missing=left_out(table, assignment),
                                               anchor="benchmarking_script")}
    return {
        "env": tables.env_summary(table),
        "coverage": coverage,
        "batch_size": first["batch_size"] if first is not None else None,
        "measure_steps": first["measure_steps"] if first is not None else None,
        "main_warmup_steps": main["warmup_steps"].iloc[0] if len(main) else None,
        "on_cuda": bool("env_device" in table and (table["env_device"] == "cuda").any()),
        "size_table": size_table(table),
        "timing": tables.long_table(display_table(main), outputs["table"], step_summary(main)),
        "variability": variability(main_ok),
        "backward": backward_share(main_ok),
        "scaling": scaling(main_ok),
        "by_size": by_size(main),
        "failures": not_ok(table, CONFIG_KEYS + ["warmup_steps"]),
        "warmup": warmup_ablation(table),
        "scaling_figure": outputs["scaling_figure"],
        "warmup_figure": outputs["warmup_figure"],
    }


def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    """Records -> outputs["table"] (CSV), the two figures, and the section's facts.
    options: main_warmup_steps, the warm-up count of the main sweep; assignment, the
    benchmark part of the full matrix (to say what this preset leaves out)."""
    table = build_table(records["records"], options["main_warmup_steps"])
    tables.write_table(table, outputs["table"])
    scaling_figure(table, outputs["scaling_figure"])
    warmup_figure(records["records"], outputs["warmup_figure"])
    return facts(table, outputs, options["assignment"])
