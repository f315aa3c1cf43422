"""Distributed data parallel (§5) and sharding (§6): tables, figures and the section's facts.

`build(records, options, outputs)` reads the all-reduce, DDP, sharded-optimizer and
communication-accounting records, writes their tables (CSV) and two figures, and returns the
facts that `templates/distributed.md.j2` turns into the section: every number, ratio and
verdict of the prose is computed here. `options["assignment"]` is the assignment's own matrix
(the config's `defaults.distributed`): what of it this preset leaves out goes into the coverage
notes.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from cs336_systems.distributed.variants import DDP_VARIANTS
from cs336_systems.experiments.torchrun import backend_for
from cs336_systems.report import figures
from cs336_systems.report.facts import covered, jsonable, not_ok, speedup
from cs336_systems.report.render import fmt
from cs336_systems.report.tables import (ensure_columns, env_columns, env_summary, mean_pm_std,
                                         records_frame, to_markdown, write_table)

ALLREDUCE_METRICS = ["allreduce_ms_median", "allreduce_ms_mean", "allreduce_ms_std",
                     "size_bytes", "algbw_gbps", "busbw_gbps"]
DDP_PHASES = ["forward", "backward", "communicate", "optimizer", "step"]
DDP_METRICS = ([f"{p}_ms_{s}" for p in DDP_PHASES for s in ("mean", "std")]
               + ["collective_busy_ms_per_step", "profile_steps", "gradient_bytes", "buckets",
                  "parameters", "peak_gib", "trace_file"])
SHARDED_METRICS = ["allocated_gib_after_init", "allocated_gib_before_step",
                   "allocated_gib_after_step", "peak_gib", "parameter_gib", "gradient_gib",
                   "optimizer_state_gib", "step_ms_mean", "step_ms_std", "optimizer_ms_mean",
                   "optimizer_ms_std", "communicate_ms_mean", "forward_backward_ms_mean"]
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


FSDP_BY_TESTS = ("by the FSDP class and its gloo tests (tests/test_distributed_fsdp.py), not by "
                 "a job of this pipeline")

def _number(value) -> float | None:
    """A plain float, or None for a missing value."""
    return None if value is None or pd.isna(value) else float(value)


def _int(value) -> int | None:
    """A plain int, or None for a missing value."""
    return None if value is None or pd.isna(value) else int(value)


def _sizes(values) -> str:
    """[2, 4] -> '2 and 4'; [1, 10, 100] -> '1, 10 and 100'; names as they are."""
    items = [f"{v:g}" if isinstance(v, (int, float)) else str(v) for v in values]
    return " and ".join(items) if len(items) < 3 else ", ".join(items[:-1]) + " and " + items[-1]


# --- tables --------------------------------------------------------------------------------

def allreduce_table(paths: list[str]) -> pd.DataFrame:
    frame = ensure_columns(records_frame(paths), ["backend", "world_size", "size_mb"]
                           + ALLREDUCE_METRICS)
    frame = frame.sort_values(["backend", "world_size", "size_mb"], ignore_index=True)
    return frame[["backend", "world_size", "size_mb", "status", *ALLREDUCE_METRICS, "message",
                  *env_columns(frame)]]


def ddp_table(paths: list[str]) -> pd.DataFrame:
    """One row per DDP run, in the order of `DDP_VARIANTS`, bucketed runs by bucket size."""
    frame = ensure_columns(records_frame(paths), DDP_METRICS + ["bucket_size_mb"])
    frame["variant_rank"] = frame["variant"].map({v: i for i, v in enumerate(DDP_VARIANTS)})
    frame = frame.sort_values(["variant_rank", "bucket_size_mb"], ignore_index=True)
    frame["label"] = [_label(r) for _, r in frame.iterrows()]
    return frame[["variant", "bucket_size_mb", "label", "size", "context_length", "batch_size",
                  "world_size", "backend", "status", *DDP_METRICS, "message", *env_columns(frame)]]


def sharded_table(paths: list[str]) -> pd.DataFrame:
    frame = ensure_columns(records_frame(paths), SHARDED_METRICS)
    frame = frame.sort_values("sharded", ignore_index=True)
    return frame[["sharded", "size", "context_length", "batch_size", "world_size", "backend",
                  "status", *SHARDED_METRICS, "message", *env_columns(frame)]]


def accounting_table(paths: list[str]) -> pd.DataFrame:
    return ensure_columns(records_frame(paths), ACCOUNTING_INPUTS + ACCOUNTING_METRICS)


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
    fig, axes = figures.subplots(1, width=7.5)
    ax = axes[0][0]
    bottom = np.zeros(len(ok))
    for phase in ("forward", "backward", "communicate", "optimizer"):
        values = ok[f"{phase}_ms_mean"].fillna(0).to_numpy(dtype=float)
        ax.bar(list(ok["label"]), values, bottom=bottom, label=phase)
        bottom += values
    ax.set(ylabel="time per step (ms)", title="Data-parallel step by phase")
    ax.tick_params(axis="x", rotation=30)
    if len(ok):
        ax.legend(fontsize=7)
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
            "largest_busbw_gbps": _number(largest["busbw_gbps"]),
            "largest_median_ms": _number(largest["allreduce_ms_median"]),
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
        "table": to_markdown(_allreduce_display(table)),
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
    out = pd.DataFrame({"variant": table["label"], "status": table["status"]})
    for phase in DDP_PHASES:
        out[f"{phase} ms"] = [mean_pm_std(m, s) for m, s in
                              zip(table[f"{phase}_ms_mean"], table[f"{phase}_ms_std"])]
    # n/a: the run finished but its record has no such metric
    out["collectives busy ms/step"] = [
        fmt(v, 2) if pd.notna(v) else ("n/a" if status == "ok" else "")
        for v, status in zip(table["collective_busy_ms_per_step"], table["status"])]
    out["profiled steps"] = [
        str(int(v)) if pd.notna(v) else ("n/a" if status == "ok" else "")
        for v, status in zip(table["profile_steps"], table["status"])]
    out["trace"] = [v if pd.notna(v) else "" for v in table["trace_file"]]
    return out


def _step(row: pd.Series, phase: str = "step") -> dict:
    return {"label": row["label"], "ms": _number(row[f"{phase}_ms_mean"]),
            "std": _number(row[f"{phase}_ms_std"])}


def _compare(time: dict, reference: dict) -> dict | None:
    """speedup() of two {ms, std} facts: above 1, `time` is faster than `reference`."""
    return speedup(time["ms"], reference["ms"], time["std"], reference["std"])


def ddp_facts(table: pd.DataFrame) -> dict:
    ok = table[table["status"] == "ok"]
    by_label = ok.set_index("label", drop=False)
    setup = None
    if len(ok):
        first = ok.iloc[0]
        setup = {k: (first[k] if k in ("size", "backend") else int(first[k]))
                 for k in ("size", "context_length", "batch_size", "world_size", "backend")}
    variants = [{"label": r["label"], "variant": r["variant"], "status": r["status"],
                 "step": _step(r), "communicate": _step(r, "communicate"),
                 "backward": _step(r, "backward"),
                 "collective_busy_ms": _number(r["collective_busy_ms_per_step"]),
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

    busy_missing = [r["label"] for _, r in ok.iterrows()
                    if pd.isna(r["collective_busy_ms_per_step"])]
    steps_missing = [r["label"] for _, r in ok.iterrows() if pd.isna(r["profile_steps"])]
    return {
        "table": to_markdown(_ddp_display(table)),
        "setup": setup,
        "variants": variants,
        "naive_vs_flat": naive_vs_flat,
        "naive_communication_share": naive_share,
        "overlap": overlap,
        "fastest": fastest,
        "vs_torch": vs_torch,
        # runs whose records have no collective busy time / no count of profiled steps
        "collective_busy_missing": busy_missing,
        # the distinct numbers of profiled steps the finished runs recorded
        "profile_steps": sorted({int(v) for v in ok["profile_steps"].dropna()}),
        "profile_steps_missing": steps_missing,
        "traces": [r["trace_file"] for _, r in ok.iterrows() if pd.notna(r["trace_file"])],
        "not_measured": not_ok(table.assign(run=table["label"]), ["run"]),
    }


def overhead_facts(ddp: pd.DataFrame, allreduce: pd.DataFrame) -> dict:
    """Predicted against measured overhead of bucketed DDP, and the optimal bucket size.

    Measured overhead: the bucketed step time minus the naive step's compute phases (forward,
    backward, optimizer). Predicted: s / (n_b w) + n_b o, with o and w fitted to the all-reduce
    records of the same backend and world size."""
    ok = ddp[ddp["status"] == "ok"]
    bucketed = ok[ok["variant"] == "bucketed"]
    naive = ok[ok["variant"] == "naive"]
    if bucketed.empty or naive.empty:
        return {"available": False, "needs": "the naive and bucketed DDP records",
                "table": "_(needs the naive and bucketed DDP records)_"}
    world, backend = int(bucketed.iloc[0]["world_size"]), str(bucketed.iloc[0]["backend"])
    fit = fit_latency_bandwidth(allreduce[(allreduce["status"] == "ok")
                                          & (allreduce["backend"] == backend)
                                          & (allreduce["world_size"] == world)])
    if fit is None or fit[0] is None:
        needs = (f"{backend} all-reduce records at two or more sizes for {world} processes, "
                 "with a resolvable per-call cost o")
        return {"available": False, "needs": needs, "table": f"_(needs {needs})_"}
    o_ms, w_gbps = fit
    s_bytes = float(bucketed.iloc[0]["gradient_bytes"])
    n = naive.iloc[0]
    compute_ms = float(n["forward_ms_mean"] + n["backward_ms_mean"] + n["optimizer_ms_mean"])
    rows = []
    for _, r in bucketed.iterrows():
        n_b = int(r["buckets"])
        predicted = overhead_ms(s_bytes, n_b, o_ms, w_gbps)
        measured = float(r["step_ms_mean"]) - compute_ms
        rows.append({"bucket_mib": float(r["bucket_size_mb"]), "buckets": n_b,
                     "predicted_ms": predicted, "measured_ms": measured,
                     "gap_ms": measured - predicted,
                     "backward_slowdown_ms": float(r["backward_ms_mean"])
                     - float(n["backward_ms_mean"])})
    b_star = math.sqrt(s_bytes * w_gbps * 1e6 * o_ms)  # bytes
    display = pd.DataFrame({
        "bucket MiB": [f"{r['bucket_mib']:g}" for r in rows],
        "buckets n_b": [r["buckets"] for r in rows],
        "predicted overhead ms": [fmt(r["predicted_ms"], 2) for r in rows],
        "measured overhead ms": [fmt(r["measured_ms"], 2) for r in rows]})
    gaps = [r["gap_ms"] for r in rows]
    slowdowns = [r["backward_slowdown_ms"] for r in rows]
    return {
        "available": True, "needs": "",
        "table": to_markdown(display),
        "rows": rows,
        "backend": backend, "world_size": world,
        "o_ms": o_ms, "o_us": o_ms * 1e3, "w_gbps": w_gbps,
        "s_bytes": s_bytes, "s_mib": s_bytes / MIB,
        "compute_ms": compute_ms, "naive_backward_ms": float(n["backward_ms_mean"]),
        "b_star_bytes": b_star, "b_star_mib": b_star / MIB, "n_b_star": s_bytes / b_star,
        "backward_slowdown_min_ms": min(slowdowns), "backward_slowdown_max_ms": max(slowdowns),
        "gap_min_ms": min(gaps), "gap_max_ms": max(gaps),
    }


# --- facts: sharding -----------------------------------------------------------------------

def _sharded_display(table: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame([{
        "optimizer": "sharded" if r["sharded"] else "replicated", "status": r["status"],
        "after init GiB": fmt(r["allocated_gib_after_init"], 2),
        "before step GiB": fmt(r["allocated_gib_before_step"], 2),
        "after step GiB": fmt(r["allocated_gib_after_step"], 2),
        "peak GiB": fmt(r["peak_gib"], 2),
        "params GiB": fmt(r["parameter_gib"], 2),
        "grads GiB": fmt(r["gradient_gib"], 2),
        "optimizer state GiB (this rank)": fmt(r["optimizer_state_gib"], 2),
        "step ms": mean_pm_std(r["step_ms_mean"], r["step_ms_std"]),
        "optimizer ms": mean_pm_std(r["optimizer_ms_mean"], r["optimizer_ms_std"]),
    } for _, r in table.iterrows()])


def _memory(row: pd.Series) -> dict:
    """Rank 0's memory readings and the peak's breakdown: parameters + gradients + optimizer
    state + the flat all-reduce's copy of the gradients (it holds a second copy of every
    gradient while it runs) + everything else (activations are freed by then; allocator
    rounding). The readings are None on a CPU (no allocator statistics)."""
    terms = {"parameters_gib": _number(row["parameter_gib"]),
             "gradients_gib": _number(row["gradient_gib"]),
             "optimizer_state_gib": _number(row["optimizer_state_gib"]),
             "allreduce_copy_gib": _number(row["gradient_gib"])}
    peak = _number(row["peak_gib"])
    known = sum(terms.values()) if None not in terms.values() else None
    return {"after_init_gib": _number(row["allocated_gib_after_init"]),
            "before_step_gib": _number(row["allocated_gib_before_step"]),
            "after_step_gib": _number(row["allocated_gib_after_step"]),
            "peak_gib": peak, **terms,
            "other_gib": peak - known if peak is not None and known is not None else None}


def sharded_facts(table: pd.DataFrame) -> dict:
    facts = {"table": to_markdown(_sharded_display(table)) if len(table) else "_(no records)_",
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
        both = {name: {"ms": _number(row[f"{phase}_ms_mean"]),
                       "std": _number(row[f"{phase}_ms_std"])}
                for name, row in (("replicated", replicated), ("sharded", sharded))}
        # above 1: the sharded run is faster
        times[phase] = {**both, "speedup": _compare(both["sharded"], both["replicated"])}
    memory = {"replicated": _memory(replicated), "sharded": _memory(sharded)}
    return {**facts, "available": True, "world_size": int(sharded["world_size"]),
            "state": state, "memory": memory,
            "has_memory_readings": memory["replicated"]["peak_gib"] is not None
            and memory["sharded"]["peak_gib"] is not None,
            **times}


# --- facts: communication accounting -------------------------------------------------------

def accounting_facts(table: pd.DataFrame) -> dict | None:
    """The record's inputs and answers (None without an `ok` record)."""
    if table.empty or table.iloc[0]["status"] != "ok":
        return None
    r = table.iloc[0]
    facts = {key: _number(r[key]) for key in ACCOUNTING_INPUTS + ACCOUNTING_METRICS}
    for key in ("mesh_multiplicity_x", "fsdp_degree_x", "tp_degree_y", "fsdp_degree_to_fit_tpu",
                "devices", "parameters"):
        facts[key] = int(facts[key]) if facts[key] is not None else None
    facts["parameters_billions"] = (facts["parameters"] / 1e9 if facts["parameters"] is not None
                                    else None)
    return facts


# --- coverage ------------------------------------------------------------------------------

def _setup_gap(rows: pd.DataFrame, assignment: dict) -> str:
    """How the runs' setup differs from the assignment's (`assignment`: its `ddp` or
    `sharded_optimizer` matrix: the model size on `world_size` GPUs), or ''."""
    ok = rows[rows["status"] == "ok"]
    if ok.empty:
        return ""
    first = ok.iloc[0]
    wanted = {"size": assignment["size"], "world_size": assignment["world_size"],
              "backend": GPU_BACKEND}
    if all(first[k] == v for k, v in wanted.items()):
        return ""
    return (f"measured with the {first['size']} model on {int(first['world_size'])} ranks "
            f"({first['backend']}), not {wanted['size']} on {wanted['world_size']} GPUs "
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
             sharded_facts_: dict, assignment: dict) -> dict:
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
            variant["naive"], anchor="naive_ddp",
            missing="that its training matches single-process training is checked by the "
                    "test-suite (tests/test_distributed_training.py) but not reported in this "
                    "writeup"),
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
                "no allocator readings (after init, before and after the step, peak) on a "
                "CPU: only the breakdown from the tensors"
                if sharded_facts_["available"] and not sharded_facts_["has_memory_readings"]
                else "")),
        "fsdp": covered(None, anchor="fsdp", how=FSDP_BY_TESTS,
                        missing="no FSDP benchmark on GPUs beside torch's fully_shard yet"),
    }


# --- the section ---------------------------------------------------------------------------

def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    """Tables and figures at `outputs`; returns the section's facts. options: assignment, the
    assignment's matrix (the config's `defaults.distributed`)."""
    allreduce = allreduce_table(records["allreduce"])
    ddp = ddp_table(records["ddp"])
    sharded = sharded_table(records["sharded"])
    accounting = accounting_table(records["accounting"])
    write_table(allreduce, outputs["allreduce_table"])
    write_table(ddp, outputs["ddp_table"])
    write_table(sharded, outputs["sharded_table"])
    write_table(accounting, outputs["accounting_table"])
    allreduce_figure(allreduce, outputs["allreduce_figure"])
    ddp_figure(ddp, outputs["ddp_figure"])

    ddp_f = ddp_facts(ddp)
    overhead = overhead_facts(ddp, allreduce)
    sharded_f = sharded_facts(sharded)
    # The accounting is arithmetic on the CPU: its device would only blur the header.
    accounting_env = accounting.drop(columns=["env_device", "env_gpu"], errors="ignore")
    return jsonable({
        "env": env_summary(allreduce, ddp, sharded, accounting_env),
        "coverage": coverage(allreduce, ddp, sharded, accounting, ddp_f, overhead, sharded_f,
                             options["assignment"]),
        "allreduce": allreduce_facts(allreduce),
        "ddp": ddp_f,
        "overhead": overhead,
        "sharded": sharded_f,
        "accounting": accounting_facts(accounting),
        "figures": {"allreduce": outputs["allreduce_figure"], "ddp": outputs["ddp_figure"]},
        # rank 0's profiler traces lie beside the DDP records
        "trace_dir": str(Path(records["ddp"][0]).parent) if records["ddp"] else None,
    })
