"""benchmarking_script (§1.1): table, figures and writeup section from the benchmark records.

    python -m cs336_systems.report.sections.benchmark --records r1.json r2.json ... \
        --csv benchmark.csv --markdown benchmark.md --scaling-figure a.png --warmup-figure b.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from cs336_systems.model import MODEL_SIZES
from cs336_systems.records import read_record
from cs336_systems.report import figures
from cs336_systems.report.render import bullets, fmt, fmt_ratio, relative_link, render_template
from cs336_systems.report.tables import (ensure_columns, mean_pm_std, records_frame,
                                         to_markdown, write_table)

CONFIG_COLUMNS = ["size", "context_length", "mode", "precision", "warmup_steps", "measure_steps",
                  "batch_size", "attention"]
PHASES = ["forward", "backward", "optimizer", "step"]
METRIC_COLUMNS = (["parameters", "model_flops_per_step"]
                  + [f"{p}_ms_{s}" for p in PHASES for s in ("mean", "std", "median", "first", "max")]
                  + ["peak_gib"])
SIZE_ORDER = {name: i for i, name in enumerate(MODEL_SIZES)}


def build_table(record_paths: list[str], main_warmup_steps: int) -> pd.DataFrame:
    """One row per record; `main_sweep` marks the rows at the main sweep's warm-up count."""
    frame = ensure_columns(records_frame(record_paths), CONFIG_COLUMNS + METRIC_COLUMNS)
    frame["main_sweep"] = frame["warmup_steps"] == main_warmup_steps
    # Achieved model FLOP rate over the whole step (the optimizer's time included).
    frame["model_tflop_per_s"] = frame["model_flops_per_step"] / frame["step_ms_mean"] / 1e9
    frame["size_rank"] = frame["size"].map(SIZE_ORDER)
    frame = frame.sort_values(["size_rank", "context_length", "mode", "precision", "warmup_steps"])
    env = [c for c in frame.columns if c.startswith("env_")]
    return frame[CONFIG_COLUMNS + ["main_sweep", "status"] + METRIC_COLUMNS
                 + ["model_tflop_per_s", "message"] + env]


def display_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean ± std per phase, one row per configuration."""
    out = pd.DataFrame({
        "size": rows["size"], "context": rows["context_length"], "mode": rows["mode"],
        "precision": rows["precision"], "warm-up": rows["warmup_steps"], "status": rows["status"],
    })
    for phase in PHASES:
        out[f"{phase} ms"] = [mean_pm_std(m, s) for m, s in
                              zip(rows[f"{phase}_ms_mean"], rows[f"{phase}_ms_std"])]
    out["model TFLOP/s"] = [fmt(v, 1) if pd.notna(v) else ("n/a" if status == "ok" else "")
                            for v, status in zip(rows["model_tflop_per_s"], rows["status"])]
    out["peak GiB"] = rows["peak_gib"].map(lambda v: fmt(v, 2))
    return out


def scaling_figure(table: pd.DataFrame, path: str | Path) -> None:
    ok = table[table["main_sweep"] & (table["status"] == "ok")]
    modes = [m for m in ("forward", "forward-backward", "train-step") if m in set(ok["mode"])]
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


# --- writeup -------------------------------------------------------------------------------

def _variability_sentence(ok: pd.DataFrame) -> str:
    ratios = []
    for phase in PHASES:
        has = ok[f"{phase}_ms_mean"].notna()
        if phase == "step":  # a forward-only step is its forward phase: count it once
            has &= ok["mode"] != "forward"
        r = (ok.loc[has, f"{phase}_ms_std"] / ok.loc[has, f"{phase}_ms_mean"]).rename("ratio")
        ratios.append(pd.concat([ok.loc[has, CONFIG_COLUMNS], r], axis=1).assign(phase=phase))
    ratios = pd.concat(ratios, ignore_index=True)
    worst = ratios.loc[ratios["ratio"].idxmax()] if len(ratios) else None
    if worst is None:
        return "No successful timings to assess variability."
    return (f"Across {len(ratios)} phase timings the standard deviation is a median "
            f"{fmt(100 * ratios['ratio'].median(), 1)}% of the mean (largest "
            f"{fmt(100 * worst['ratio'], 1)}%, for the {worst['phase']} phase of {worst['size']} "
            f"at context {worst['context_length']}, {worst['mode']}, {worst['precision']}).")


def _backward_sentence(ok: pd.DataFrame) -> str:
    steps = ok[(ok["mode"] == "train-step") & ok["backward_ms_mean"].notna()]
    if steps.empty:
        return ""
    ratio = steps["backward_ms_mean"] / steps["forward_ms_mean"]
    share = steps["optimizer_ms_mean"] / steps["step_ms_mean"]
    return (f"In a training step the backward pass takes {fmt_ratio(ratio.min())} to "
            f"{fmt_ratio(ratio.max())} the forward pass (median {fmt_ratio(ratio.median())}), and "
            f"the AdamW step is {fmt(100 * share.min(), 1)}% to {fmt(100 * share.max(), 1)}% of "
            f"the step.")


def _scaling_sentence(ok: pd.DataFrame) -> str:
    steps = ok[(ok["mode"] == "train-step") & (ok["precision"] == "fp32")]
    sizes = sorted(set(steps["size"]), key=SIZE_ORDER.get)
    if len(sizes) < 2:
        return ""
    context = steps["context_length"].min()
    at = steps[steps["context_length"] == context].set_index("size")
    small, large = sizes[0], sizes[-1]
    if small not in at.index or large not in at.index:
        return ""
    time_ratio = at.loc[large, "step_ms_mean"] / at.loc[small, "step_ms_mean"]
    param_ratio = at.loc[large, "parameters"] / at.loc[small, "parameters"]
    return (f"From {small} to {large} (context {context}, fp32) the parameter count grows "
            f"{fmt_ratio(param_ratio)} and the training step {fmt_ratio(time_ratio)} "
            f"({fmt(at.loc[small, 'step_ms_mean'], 1)} ms to {fmt(at.loc[large, 'step_ms_mean'], 1)} ms).")


def _precision_sentence(ok: pd.DataFrame) -> str:
    keys = ["size", "context_length", "mode"]
    fp32 = ok[ok["precision"] == "fp32"].set_index(keys)["step_ms_mean"]
    bf16 = ok[ok["precision"] == "bf16"].set_index(keys)["step_ms_mean"]
    speedup = (fp32 / bf16).dropna()
    if speedup.empty:
        return ""
    parts = []
    for size in sorted({k[0] for k in speedup.index}, key=SIZE_ORDER.get):
        for mode in ("forward", "train-step"):
            s = speedup[[k for k in speedup.index if k[0] == size and k[2] == mode]]
            if len(s):
                verdict = "faster" if s.median() > 1 else "not faster"
                parts.append(f"{size} {mode} {fmt_ratio(s.median())} ({verdict}; "
                             f"{fmt(s.min(), 2)} to {fmt(s.max(), 2)} over contexts)")
    return ("Speed-up of bf16 autocast over fp32 (fp32 time / bf16 time), median over "
            "contexts: " + "; ".join(parts) + ".")


def _failures_sentence(table: pd.DataFrame) -> str:
    failed = table[table["status"] != "ok"]
    if failed.empty:
        return "Every configuration ran."
    items = [f"{r['size']} ctx {r['context_length']} {r['mode']} {r['precision']} "
             f"warm-up {r['warmup_steps']}: {r['status']}" for _, r in failed.iterrows()]
    return "Not measured: " + "; ".join(items) + "."


def _warmup_analysis(table: pd.DataFrame) -> tuple[str, str]:
    ablation = table[(table["status"] == "ok")]
    counts = sorted(set(ablation["warmup_steps"]))
    if len(counts) < 2:
        return "_(the preset has no warm-up ablation)_", ""
    groups = ablation.groupby(["size", "context_length", "mode", "precision"])
    groups = [(k, g) for k, g in groups if g["warmup_steps"].nunique() == len(counts)]
    rows, sentences = [], []
    for (size, context, mode, precision), g in sorted(groups, key=lambda kg: SIZE_ORDER[kg[0][0]]):
        g = g.set_index("warmup_steps")
        for w in counts:
            rows.append({"size": size, "context": context, "mode": mode, "precision": precision,
                         "warm-up": w,
                         "step ms": mean_pm_std(g.loc[w, "step_ms_mean"], g.loc[w, "step_ms_std"]),
                         "std/mean %": fmt(100 * g.loc[w, "step_ms_std"] / g.loc[w, "step_ms_mean"], 1),
                         "first measured step ms": fmt(g.loc[w, "step_ms_first"], 2)})
        cold, warm = g.loc[counts[0]], g.loc[counts[-1]]
        sentences.append(
            f"{size} (ctx {context}, {mode}, {precision}): with {counts[0]} warm-up steps the mean "
            f"step is {fmt(cold['step_ms_mean'], 1)} ms and std/mean "
            f"{fmt(100 * cold['step_ms_std'] / cold['step_ms_mean'], 0)}%, against "
            f"{fmt(warm['step_ms_mean'], 1)} ms and {fmt(100 * warm['step_ms_std'] / warm['step_ms_mean'], 1)}% "
            f"after {counts[-1]}; the first measured step of the cold run took "
            f"{fmt(cold['step_ms_first'], 1)} ms, {fmt_ratio(cold['step_ms_first'] / warm['step_ms_median'])} "
            f"the warmed-up median."
            + "".join(f" After {w} warm-up step(s) the mean is "
                      f"{fmt_ratio(g.loc[w, 'step_ms_mean'] / warm['step_ms_mean'])} the mean after "
                      f"{counts[-1]}." for w in counts[1:-1]))
    return to_markdown(pd.DataFrame(rows)), bullets(sentences)


def _warmup_causes(table: pd.DataFrame) -> str:
    on_cuda = "env_device" in table and (table["env_device"] == "cuda").any()
    if on_cuda:
        return ("CUDA context and cuBLAS handle creation, kernel selection and lazy module "
                "loading, and the caching allocator growing its pool to the step's working set")
    return ("lazy initialisation in PyTorch (operator dispatch tables, thread pools), the "
            "allocator reaching the step's working set, and cold CPU caches")


def render(table: pd.DataFrame, scaling_figure_path: str, warmup_figure_path: str,
           writeup_path: str) -> str:
    ok = table[table["status"] == "ok"]
    main = table[table["main_sweep"]]
    main_ok = main[main["status"] == "ok"]
    sizes = sorted(set(table["size"]), key=SIZE_ORDER.get)
    params = table.dropna(subset=["parameters"]).drop_duplicates("size").set_index("size")
    size_rows = pd.DataFrame([
        {"size": s, "d_model": MODEL_SIZES[s].d_model, "d_ff": MODEL_SIZES[s].d_ff,
         "layers": MODEL_SIZES[s].num_layers, "heads": MODEL_SIZES[s].num_heads,
         "parameters (M, counted)": fmt(params.loc[s, "parameters"] / 1e6, 1) if s in params.index else ""}
        for s in sizes])
    warmup_table, warmup_sentences = _warmup_analysis(table)
    first = table.iloc[0] if len(table) else None
    return render_template(
        "benchmark.md",
        batch_size=first["batch_size"] if first is not None else "",
        measure_steps=first["measure_steps"] if first is not None else "",
        main_warmup=main["warmup_steps"].iloc[0] if len(main) else "",
        size_table=to_markdown(size_rows),
        timing_table=to_markdown(display_table(main)),
        findings=bullets([_variability_sentence(main_ok), _backward_sentence(main_ok),
                          _scaling_sentence(main_ok), _precision_sentence(main_ok),
                          _failures_sentence(table)]),
        scaling_figure=relative_link(scaling_figure_path, writeup_path),
        warmup_table=warmup_table,
        warmup_sentences=warmup_sentences,
        warmup_figure=relative_link(warmup_figure_path, writeup_path),
        warmup_causes=_warmup_causes(table),
        ok_count=len(ok),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", nargs="+", required=True)
    parser.add_argument("--main-warmup-steps", type=int, required=True)
    parser.add_argument("--csv", required=True)
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--scaling-figure", required=True)
    parser.add_argument("--warmup-figure", required=True)
    args = parser.parse_args(argv)
    table = build_table(args.records, args.main_warmup_steps)
    write_table(table, args.csv, args.markdown, display_table(table))
    scaling_figure(table, args.scaling_figure)
    warmup_figure(args.records, args.warmup_figure)


if __name__ == "__main__":
    main()
