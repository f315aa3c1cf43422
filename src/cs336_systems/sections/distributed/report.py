"""Distributed data parallel (§5) and sharding (§6): tables, figures and the section's facts.

`build(records, options, outputs)` reads the all-reduce, DDP (and the DDP check against
single-process training), sharded-optimizer and communication-accounting records, writes their
tables (CSV) and three figures, and returns the facts that `template.md.j2` turns
into the section: every number, ratio and verdict of the prose is computed here. The DDP
overlap figure and numbers come from the records alone: the experiment reduced rank 0's trace
to them on the GPU machine (the traces stay out of git). `options["assignment"]` is the assignment's own matrix
(the config's `defaults.distributed`): what of it this preset leaves out goes into the coverage
notes.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from cs336_systems.distributed.launch import backend_for
from cs336_systems.distributed.variants import DDP_VARIANTS, TRAINING_PHASES
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.sizes import size_label
from cs336_systems.records import read_record
from cs336_systems.report import figures, tables
from cs336_systems.report.facts import covered, jsonable, not_ok, number, speedup
from cs336_systems.report.render import fmt

ALLREDUCE_METRICS = ["allreduce_ms_median", "allreduce_ms_mean", "allreduce_ms_std",
                     "size_bytes", "algbw_gbps", "busbw_gbps"]
DDP_PHASES = [*TRAINING_PHASES, "step"]  # each phase, and the whole step
OVERLAP_METRICS = ["collective_busy_ms_per_step", "compute_busy_ms_per_step",
                   "collective_hidden_ms_per_step", "collective_hidden_fraction"]
DDP_METRICS = ([f"{p}_ms_{s}" for p in DDP_PHASES for s in ("mean", "std")] + OVERLAP_METRICS
               + ["profile_steps", "gradient_bytes", "buckets", "parameters", "peak_gib",
                  "trace_file"])
# The sharded optimizer's memory windows: (key, what the prose calls it), in order.
MEMORY_WINDOWS = [("init", "building the model and optimizer"),
                  ("before_step", "forward, backward and all-reduce, up to the step"),
                  ("step", "the optimizer step")]
MEMORY_METRICS = ["peak_gib_init", "allocated_gib_after_init", "peak_gib_before_step",
                  "allocated_gib_before_step", "peak_gib_step", "allocated_gib_after_step"]
SHARDED_METRICS = MEMORY_METRICS + [
    "peak_gib", "parameter_gib", "gradient_gib", "optimizer_state_gib", "step_ms_mean",
    "step_ms_std", "optimizer_ms_mean", "optimizer_ms_std", "communicate_ms_mean",
    "forward_backward_ms_mean"]
ACCOUNTING_METRICS = ["parameters", "master_weights_gb", "gradients_gb", "optimizer_state_gb",
                      "fp32_state_gb", "activation_mb_per_token", "h100s_for_fp32_state",
                      "fsdp_degree_to_fit_tpu", "flops_per_ici_byte",
                      "compute_bound_per_device_batch", "compute_bound_overall_batch",
                      "max_tp_degree_compute_bound", "devices"]
ACCOUNTING_INPUTS = ["gpu_memory_gb", "tpu_memory_gb", "mesh_multiplicity_x", "fsdp_degree_x",
                     "tp_degree_y"]
MIB = 2**20
# The assignment's DDP and sharding runs are on GPUs: the backend a CUDA device gets.
GPU_BACKEND = backend_for("cuda")
SIZE_ORDER = {size: i for i, size in enumerate(MODEL_SIZES)}


def edition_name(size: str) -> str:
    """A size as the writeup names it (`lm.sizes.size_label`: 2026's xl, 2025's xl-2025)."""
    return size_label(size)



def _int(value) -> int | None:
    """A plain int, or None for a missing value."""
    return None if value is None or pd.isna(value) else int(value)


def _sizes(values) -> str:
    """[2, 4] -> '2 and 4'; [1, 10, 100] -> '1, 10 and 100'; names as they are."""
    items = [f"{v:g}" if isinstance(v, (int, float)) else str(v) for v in values]
    return " and ".join(items) if len(items) < 3 else ", ".join(items[:-1]) + " and " + items[-1]


# --- tables --------------------------------------------------------------------------------

def allreduce_table(paths: list[str]) -> pd.DataFrame:
    frame = tables.ensure_columns(tables.records_frame(paths), ["backend", "world_size", "size_mb"]
                           + ALLREDUCE_METRICS)
    frame = frame.sort_values(["backend", "world_size", "size_mb"], ignore_index=True)
    return frame[["backend", "world_size", "size_mb", "status", *ALLREDUCE_METRICS, "message",
                  *tables.env_columns(frame)]]


def ddp_table(paths: list[str]) -> pd.DataFrame:
    """One row per DDP run: by model size, then in the order of `DDP_VARIANTS`, bucketed runs
    by bucket size."""
    frame = tables.ensure_columns(tables.records_frame(paths), DDP_METRICS + ["bucket_size_mb"])
    frame["variant_rank"] = frame["variant"].map({v: i for i, v in enumerate(DDP_VARIANTS)})
    frame["size_rank"] = frame["size"].map(SIZE_ORDER)
    frame = frame.sort_values(["size_rank", "variant_rank", "bucket_size_mb"], ignore_index=True)
    frame["label"] = [_label(r) for _, r in frame.iterrows()]
    return frame[["variant", "bucket_size_mb", "label", "size", "context_length", "batch_size",
                  "world_size", "backend", "status", *DDP_METRICS, "message", *tables.env_columns(frame)]]


def timelines(paths: list[str]) -> dict[tuple[str, str], dict]:
    """(size, label) -> the `timeline` of one profiled step, of the DDP records that have one."""
    out = {}
    for path in paths:
        record = read_record(path)
        if record["status"] == "ok" and record["metrics"].get("timeline"):
            out[(record["config"]["size"], _label(record["config"]))] = \
                record["metrics"]["timeline"]
    return out


def memory_per_rank(paths: list[str]) -> dict[bool, list[dict]]:
    """sharded (True/False) -> each rank's memory readings, of the records that have them."""
    out = {}
    for path in paths:
        record = read_record(path)
        if record["status"] == "ok" and record["metrics"].get("memory_per_rank"):
            out[bool(record["config"]["sharded"])] = record["metrics"]["memory_per_rank"]
    return out


def sharded_table(paths: list[str]) -> pd.DataFrame:
    frame = tables.ensure_columns(tables.records_frame(paths), SHARDED_METRICS)
    frame = frame.sort_values("sharded", ignore_index=True)
    return frame[["sharded", "size", "context_length", "batch_size", "world_size", "backend",
                  "status", *SHARDED_METRICS, "message", *tables.env_columns(frame)]]


def accounting_table(paths: list[str]) -> pd.DataFrame:
    return tables.ensure_columns(tables.records_frame(paths),
                                 ACCOUNTING_INPUTS + ACCOUNTING_METRICS)


def fit_latency_bandwidth(rows: pd.DataFrame) -> tuple[float | None, float] | None:
    """Fit t = o + bytes / w over the sizes of one (backend, world size), weighting each size
    by 1/t so that the small sizes, which carry o, are not drowned by the large ones.
    Returns (o in ms, or None where the fit's intercept is not positive; w in GB/s), or None
    with fewer than two sizes."""
    rows = rows.dropna(subset=["allreduce_ms_median"])
    if rows["size_bytes"].nunique() < 2:
        return None
    t = rows["allreduce_ms_median"].to_numpy(dtype=float)
    slope, intercept = np.polyfit(rows["size_bytes"].to_numpy(dtype=float), t, 1, w=1.0 / t)
    if slope <= 0:
        return None
    return (float(intercept) if intercept > 0 else None), 1.0 / slope / 1e6  # ms/byte -> GB/s


# ddp_bucketed_benchmarking (a) asks what setup would show the bucket size mattering: the same
# model on two nodes over a 100 Gb/s network, where the all-reduce moves 12.5 GB/s.
SLOW_LINK_GBPS = 12.5


def overhead_ms(s_bytes: float, buckets: int, o_ms: float, w_gbps: float) -> float:
    """The bucketed DDP overhead model: the last bucket's transfer plus a fixed cost per
    bucket, s / (n_b w) + n_b o, in ms."""
    return s_bytes / buckets / (w_gbps * 1e6) + buckets * o_ms


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
        megabytes = group["size_bytes"] / 1e6
        axes[0][0].plot(megabytes, group["allreduce_ms_median"], marker="o", label=label)
        axes[0][1].plot(megabytes, group["busbw_gbps"], marker="o", label=label)
    axes[0][0].set(xscale="log", yscale="log", xlabel="tensor size (MB)",
                   ylabel="all-reduce (ms)", title="Latency")
    axes[0][1].set(xscale="log", yscale="log", xlabel="tensor size (MB)",
                   ylabel="bus bandwidth (GB/s)", title="Bus bandwidth")
    for ax in axes[0]:
        if ax.lines:
            ax.legend(fontsize=7)
    figures.save(fig, path)


def ddp_figure(table: pd.DataFrame, path: str | Path) -> None:
    ok = table[table["status"] == "ok"]
    several = ok["size"].nunique() > 1
    labels = [f"{r['size']} {r['label']}" if several else r["label"] for _, r in ok.iterrows()]
    fig, axes = figures.subplots(1, width=7.5)
    ax = axes[0][0]
    bottom = np.zeros(len(ok))
    for phase in ("forward", "backward", "communicate", "optimizer"):
        values = ok[f"{phase}_ms_mean"].fillna(0).to_numpy(dtype=float)
        ax.bar(labels, values, bottom=bottom, label=phase)
        bottom += values
    ax.set(ylabel="time per step (ms)", title="Data-parallel step by phase")
    ax.tick_params(axis="x", rotation=30)
    if len(ok):
        ax.legend(fontsize=7)
    figures.save(fig, path)


def overlap_figure(table: pd.DataFrame, steps: dict[tuple[str, str], dict],
                   path: str | Path) -> None:
    """One row per DDP run with a timeline: compute (lower lane) and collectives (upper lane)
    over one profiled step, the phases' device spans shaded, the hidden fraction in the title."""
    rows = [(r, steps[(r["size"], r["label"])]) for _, r in table.iterrows()
            if (r["size"], r["label"]) in steps]
    fig, axes = figures.subplots(1, max(len(rows), 1), width=7.5, height=0.95)
    several = len({r["size"] for r, _ in rows}) > 1
    longest = max((t["step_ms"] for _, t in rows), default=1.0)
    for ax, (row, t) in zip(axes[:, 0], rows):
        for phase, (start, end) in t["phases"].items():
            if phase != "forward":
                ax.axvline(start, color="0.6", linewidth=0.6)
            if end - start > 0.06 * longest:  # room for its name
                ax.text((start + end) / 2, 2.05, phase, ha="center", va="bottom", fontsize=6,
                        color="0.35")
        for lane, key, color in ((0, "compute", "tab:blue"), (1, "collective", "tab:orange")):
            spans = [(s, e - s) for s, e in t[key]]
            ax.broken_barh(spans, (lane + 0.1, 0.8), facecolors=color, linewidth=0)
        fraction = row["collective_hidden_fraction"]
        hidden = f"{fraction:.0%} of collective time under compute" if pd.notna(fraction) else ""
        name = f"{row['size']} {row['label']}" if several else row["label"]
        ax.set_title(f"{name}: {hidden}", fontsize=7, loc="left", pad=9)
        ax.set(xlim=(0, longest), ylim=(0, 2.6), yticks=[0.5, 1.5])
        ax.set_yticklabels(["compute", "NCCL"], fontsize=6)
        ax.tick_params(axis="x", labelsize=6)
        ax.grid(False)
    axes[-1][0].set_xlabel("ms from the step's first kernel (rank 0, one profiled step)",
                           fontsize=7)
    if not rows:
        axes[0][0].text(0.5, 0.5, "no DDP record has a profiled timeline", ha="center",
                        va="center", transform=axes[0][0].transAxes)
    figures.save(fig, path)


# --- facts: all-reduce ---------------------------------------------------------------------

def _allreduce_display(table: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "backend": table["backend"], "world_size": table["world_size"],
        "size MB": table["size_mb"].map(lambda v: f"{v:g}"), "status": table["status"],
        "median ms": table["allreduce_ms_median"].map(lambda v: fmt(v, 3)),
        "algbw GB/s": table["algbw_gbps"].map(lambda v: fmt(v, 2)),
        "busbw GB/s": table["busbw_gbps"].map(lambda v: fmt(v, 2))})


def allreduce_facts(table: pd.DataFrame) -> dict:
    """Per (backend, world size): the largest size's bus bandwidth and the fitted o and w;
    NCCL against gloo where both ran; what did not run."""
    ok = table[table["status"] == "ok"]
    runs = []
    for (backend, world), group in ok.groupby(["backend", "world_size"]):
        largest = group.loc[group["size_bytes"].idxmax()]
        fit = fit_latency_bandwidth(group)
        runs.append({
            "backend": backend, "world_size": int(world), "sizes": int(len(group)),
            "largest_size_mb": float(largest["size_mb"]),
            "largest_busbw_gbps": number(largest["busbw_gbps"]),
            "largest_median_ms": number(largest["allreduce_ms_median"]),
            "fit": None if fit is None else {
                "o_ms": fit[0], "o_us": None if fit[0] is None else fit[0] * 1e3,
                "w_gbps": fit[1]},
        })
    both = ok.pivot_table(index=["world_size", "size_mb"], columns="backend",
                          values="allreduce_ms_median")
    nccl_vs_gloo = None
    if {"gloo", "nccl"} <= set(both.columns):
        ratio = (both["gloo"] / both["nccl"]).dropna()  # above 1: NCCL is faster
        if len(ratio):
            low, high = float(ratio.min()), float(ratio.max())
            nccl_vs_gloo = {
                "pairs": int(len(ratio)), "ratio_min": low, "ratio_max": high,
                "word": "faster" if low > 1 else "slower" if high < 1 else "mixed",
                # the factors of a sentence: "Ax to Bx faster" or "Ax to Bx slower"
                "factor_min": low if low > 1 else 1 / high,
                "factor_max": high if low > 1 else 1 / low,
                # NCCL's time as a fraction of gloo's, for a "mixed" sentence
                "time_fraction_min": 1 / high, "time_fraction_max": 1 / low}
    return {
        "table": tables.to_markdown(_allreduce_display(table)),
        "runs": runs,
        "nccl_vs_gloo": nccl_vs_gloo,
        "rank_scaling": rank_scaling(ok),
        "not_measured": not_ok(table.assign(run=[
            f"{r['backend']} x {r['world_size']} at {r['size_mb']:g} MB"
            for _, r in table.iterrows()]), ["run"]),
        "world_sizes": sorted(int(w) for w in set(ok["world_size"])),
        "sizes_mb": sorted(float(s) for s in set(ok["size_mb"])),
    }


def rank_scaling(ok: pd.DataFrame) -> list[dict]:
    """Per backend, each larger world size against the smallest: how the median time and the
    bus bandwidth change over the sizes both ran. A ring all-reduce sends 2(n-1)/n of the data
    per rank, so where the links alone set the time it grows by that factor's ratio
    (`ring_time_ratio`) and the bus bandwidth stays flat."""
    out = []
    for backend, group in ok.groupby("backend"):
        worlds = sorted(int(w) for w in set(group["world_size"]))
        by = group.assign(world_size=group["world_size"].astype(int)).pivot_table(
            index="size_mb", columns="world_size",
            values=["allreduce_ms_median", "busbw_gbps"])
        for world in worlds[1:]:
            base = worlds[0]
            pair = by.dropna(subset=[("allreduce_ms_median", base),
                                     ("allreduce_ms_median", world)])
            if pair.empty:
                continue
            time = pair[("allreduce_ms_median", world)] / pair[("allreduce_ms_median", base)]
            busbw = pair[("busbw_gbps", world)] / pair[("busbw_gbps", base)]
            largest = pair.index.max()
            out.append({
                "backend": backend, "from": base, "to": world, "sizes": int(len(pair)),
                "time_ratio_min": float(time.min()), "time_ratio_max": float(time.max()),
                "busbw_ratio_min": float(busbw.min()), "busbw_ratio_max": float(busbw.max()),
                "ring_time_ratio": ((world - 1) / world) / ((base - 1) / base),
                "largest_size_mb": float(largest),
                "largest_ms": [float(pair.loc[largest, ("allreduce_ms_median", w)])
                               for w in (base, world)],
                "largest_busbw_gbps": [float(pair.loc[largest, ("busbw_gbps", w)])
                                       for w in (base, world)]})
            ring, largest_ratio = out[-1]["ring_time_ratio"], float(time.loc[largest])
            out[-1].update(largest_time_ratio=largest_ratio,
                           against_ring="less" if largest_ratio < ring else "more")
    return out


# --- facts: DDP ----------------------------------------------------------------------------

def _ddp_display(table: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"model": table["size"], "variant": table["label"],
                        "status": table["status"]})
    for phase in DDP_PHASES:
        out[f"{phase} ms"] = [tables.mean_pm_std(m, s) for m, s in
                              zip(table[f"{phase}_ms_mean"], table[f"{phase}_ms_std"])]
    # n/a: the run finished but its record has no such metric
    out["collectives busy ms/step"] = [
        fmt(v, 2) if pd.notna(v) else ("n/a" if status == "ok" else "")
        for v, status in zip(table["collective_busy_ms_per_step"], table["status"])]
    out["hidden under compute"] = [f"{v:.0%}" if pd.notna(v) else ""
                                   for v in table["collective_hidden_fraction"]]
    out["profiled steps"] = [
        str(int(v)) if pd.notna(v) else ("n/a" if status == "ok" else "")
        for v, status in zip(table["profile_steps"], table["status"])]
    out["trace"] = [v if pd.notna(v) else "" for v in table["trace_file"]]
    return out


def _step(row: pd.Series, phase: str = "step") -> dict:
    return {"label": row["label"], "ms": number(row[f"{phase}_ms_mean"]),
            "std": number(row[f"{phase}_ms_std"])}


def _compare(time: dict, reference: dict) -> dict | None:
    """speedup() of two {ms, std} facts: above 1, `time` is faster than `reference`."""
    return speedup(time["ms"], reference["ms"], time["std"], reference["std"])


def _sizes_of(ok: pd.DataFrame) -> list[str]:
    return sorted(set(ok["size"]), key=lambda size: SIZE_ORDER.get(size, len(SIZE_ORDER)))


def ddp_facts(table: pd.DataFrame) -> dict:
    """The DDP runs' facts, one entry of `sizes` per model size (each edition's xl), and what
    the records lack."""
    ok = table[table["status"] == "ok"]
    several = ok["size"].nunique() > 1
    named = [f"{r['size']} {r['label']}" if several else r["label"] for _, r in ok.iterrows()]
    busy_missing = [n for n, (_, r) in zip(named, ok.iterrows())
                    if pd.isna(r["collective_busy_ms_per_step"])]
    steps_missing = [n for n, (_, r) in zip(named, ok.iterrows()) if pd.isna(r["profile_steps"])]
    return {
        "table": tables.to_markdown(_ddp_display(table)),
        "sizes": [size_facts(ok[ok["size"] == size]) for size in _sizes_of(ok)],
        "runs": len(ok),
        # runs whose records have no collective busy time / no count of profiled steps
        "collective_busy_missing": busy_missing,
        # the distinct numbers of profiled steps the finished runs recorded
        "profile_steps": sorted({int(v) for v in ok["profile_steps"].dropna()}),
        "profile_steps_missing": steps_missing,
        "traces": [r["trace_file"] for _, r in ok.iterrows() if pd.notna(r["trace_file"])],
        "not_measured": not_ok(table.assign(run=[f"{r['size']} {r['label']}"
                                                 for _, r in table.iterrows()]), ["run"]),
    }


def _overlap(row: pd.Series) -> dict:
    """What rank 0's profile says of one run: per step, the time collectives ran, other device
    work ran, and both at once, and the exposed communication after backward."""
    return {"label": row["label"], "variant": row["variant"],
            "collective_busy_ms": number(row["collective_busy_ms_per_step"]),
            "compute_busy_ms": number(row["compute_busy_ms_per_step"]),
            "hidden_ms": number(row["collective_hidden_ms_per_step"]),
            "hidden_fraction": number(row["collective_hidden_fraction"]),
            "exposed": _step(row, "communicate")}


def size_facts(ok: pd.DataFrame) -> dict:
    """One model size's finished DDP runs: setup, naive against flat, overlap, the fastest,
    ours against torch's, and the overlap evidence from the profiles."""
    by_label = ok.set_index("label", drop=False)
    first = ok.iloc[0]
    setup = {k: (first[k] if k in ("size", "backend") else int(first[k]))
             for k in ("size", "context_length", "batch_size", "world_size", "backend")}
    variants = [{"label": r["label"], "variant": r["variant"], "status": r["status"],
                 "step": _step(r), "communicate": _step(r, "communicate"),
                 "backward": _step(r, "backward"),
                 "collective_busy_ms": number(r["collective_busy_ms_per_step"]),
                 "profile_steps": _int(r["profile_steps"])}
                for _, r in ok.iterrows()]

    naive_vs_flat = None
    if {"naive", "flat"} <= set(by_label.index):
        naive, flat = by_label.loc["naive"], by_label.loc["flat"]
        naive_vs_flat = {
            "naive_communicate": _step(naive, "communicate"),
            "flat_communicate": _step(flat, "communicate"),
            "naive_step": _step(naive), "flat_step": _step(flat),
            # above 1: the flat variant is faster
            "communicate": _compare(_step(flat, "communicate"), _step(naive, "communicate")),
            "step": _compare(_step(flat), _step(naive))}
    naive_share = None
    if "naive" in by_label.index:
        naive = by_label.loc["naive"]
        naive_share = {"fraction": naive["communicate_ms_mean"] / naive["step_ms_mean"],
                       "communicate_ms": naive["communicate_ms_mean"],
                       "step_ms": naive["step_ms_mean"]}

    # Where all communication follows backward (naive, flat), the profile's collective time
    # and the timed `communicate` phase measure the same calls two ways; say how they differ.
    busy_vs_timed = []
    for label in ("naive", "flat"):
        if label in by_label.index and pd.notna(by_label.loc[label,
                                                          "collective_busy_ms_per_step"]):
            row = by_label.loc[label]
            busy, timed = row["collective_busy_ms_per_step"], row["communicate_ms_mean"]
            busy_vs_timed.append({"label": label, "busy_ms": number(busy),
                                  "timed_ms": number(timed),
                                  "difference_ms": number(abs(busy - timed)),
                                  "word": "more" if busy > timed else "less"})

    overlap = None
    if "overlap" in by_label.index:
        row = by_label.loc["overlap"]
        refs = [ref for ref in ("naive", "flat") if ref in by_label.index]
        overlap = {"step": _step(row), "communicate": _step(row, "communicate"),
                   "backward": _step(row, "backward"),
                   # above 1: the overlapped variant is faster
                   "vs": {ref: _compare(_step(row), _step(by_label.loc[ref])) for ref in refs},
                   "reference": None}
        if refs:  # its backward and exposed communication against naive's (else flat's)
            ref = by_label.loc[refs[0]]
            overlap["reference"] = {
                "label": refs[0], "backward": _step(ref, "backward"),
                "communicate": _step(ref, "communicate"),
                "backward_vs": _compare(_step(row, "backward"), _step(ref, "backward"))}

    ranked = ok.dropna(subset=["step_ms_mean"]).sort_values("step_ms_mean")
    fastest = None
    if len(ranked):
        best = _step(ranked.iloc[0])
        runner_up = _step(ranked.iloc[1]) if len(ranked) > 1 else None
        fastest = {**best, "runner_up": runner_up,
                   # above 1 never: how much slower the next variant is than the fastest
                   "runner_up_vs_fastest": _compare(runner_up, best) if runner_up else None}
    vs_torch = None
    ours = ranked[ranked["variant"] != "torch"]
    if "torch" in by_label.index and len(ours):
        best, torch_ddp = _step(ours.iloc[0]), _step(by_label.loc["torch"])
        vs_torch = {"ours": best, "torch": torch_ddp, "speedup": _compare(best, torch_ddp)}

    evidence = [_overlap(r) for _, r in ok.iterrows()
                if pd.notna(r["collective_hidden_fraction"])]
    return {
        "size": setup["size"], "name": edition_name(setup["size"]),
        "setup": setup,
        "variants": variants,
        "naive_vs_flat": naive_vs_flat,
        "naive_communication_share": naive_share,
            "busy_vs_timed": busy_vs_timed,
        "overlap": overlap,
        "fastest": fastest,
        "vs_torch": vs_torch,
        # per run, from its profile: the collective time hidden under compute
        "evidence": evidence,
        "evidence_table": tables.to_markdown(pd.DataFrame([{
            "variant": e["label"],
            "collectives ms/step": fmt(e["collective_busy_ms"], 2),
            "compute ms/step": fmt(e["compute_busy_ms"], 2),
            "both at once ms/step": fmt(e["hidden_ms"], 2),
            "hidden under compute": f"{e['hidden_fraction']:.0%}",
            "exposed after backward ms": tables.mean_pm_std(e["exposed"]["ms"],
                                                            e["exposed"]["std"]),
        } for e in evidence])) if evidence else "",
    }


def overhead_facts(ddp: pd.DataFrame, allreduce: pd.DataFrame) -> dict:
    """The bucketed DDP overhead model against each size's bucketed runs."""
    ok = ddp[ddp["status"] == "ok"]
    sizes = [size_overhead(ok[ok["size"] == size], allreduce) for size in _sizes_of(ok)
             if (ok[ok["size"] == size]["variant"] == "bucketed").any()]
    return {"sizes": sizes, "available": any(s["available"] for s in sizes),
            "needs": "; ".join(s["needs"] for s in sizes if s["needs"])
                     or "the bucketed DDP records"}


def size_overhead(ok: pd.DataFrame, allreduce: pd.DataFrame) -> dict:
    """Predicted against measured overhead of bucketed DDP for one model size, and the optimal
    bucket size.

    Predicted: s / (n_b w) + n_b o, the time after backward to send the last bucket plus a
    fixed cost per bucket, with o and w fitted to the all-reduce records of the same backend
    and world size. Measured, in the same run: its `communicate` phase, the wait for the
    all-reduces after its own backward has finished (step minus the run's own forward,
    backward and optimizer). What the model leaves out, also measured: how much longer the
    run's backward takes than naive DDP's (same size, no communication during backward), and
    how much of the collective time ran under compute (the run's profile)."""
    bucketed = ok[ok["variant"] == "bucketed"]
    naive = ok[ok["variant"] == "naive"]
    size = str(bucketed.iloc[0]["size"])
    world, backend = int(bucketed.iloc[0]["world_size"]), str(bucketed.iloc[0]["backend"])
    facts = {"size": size, "name": edition_name(size), "backend": backend,
             "world_size": world, "available": False, "needs": ""}
    fit = fit_latency_bandwidth(allreduce[(allreduce["status"] == "ok")
                                          & (allreduce["backend"] == backend)
                                          & (allreduce["world_size"] == world)])
    if fit is None or fit[0] is None:
        needs = (f"{backend} all-reduce records at two or more sizes for {world} processes, "
                 "with a resolvable per-call cost o")
        return {**facts, "needs": needs, "table": f"_(needs {needs})_"}
    o_ms, w_gbps = fit
    s_bytes = float(bucketed.iloc[0]["gradient_bytes"])
    naive_backward = _step(naive.iloc[0], "backward") if len(naive) else None
    rows = []
    for _, r in bucketed.iterrows():
        n_b = int(r["buckets"])
        predicted = overhead_ms(s_bytes, n_b, o_ms, w_gbps)
        measured, backward = _step(r, "communicate"), _step(r, "backward")
        gap = measured["ms"] - predicted
        inside = abs(gap) <= measured["std"]
        rows.append({
            "bucket_mib": float(r["bucket_size_mb"]), "buckets": n_b,
            "predicted_ms": predicted, "last_bucket_ms": s_bytes / n_b / (w_gbps * 1e6),
            "per_call_ms": n_b * o_ms,
            "measured": measured, "gap_ms": gap,
            "verdict": "inside the spread" if inside else "above" if gap > 0 else "below",
            "factor": measured["ms"] / predicted if predicted > 0 else None,
            "backward": backward,
            "backward_slowdown_ms": backward["ms"] - naive_backward["ms"]
            if naive_backward else None,
            "hidden_fraction": number(r["collective_hidden_fraction"]),
            "collective_busy_ms": number(r["collective_busy_ms_per_step"])})
    b_star = math.sqrt(s_bytes * w_gbps * 1e6 * o_ms)  # bytes
    display = pd.DataFrame({
        "bucket MiB": [f"{r['bucket_mib']:g}" for r in rows],
        "buckets n_b": [r["buckets"] for r in rows],
        "predicted ms": [fmt(r["predicted_ms"], 2) for r in rows],
        "measured after backward ms": [tables.mean_pm_std(r["measured"]["ms"], r["measured"]["std"])
                                       for r in rows],
        "measured - predicted ms": [fmt(r["gap_ms"], 2) for r in rows],
        "backward vs naive ms": [fmt(r["backward_slowdown_ms"], 1) for r in rows],
        "collectives under compute": [f"{r['hidden_fraction']:.0%}"
                                      if r["hidden_fraction"] is not None else ""
                                      for r in rows]})
    off = [r for r in rows if r["verdict"] != "inside the spread"]
    slowdowns = [r["backward_slowdown_ms"] for r in rows if r["backward_slowdown_ms"] is not None]
    # (a): how much the bucket size changed the wait after backward, against its noise, and
    # what the same model predicts on a slow link, where it would matter
    waits = [r["measured"]["ms"] for r in rows]
    noise = max(r["measured"]["std"] for r in rows)
    slow = [{"bucket_mib": r["bucket_mib"],
             "predicted_ms": overhead_ms(s_bytes, r["buckets"], o_ms, SLOW_LINK_GBPS)}
            for r in rows]
    slow_b_star = math.sqrt(s_bytes * SLOW_LINK_GBPS * 1e6 * o_ms)
    expectation = {
        "wait_min_ms": min(waits), "wait_max_ms": max(waits),
        "wait_range_ms": max(waits) - min(waits), "noise_ms": noise,
        "predicted_min_ms": min(r["predicted_ms"] for r in rows),
        "predicted_max_ms": max(r["predicted_ms"] for r in rows),
        "resolved": (max(waits) - min(waits)) > 2 * noise,
        "slow_link": {"w_gbps": SLOW_LINK_GBPS,
                      "best": min(slow, key=lambda x: x["predicted_ms"]),
                      "worst": max(slow, key=lambda x: x["predicted_ms"]),
                      "b_star_mib": slow_b_star / MIB}}
    return {
        **facts, "available": True,
        "table": tables.to_markdown(display),
        "rows": rows,
        "fits": [r for r in rows if r["verdict"] == "inside the spread"],
        "above": [r for r in off if r["verdict"] == "above"],
        "below": [r for r in off if r["verdict"] == "below"],
        "o_ms": o_ms, "o_us": o_ms * 1e3, "w_gbps": w_gbps,
        "s_bytes": s_bytes, "s_mib": s_bytes / MIB,
        "naive_backward": naive_backward,
        "b_star_bytes": b_star, "b_star_mib": b_star / MIB, "n_b_star": s_bytes / b_star,
        "backward_slowdown_min_ms": min(slowdowns) if slowdowns else None,
        "backward_slowdown_max_ms": max(slowdowns) if slowdowns else None,
        "expectation": expectation,
    }


# --- facts: sharding -----------------------------------------------------------------------

def _sharded_display(table: pd.DataFrame) -> pd.DataFrame:
    """Times, one row per optimizer."""
    return pd.DataFrame([{
        "optimizer": "sharded" if r["sharded"] else "replicated", "status": r["status"],
        "step ms": tables.mean_pm_std(r["step_ms_mean"], r["step_ms_std"]),
        "optimizer ms": tables.mean_pm_std(r["optimizer_ms_mean"], r["optimizer_ms_std"]),
        "params GiB": fmt(r["parameter_gib"], 2),
        "grads GiB": fmt(r["gradient_gib"], 2),
        "optimizer state GiB (rank 0)": fmt(r["optimizer_state_gib"], 2),
    } for _, r in table.iterrows()])


def _memory_display(per_rank: dict[bool, list[dict]]) -> pd.DataFrame:
    """Allocator readings, one row per optimizer and rank."""
    return pd.DataFrame([{
        "optimizer": "sharded" if sharded else "replicated", "rank": rank,
        "init peak GiB": fmt(m["peak_gib_init"], 2),
        "after init GiB": fmt(m["allocated_gib_after_init"], 2),
        "peak to step GiB": fmt(m["peak_gib_before_step"], 2),
        "before step GiB": fmt(m["allocated_gib_before_step"], 2),
        "step peak GiB": fmt(m["peak_gib_step"], 2),
        "after step GiB": fmt(m["allocated_gib_after_step"], 2),
        "optimizer state GiB": fmt(m["optimizer_state_gib"], 2),
    } for sharded in (False, True) if sharded in per_rank
        for rank, m in enumerate(per_rank[sharded])])


def _memory(row: pd.Series) -> dict:
    """Rank 0's allocator readings and what the tensors account for in each window's peak:
    parameters + gradients + optimizer state (`state_gib`, what every window after the first
    step holds) and the rest (`above_state_gib`: activations and the flat all-reduce's copy
    of the gradients before the step, AdamW's temporaries during it). AdamW creates its state
    in its first step, so the init window holds the parameters only. None on a CPU (no
    allocator statistics)."""
    terms = {"parameters_gib": number(row["parameter_gib"]),
             "gradients_gib": number(row["gradient_gib"]),
             "optimizer_state_gib": number(row["optimizer_state_gib"])}
    state = sum(terms.values()) if None not in terms.values() else None
    peaks = {window: number(row[f"peak_gib_{window}"]) for window, _ in MEMORY_WINDOWS}

    def above(peak, known):
        return peak - known if peak is not None and known is not None else None

    return {**terms, "state_gib": state,
            "peak_init_gib": peaks["init"], "peak_before_step_gib": peaks["before_step"],
            "peak_step_gib": peaks["step"],
            "after_init_gib": number(row["allocated_gib_after_init"]),
            "before_step_gib": number(row["allocated_gib_before_step"]),
            "after_step_gib": number(row["allocated_gib_after_step"]),
            "init_above_parameters_gib": above(peaks["init"], terms["parameters_gib"]),
            "before_step_above_state_gib": above(peaks["before_step"], state),
            "step_above_state_gib": above(peaks["step"], state),
            # what the step itself allocated: its peak less what was allocated right before it
            "step_allocated_gib": above(peaks["step"], number(row["allocated_gib_before_step"]))}


def sharded_facts(table: pd.DataFrame, per_rank: dict[bool, list[dict]]) -> dict:
    facts = {"table": tables.to_markdown(_sharded_display(table)) if len(table) else "_(no records)_",
             "memory_table": tables.to_markdown(_memory_display(per_rank)) if per_rank else "",
             "available": False,
             "not_measured": not_ok(table.assign(run=[
                 "sharded" if flag else "replicated" for flag in table["sharded"]]), ["run"])}
    ok = table[table["status"] == "ok"].set_index("sharded")
    if not {True, False} <= set(ok.index):
        return facts
    sharded, replicated = ok.loc[True], ok.loc[False]
    state = {"replicated_gib": float(replicated["optimizer_state_gib"]),
             "sharded_gib": float(sharded["optimizer_state_gib"])}
    state["fraction"] = state["sharded_gib"] / state["replicated_gib"]
    times = {}
    for phase in ("step", "optimizer"):
        both = {name: {"ms": number(row[f"{phase}_ms_mean"]),
                       "std": number(row[f"{phase}_ms_std"])}
                for name, row in (("replicated", replicated), ("sharded", sharded))}
        # above 1: the sharded run is faster
        times[phase] = {**both, "speedup": _compare(both["sharded"], both["replicated"])}
    memory = {"replicated": _memory(replicated), "sharded": _memory(sharded)}
    # the largest peak of any window, per rank: what each rank's device must hold
    rank_peaks = {("sharded" if flag else "replicated"): [
        max(m[f"peak_gib_{w}"] for w, _ in MEMORY_WINDOWS) for m in ranks]
        for flag, ranks in per_rank.items()
        if all(m[f"peak_gib_{w}"] is not None for m in ranks for w, _ in MEMORY_WINDOWS)}
    return {**facts, "available": True, "world_size": int(sharded["world_size"]),
            "size": str(sharded["size"]), "name": edition_name(str(sharded["size"])),
            "setup": {k: int(sharded[k]) if k in sharded and pd.notna(sharded[k]) else None
                      for k in ("context_length", "batch_size", "warmup_steps",
                                "measure_steps")}
            | {"backend": str(sharded.get("backend", ""))},
            "state": state, "memory": memory, "rank_peaks": rank_peaks,
            "has_memory_readings": memory["replicated"]["peak_step_gib"] is not None
            and memory["sharded"]["peak_step_gib"] is not None,
            "no_readings_because": "a CPU has no allocator statistics"
            if sharded["env_device"] == "cpu"
            else "these records predate the per-window peaks",
            **times}


# --- facts: the DDP check ------------------------------------------------------------------

def check_facts(paths: list[str]) -> dict | None:
    """naive_ddp's check: per variant, data-parallel against single-process training (None
    without an `ok` record)."""
    if not paths:
        return None
    record = read_record(paths[0])
    if record["status"] != "ok":
        return {"status": record["status"], "checks": [], "all_close": False}
    checks = record["metrics"]["checks"]
    c = record["config"]
    return {"status": "ok", "checks": checks, "steps": record["metrics"]["steps"],
            "size": c["size"], "world_size": c["world_size"], "batch_size": c["batch_size"],
            "context_length": c["context_length"], "backend": c["backend"],
            "all_close": all(x["allclose"] for x in checks),
            "all_equal": all(x["equal"] for x in checks),
            "max_abs_diff": max(x["max_abs_diff"] for x in checks),
            "moved_min": min(x["moved_max_abs"] for x in checks),
            "replicas_max_abs_diff": max(x["replicas_max_abs_diff"] for x in checks),
            "rtol": checks[0]["rtol"], "atol": checks[0]["atol"],
            "not_close": [x["variant"] for x in checks if not x["allclose"]]}


# --- facts: communication accounting -------------------------------------------------------

def accounting_facts(table: pd.DataFrame) -> dict | None:
    """The record's inputs and answers (None without an `ok` record)."""
    if table.empty or table.iloc[0]["status"] != "ok":
        return None
    r = table.iloc[0]
    facts = {key: number(r[key]) for key in ACCOUNTING_INPUTS + ACCOUNTING_METRICS}
    for key in ("mesh_multiplicity_x", "fsdp_degree_x", "tp_degree_y", "fsdp_degree_to_fit_tpu",
                "devices", "parameters"):
        facts[key] = int(facts[key]) if facts[key] is not None else None
    facts["parameters_billions"] = (facts["parameters"] / 1e9 if facts["parameters"] is not None
                                    else None)
    return facts


# --- coverage ------------------------------------------------------------------------------

def _setup_gap(rows: pd.DataFrame, assignment: dict) -> str:
    """How the runs' setup differs from the assignment's (`assignment`: its `ddp` matrix, the
    model `sizes`, or `sharded_optimizer` matrix, one `size`, on `world_size` GPUs), or ''."""
    ok = rows[rows["status"] == "ok"]
    if ok.empty:
        return ""
    first = ok.iloc[0]
    asked = assignment["sizes"] if "sizes" in assignment else [assignment["size"]]
    measured = _sizes_of(ok)
    if (set(measured) <= set(asked) and int(first["world_size"]) == assignment["world_size"]
            and first["backend"] == GPU_BACKEND):
        return _missing_values([edition_name(a) for a in asked],
                               [edition_name(m) for m in measured], "no {} runs in this preset")
    return (f"measured with the {_sizes(measured)} model on {int(first['world_size'])} ranks "
            f"({first['backend']}), not {_sizes(asked)} on {assignment['world_size']} GPUs "
            f"({GPU_BACKEND})")


def _missing_values(asked, measured, sentence: str) -> str:
    """`sentence` (with {} for the values) naming what the assignment asks and no run
    measured, or ''."""
    absent = [v for v in asked if v not in set(measured)]
    return sentence.format(_sizes(absent)) if absent else ""


def _notes(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def coverage(allreduce: pd.DataFrame, ddp: pd.DataFrame, sharded: pd.DataFrame,
             accounting: pd.DataFrame, ddp_facts_: dict, overhead: dict,
             sharded_facts_: dict, check: pd.DataFrame, check_facts_: dict | None,
             assignment: dict) -> dict:
    """What this section answers of §5 and §6, by the assignment's problem keys; `assignment`
    is its matrix (the config's `defaults.distributed`)."""
    asked_allreduce, asked_ddp = assignment["allreduce"], assignment["ddp"]
    asked_sharded = assignment["sharded_optimizer"]
    ok_allreduce = allreduce[allreduce["status"] == "ok"]
    variant = {name: ddp[ddp["variant"] == name] for name in DDP_VARIANTS}
    naive_flat = ddp[ddp["variant"].isin(["naive", "flat"])]
    ok_bucketed = variant["bucketed"][variant["bucketed"]["status"] == "ok"]
    overlap_ok = variant["overlap"][variant["overlap"]["status"] == "ok"]
    busy = ddp_facts_["collective_busy_missing"]
    overlap_setup = ddp[ddp["variant"].isin(["naive", "flat", "overlap"])]
    return {
        "distributed_communication_single_node": covered(
            allreduce, anchor="distributed_communication_single_node", missing=_notes(
                _missing_values(asked_allreduce["backends"], ok_allreduce["backend"],
                                "no {} runs in this preset"),
                _missing_values(asked_allreduce["world_sizes"], ok_allreduce["world_size"],
                                "no runs with {} processes in this preset"),
                _missing_values(asked_allreduce["sizes_mb"], ok_allreduce["size_mb"],
                                "no {} MB tensors in this preset"))),
        "naive_ddp": covered(
            check if len(check) else None, anchor="naive_ddp",
            how="" if len(check) else "by the test-suite (tests/distributed/test_training.py)",
            missing="" if check_facts_ and check_facts_["all_close"] else
            "no ddp_check record in this run" if not len(check) else
            "its training does not match single-process training"),
        "naive_ddp_benchmarking": covered(variant["naive"], anchor="naive_ddp_benchmarking",
                                          missing=_setup_gap(variant["naive"], asked_ddp)),
        "minimal_ddp_flat_benchmarking": covered(naive_flat,
                                                 anchor="minimal_ddp_flat_benchmarking",
                                                 missing=_setup_gap(naive_flat, asked_ddp)),
        "ddp_overlap_individual_parameters": covered(
            variant["overlap"], anchor="ddp_overlap_individual_parameters"),
        "ddp_overlap_individual_parameters_benchmarking": covered(
            overlap_setup, anchor="ddp_overlap_individual_parameters_benchmarking",
            missing=_notes(
                _setup_gap(overlap_setup, asked_ddp),
                f"collective busy time is n/a for {len(busy)} of "
                f"{int((ddp['status'] == 'ok').sum())} runs (their records have no such metric)"
                if busy else "",
                "no profiler trace of the overlap variant"
                if len(overlap_ok) and overlap_ok["trace_file"].isna().all() else "")),
        "ddp_overlap_bucketed": covered(variant["bucketed"], anchor="ddp_overlap_bucketed"),
        "ddp_bucketed_benchmarking": covered(
            variant["bucketed"], anchor="ddp_bucketed_benchmarking", missing=_notes(
                _setup_gap(variant["bucketed"], asked_ddp),
                _missing_values(asked_ddp["bucket_sizes_mb"], ok_bucketed["bucket_size_mb"],
                                "no {} MiB buckets in this preset"),
                "" if overhead["available"]
                else f"the overhead model is not checked: it needs {overhead['needs']}")),
        "communication_accounting": covered(accounting, anchor="communication_accounting"),
        "optimizer_state_sharding": covered(sharded[sharded["sharded"] == True],  # noqa: E712
                                            anchor="optimizer_state_sharding"),
        "optimizer_state_sharding_accounting": covered(
            sharded, anchor="optimizer_state_sharding_accounting", missing=_notes(
                _setup_gap(sharded, asked_sharded),
                "" if sharded_facts_["available"]
                else "needs both the sharded and the replicated run to compare",
                f"no allocator peaks (init, up to the step, the step): "
                f"{sharded_facts_['no_readings_because']}; only the breakdown from the tensors"
                if sharded_facts_["available"] and not sharded_facts_["has_memory_readings"]
                else "")),
    }


# --- the section ---------------------------------------------------------------------------

def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    """Tables and figures at `outputs`; returns the section's facts. options: assignment, the
    assignment's matrix (the config's `defaults.distributed`)."""
    allreduce = allreduce_table(records["allreduce"])
    ddp = ddp_table(records["ddp"])
    sharded = sharded_table(records["sharded"])
    check = tables.records_frame(records.get("ddp_check", []))
    accounting = accounting_table(records["accounting"])
    tables.write_table(allreduce, outputs["allreduce_table"])
    tables.write_table(ddp, outputs["ddp_table"])
    tables.write_table(sharded, outputs["sharded_table"])
    tables.write_table(accounting, outputs["accounting_table"])
    allreduce_figure(allreduce, outputs["allreduce_figure"])
    ddp_figure(ddp, outputs["ddp_figure"])
    overlap_figure(ddp, timelines(records["ddp"]), outputs["overlap_figure"])

    ddp_f = ddp_facts(ddp)
    overhead = overhead_facts(ddp, allreduce)
    sharded_f = sharded_facts(sharded, memory_per_rank(records["sharded"]))
    check_f = check_facts(records.get("ddp_check", []))
    # The accounting is arithmetic on the CPU: its device would only blur the header.
    accounting_env = accounting.drop(columns=["env_device", "env_gpu"], errors="ignore")
    return jsonable({
        "env": tables.env_summary(allreduce, ddp, sharded, accounting_env),
        "coverage": coverage(allreduce, ddp, sharded, accounting, ddp_f, overhead, sharded_f,
                             check, check_f, options["assignment"]),
        "check": check_f,
        "allreduce": allreduce_facts(allreduce),
        "ddp": ddp_f,
        "overhead": overhead,
        "sharded": sharded_f,
        "accounting": accounting_facts(accounting),
        "figures": {"allreduce": outputs["allreduce_figure"], "ddp": outputs["ddp_figure"],
                    "overlap": outputs["overlap_figure"]},
        # rank 0's profiler traces lie beside the DDP records (one folder per model size)
        "trace_dir": os.path.commonpath([str(Path(r).parent) for r in records["ddp"]])
        if records["ddp"] else None,
    })
