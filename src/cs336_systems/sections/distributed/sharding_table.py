"""The optimizer-state sharding part of the distributed section (memory per window and rank,
step time with and without `ShardedOptimizer`), the DDP check against one process, and 2026's
communication accounting."""

from __future__ import annotations

import pandas as pd

from cs336_systems.records import read_record
from cs336_systems.report import tables
from cs336_systems.report.facts import not_ok, number
from cs336_systems.report.render import fmt
from cs336_systems.sections.distributed.ddp_table import compare, edition_name

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
        times[phase] = {**both, "speedup": compare(both["sharded"], both["replicated"])}
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
