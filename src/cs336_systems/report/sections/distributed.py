"""Distributed training (§4): tables, figures and the writeup section.

    python -m cs336_systems.report.sections.distributed --allreduce-records ... \
        --ddp-records ... --sharded-records ... --accounting-record ... \
        --allreduce-csv ... --ddp-csv ... --sharded-csv ... --accounting-csv ... \
        --allreduce-figure ... --ddp-figure ...
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from cs336_systems.report import figures
from cs336_systems.report.render import bullets, fmt, fmt_ratio, relative_link, render_template
from cs336_systems.report.tables import (ensure_columns, mean_pm_std, records_frame, to_markdown,
                                         write_table)

ALLREDUCE_METRICS = ["allreduce_ms_median", "allreduce_ms_mean", "allreduce_ms_std",
                     "size_bytes", "algbw_gbps", "busbw_gbps"]
DDP_PHASES = ["forward", "backward", "communicate", "optimizer", "step"]
DDP_METRICS = ([f"{p}_ms_{s}" for p in DDP_PHASES for s in ("mean", "std")]
               + ["collective_busy_ms_per_step", "gradient_bytes", "buckets", "parameters",
                  "peak_gib", "trace_file"])
SHARDED_METRICS = ["allocated_gib_after_init", "allocated_gib_before_step",
                   "allocated_gib_after_step", "peak_gib", "parameter_gib", "gradient_gib",
                   "optimizer_state_gib", "step_ms_mean", "step_ms_std", "optimizer_ms_mean",
                   "optimizer_ms_std", "communicate_ms_mean", "forward_backward_ms_mean"]


def _env(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith("env_")]


def allreduce_table(paths: list[str]) -> pd.DataFrame:
    frame = ensure_columns(records_frame(paths), ALLREDUCE_METRICS)
    frame = frame.sort_values(["backend", "world_size", "size_mb"])
    return frame[["backend", "world_size", "size_mb", "status", *ALLREDUCE_METRICS, "message",
                  *_env(frame)]]


def ddp_table(paths: list[str]) -> pd.DataFrame:
    frame = ensure_columns(records_frame(paths), DDP_METRICS + ["bucket_size_mb"])
    order = {"naive": 0, "flat": 1, "overlap": 2, "bucketed": 3, "torch": 4}
    frame["variant_rank"] = frame["variant"].map(order)
    frame = frame.sort_values(["variant_rank", "bucket_size_mb"])
    return frame[["variant", "bucket_size_mb", "size", "context_length", "batch_size",
                  "world_size", "backend", "status", *DDP_METRICS, "message", *_env(frame)]]


def sharded_table(paths: list[str]) -> pd.DataFrame:
    frame = ensure_columns(records_frame(paths), SHARDED_METRICS)
    frame = frame.sort_values("sharded")
    return frame[["sharded", "size", "context_length", "batch_size", "world_size", "backend",
                  "status", *SHARDED_METRICS, "message", *_env(frame)]]


def fit_latency_bandwidth(rows: pd.DataFrame) -> tuple[float | None, float] | None:
    """Fit t = o + bytes / w over the sizes of one (backend, world size), weighting each size
    by 1/t so that the small sizes, which carry o, are not drowned by the large ones.
    Returns (o in ms, or None where the fit's intercept is not positive; w in GB/s), or None
    with fewer than two sizes."""
    rows = rows.dropna(subset=["allreduce_ms_median"])
    if rows["size_bytes"].nunique() < 2:
        return None
    t = rows["allreduce_ms_median"].to_numpy()
    slope, intercept = np.polyfit(rows["size_bytes"], t, 1, w=1.0 / t)
    if slope <= 0:
        return None
    return (intercept if intercept > 0 else None), 1.0 / slope / 1e6  # ms per byte -> GB/s


def _label(row) -> str:
    return (f"bucketed {row['bucket_size_mb']:g} MiB" if row["variant"] == "bucketed"
            else str(row["variant"]))


# --- figures -------------------------------------------------------------------------------

def allreduce_figure(table: pd.DataFrame, path: str | Path) -> None:
    fig, axes = figures.subplots(2)
    ok = table[table["status"] == "ok"]
    for (backend, world), group in ok.groupby(["backend", "world_size"]):
        group = group.sort_values("size_bytes")
        label = f"{backend}, {world} processes"
        axes[0][0].plot(group["size_bytes"] / 1e6, group["allreduce_ms_median"], marker="o", label=label)
        axes[0][1].plot(group["size_bytes"] / 1e6, group["busbw_gbps"], marker="o", label=label)
    axes[0][0].set(xscale="log", yscale="log", xlabel="tensor size (MB)", ylabel="all-reduce (ms)",
                   title="Latency")
    axes[0][1].set(xscale="log", yscale="log", xlabel="tensor size (MB)",
                   ylabel="bus bandwidth (GB/s)", title="Bus bandwidth")
    for ax in axes[0]:
        if ax.lines:
            ax.legend(fontsize=7)
    figures.save(fig, path)


def ddp_figure(table: pd.DataFrame, path: str | Path) -> None:
    ok = table[table["status"] == "ok"]
    fig, axes = figures.subplots(1, width=7.5)
    ax = axes[0][0]
    labels = [_label(r) for _, r in ok.iterrows()]
    bottom = np.zeros(len(ok))
    for phase in ("forward", "backward", "communicate", "optimizer"):
        values = ok[f"{phase}_ms_mean"].fillna(0).to_numpy()
        ax.bar(labels, values, bottom=bottom, label=phase)
        bottom += values
    ax.set(ylabel="time per step (ms)", title="Data-parallel step by phase")
    ax.tick_params(axis="x", rotation=30)
    if len(ok):
        ax.legend(fontsize=7)
    figures.save(fig, path)


# --- writeup -------------------------------------------------------------------------------

def _allreduce_sentences(table: pd.DataFrame) -> list[str]:
    ok = table[table["status"] == "ok"]
    sentences = []
    for (backend, world), group in ok.groupby(["backend", "world_size"]):
        fit = fit_latency_bandwidth(group)
        largest = group.loc[group["size_bytes"].idxmax()]
        text = (f"{backend}, {world} processes: {fmt(largest['busbw_gbps'], 1)} GB/s bus bandwidth "
                f"at {largest['size_mb']:g} MB ({fmt(largest['allreduce_ms_median'], 3)} ms)")
        if fit:
            latency = (f"o = {fmt(fit[0] * 1e3, 0)} us" if fit[0] is not None
                       else "no positive o (the per-call cost is below what these sizes resolve)")
            text += (f"; fitting t = o + bytes / w (weighted 1/t) through the sizes gives "
                     f"{latency} and w = {fmt(fit[1], 1)} GB/s")
        sentences.append(text + ".")
    both = ok.pivot_table(index=["world_size", "size_mb"], columns="backend",
                          values="allreduce_ms_median")
    if {"gloo", "nccl"} <= set(both.columns):
        ratio = (both["gloo"] / both["nccl"]).dropna()
        if len(ratio):
            sentences.append(f"NCCL on GPUs is {fmt_ratio(ratio.min())} to {fmt_ratio(ratio.max())} "
                             f"faster than gloo on CPUs over the {len(ratio)} (size, processes) "
                             "pairs both ran.")
    skipped = table[table["status"] == "skipped"]
    if len(skipped):
        sentences.append("Skipped: " + "; ".join(
            f"{r['backend']} x {r['world_size']} at {r['size_mb']:g} MB ({r['message']})"
            for _, r in skipped.iterrows()) + ".")
    return sentences


def _ddp_display(table: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"variant": [_label(r) for _, r in table.iterrows()],
                        "status": table["status"]})
    for phase in DDP_PHASES:
        out[f"{phase} ms"] = [mean_pm_std(m, s) for m, s in
                              zip(table[f"{phase}_ms_mean"], table[f"{phase}_ms_std"])]
    out["collectives busy ms/step"] = [
        fmt(v, 2) if pd.notna(v) else ("n/a" if status == "ok" else "")
        for v, status in zip(table["collective_busy_ms_per_step"], table["status"])]
    out["trace"] = table["trace_file"].fillna("")
    return out


def _ddp_sentences(table: pd.DataFrame) -> list[str]:
    ok = table[table["status"] == "ok"].copy()
    if ok.empty:
        return ["No DDP variant ran."]
    ok["label"] = [_label(r) for _, r in ok.iterrows()]
    steps = ok.set_index("label")["step_ms_mean"]
    first = ok.iloc[0]
    sentences = [f"Model {first['size']}, context {first['context_length']}, global batch "
                 f"{first['batch_size']} over {first['world_size']} ranks ({first['backend']})."]
    if {"naive", "flat"} <= set(steps.index):
        comm = ok.set_index("label")["communicate_ms_mean"]
        sentences.append(f"One flattened all-reduce instead of one per parameter: communication "
                         f"{fmt(comm['naive'], 1)} -> {fmt(comm['flat'], 1)} ms per step, step "
                         f"{fmt(steps['naive'], 1)} -> {fmt(steps['flat'], 1)} ms.")
    if "naive" in steps.index:
        share = ok.set_index("label").loc["naive"]
        sentences.append(f"The naive step spends {fmt(100 * share['communicate_ms_mean'] / share['step_ms_mean'], 1)}% "
                         "of its time communicating.")
    best = steps.idxmin()
    sentences.append(f"Fastest: {best} at {fmt(steps[best], 1)} ms per step.")
    if "torch" in steps.index:
        ours = steps.drop("torch")
        if len(ours):
            sentences.append(f"torch's DistributedDataParallel: {fmt(steps['torch'], 1)} ms; our best "
                             f"({ours.idxmin()}) takes {fmt_ratio(ours.min() / steps['torch'])} its time.")
    return sentences


def _overhead_model(ddp: pd.DataFrame, allreduce: pd.DataFrame) -> tuple[str, str]:
    """Predicted against measured overhead of bucketed DDP, and the optimal bucket size."""
    ok = ddp[ddp["status"] == "ok"]
    bucketed = ok[ok["variant"] == "bucketed"]
    naive = ok[ok["variant"] == "naive"]
    if bucketed.empty or naive.empty:
        return "_(needs the naive and bucketed DDP records)_", ""
    world, backend = int(bucketed.iloc[0]["world_size"]), bucketed.iloc[0]["backend"]
    fit = fit_latency_bandwidth(allreduce[(allreduce["status"] == "ok")
                                          & (allreduce["backend"] == backend)
                                          & (allreduce["world_size"] == world)])
    if fit is None or fit[0] is None:
        return (f"_(needs {backend} all-reduce records at two or more sizes for {world} "
                "processes, with a resolvable per-call cost o)_", "")
    o_ms, w_gbps = fit
    s_bytes = float(bucketed.iloc[0]["gradient_bytes"])
    n = naive.iloc[0]
    compute_ms = n["forward_ms_mean"] + n["backward_ms_mean"] + n["optimizer_ms_mean"]
    rows, gaps = [], []
    for _, r in bucketed.iterrows():
        n_b = int(r["buckets"])
        predicted = s_bytes / n_b / (w_gbps * 1e6) + n_b * o_ms
        gaps.append(r["step_ms_mean"] - compute_ms - predicted)
        rows.append({"bucket MiB": f"{r['bucket_size_mb']:g}", "buckets n_b": n_b,
                     "predicted overhead ms": fmt(predicted, 2),
                     "measured overhead ms": fmt(r["step_ms_mean"] - compute_ms, 2)})
    slowdown = bucketed["backward_ms_mean"] - n["backward_ms_mean"]
    b_star = math.sqrt(s_bytes * w_gbps * 1e6 * o_ms)  # bytes
    sentences = [
        f"With s = {fmt(s_bytes / 2**20, 1)} MiB of gradients, and o = {fmt(o_ms * 1e3, 0)} us and "
        f"w = {fmt(w_gbps, 1)} GB/s fitted to the {backend} all-reduce records for {world} "
        f"processes, the model predicts the overhead in the table; the measured overhead is the "
        f"bucketed step time minus the naive step's compute phases ({fmt(compute_ms, 1)} ms).",
        f"Optimal bucket size b* = sqrt(s w o) = {fmt(b_star / 2**20, 1)} MiB "
        f"(n_b* = sqrt(s / (w o)) = {fmt(s_bytes / b_star, 1)} buckets).",
        f"The model leaves out that communicating during backward slows backward itself: the "
        f"bucketed backward phase takes {fmt(slowdown.min(), 1)} to {fmt(slowdown.max(), 1)} ms "
        f"longer than the naive one ({fmt(n['backward_ms_mean'], 1)} ms), against a measured-minus-"
        f"predicted gap of {fmt(min(gaps), 1)} to {fmt(max(gaps), 1)} ms.",
    ]
    return to_markdown(pd.DataFrame(rows)), bullets(sentences)


def _sharded(table: pd.DataFrame) -> tuple[str, str]:
    if table.empty:
        return "_(no records)_", ""
    rows = []
    for _, r in table.iterrows():
        rows.append({"optimizer": "sharded" if r["sharded"] else "replicated", "status": r["status"],
                     "after init GiB": fmt(r["allocated_gib_after_init"], 2),
                     "before step GiB": fmt(r["allocated_gib_before_step"], 2),
                     "after step GiB": fmt(r["allocated_gib_after_step"], 2),
                     "peak GiB": fmt(r["peak_gib"], 2),
                     "params GiB": fmt(r["parameter_gib"], 2),
                     "grads GiB": fmt(r["gradient_gib"], 2),
                     "optimizer state GiB (this rank)": fmt(r["optimizer_state_gib"], 2),
                     "step ms": mean_pm_std(r["step_ms_mean"], r["step_ms_std"]),
                     "optimizer ms": mean_pm_std(r["optimizer_ms_mean"], r["optimizer_ms_std"])})
    sentences = []
    ok = table[table["status"] == "ok"].set_index("sharded")
    if {True, False} <= set(ok.index):
        s, rep = ok.loc[True], ok.loc[False]
        sentences.append(f"Optimizer state on rank 0: {fmt(rep['optimizer_state_gib'], 2)} GiB "
                         f"replicated, {fmt(s['optimizer_state_gib'], 2)} GiB sharded "
                         f"({fmt(100 * s['optimizer_state_gib'] / rep['optimizer_state_gib'], 0)}%).")
        if pd.notna(rep["peak_gib"]) and pd.notna(s["peak_gib"]):
            # the flat all-reduce holds a second copy of every gradient while it runs
            known = (rep["parameter_gib"] + 2 * rep["gradient_gib"] + rep["optimizer_state_gib"])
            sentences.append(f"Peak memory {fmt(rep['peak_gib'], 2)} -> {fmt(s['peak_gib'], 2)} GiB. "
                             f"The replicated peak is parameters + gradients + optimizer state + "
                             f"the flat all-reduce's copy of the gradients = "
                             f"{fmt(rep['parameter_gib'], 2)} + {fmt(rep['gradient_gib'], 2)} + "
                             f"{fmt(rep['optimizer_state_gib'], 2)} + {fmt(rep['gradient_gib'], 2)} "
                             f"GiB, plus {fmt(rep['peak_gib'] - known, 2)} GiB of everything else "
                             f"(activations are freed by then, allocator rounding).")
        sentences.append(f"Step time {fmt(rep['step_ms_mean'], 1)} ms replicated, "
                         f"{fmt(s['step_ms_mean'], 1)} ms sharded; the optimizer phase "
                         f"{fmt(rep['optimizer_ms_mean'], 1)} -> {fmt(s['optimizer_ms_mean'], 1)} ms "
                         f"(each rank updates about 1/{int(s['world_size'])} of the parameters, then "
                         "every parameter is broadcast from its owner).")
    return to_markdown(pd.DataFrame(rows)), bullets(sentences)


def _accounting(table: pd.DataFrame) -> str:
    if table.empty or table.iloc[0]["status"] != "ok":
        return "_(no communication_accounting record)_"
    r = table.iloc[0]
    return bullets([
        f"(a) {r['parameters']:.4g} parameters: fp32 master weights {fmt(r['master_weights_gb'], 1)} GB, "
        f"accumulated gradients {fmt(r['gradients_gb'], 1)} GB, AdamW state {fmt(r['optimizer_state_gb'], 1)} GB, "
        f"{fmt(r['fp32_state_gb'], 1)} GB in all, the memory of {fmt(r['h100s_for_fp32_state'], 1)} "
        f"{fmt(r['gpu_memory_gb'], 0)} GB H100s. Activations saved for backward (bf16 inputs of both "
        f"linears per block): {fmt(r['activation_mb_per_token'], 2)} MB per token.",
        f"(b) Sharding state and half the activations over N devices: "
        f"{fmt(r['fp32_state_gb'], 1)} GB / N + A / (2N) + A / 2 per device, A the activation memory; "
        f"the state alone fits a {fmt(r['tpu_memory_gb'], 0)} GB TPU v5p from N = {int(r['fsdp_degree_to_fit_tpu'])}.",
        f"(c) C / W_ici = {fmt(r['flops_per_ici_byte'], 0)} FLOPs per byte; with M_X = "
        f"{int(r['mesh_multiplicity_x'])}, X = {int(r['fsdp_degree_x'])}, Y = {int(r['tp_degree_y'])}, the "
        f"forward pass is compute bound from a per-device batch of {fmt(r['compute_bound_per_device_batch'], 1)} "
        f"tokens, an overall batch of {fmt(r['compute_bound_overall_batch'], 0)} tokens over "
        f"{int(r['devices'])} devices (and Y stays under F W M_Y / C = {fmt(r['max_tp_degree_compute_bound'], 1)}).",
    ])


def render(allreduce: pd.DataFrame, ddp: pd.DataFrame, sharded: pd.DataFrame,
           accounting: pd.DataFrame, allreduce_figure_path: str, ddp_figure_path: str,
           writeup_path: str) -> str:
    display = allreduce.assign(
        **{"size MB": allreduce["size_mb"].map(lambda v: f"{v:g}"),
           "median ms": allreduce["allreduce_ms_median"].map(lambda v: fmt(v, 3)),
           "algbw GB/s": allreduce["algbw_gbps"].map(lambda v: fmt(v, 2)),
           "busbw GB/s": allreduce["busbw_gbps"].map(lambda v: fmt(v, 2))}
    )[["backend", "world_size", "size MB", "status", "median ms", "algbw GB/s", "busbw GB/s"]]
    overhead_table, overhead_sentences = _overhead_model(ddp, allreduce)
    sharded_table_md, sharded_sentences = _sharded(sharded)
    return render_template(
        "distributed.md",
        allreduce_table=to_markdown(display),
        allreduce_findings=bullets(_allreduce_sentences(allreduce)),
        allreduce_figure=relative_link(allreduce_figure_path, writeup_path),
        ddp_table=to_markdown(_ddp_display(ddp)),
        ddp_findings=bullets(_ddp_sentences(ddp)),
        ddp_figure=relative_link(ddp_figure_path, writeup_path),
        trace_dir=relative_link(Path(allreduce_figure_path).parent.parent / "ddp", writeup_path),
        overhead_table=overhead_table,
        overhead_findings=overhead_sentences,
        sharded_table=sharded_table_md,
        sharded_findings=sharded_sentences,
        accounting=_accounting(accounting),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("allreduce-records", "ddp-records", "sharded-records"):
        parser.add_argument(f"--{name}", nargs="+", required=True)
    parser.add_argument("--accounting-record", required=True)
    for name in ("allreduce-csv", "ddp-csv", "sharded-csv", "accounting-csv",
                 "allreduce-figure", "ddp-figure"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args(argv)
    allreduce = allreduce_table(args.allreduce_records)
    ddp = ddp_table(args.ddp_records)
    write_table(allreduce, args.allreduce_csv)
    write_table(ddp, args.ddp_csv)
    write_table(sharded_table(args.sharded_records), args.sharded_csv)
    accounting = records_frame([args.accounting_record])
    write_table(accounting, args.accounting_csv)
    allreduce_figure(allreduce, args.allreduce_figure)
    ddp_figure(ddp, args.ddp_figure)


if __name__ == "__main__":
    main()
