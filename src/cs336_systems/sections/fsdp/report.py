"""fsdp and fsdp_accounting (§6.2, 2026): tables, a figure and the section's facts.

`build(records, options, outputs)` reads one record per FSDP variant (this project's FSDP,
torch's fully_shard, bucketed DDP), all of one shape from one job matrix, and returns the facts
of `template.md.j2`: step time and per-rank peak of each variant against torch's, (a) the
peak saving expected from the sharding breakdown (the analytic model of `memory_model`, with
the sharded bytes divided over the ranks) beside the measured one, and (b) per forward use of a
sharded layer, whether its all-gather finished before the layer could start, from the FSDP
job's profile. `options["assignment"]` is the assignment's shape (the config's defaults): where
this preset departs from it goes into the coverage notes.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.analysis.memory_model import analytic_peak, step_memory
from cs336_systems.distributed.variants import FSDP_VARIANTS, TRAINING_PHASES
from cs336_systems.lm.sizes import size_label
from cs336_systems.measure.memory import GIB
from cs336_systems.records import read_record
from cs336_systems.report import facts, figures, tables

PHASES = [*TRAINING_PHASES, "step"]  # each phase, and the whole step
METRICS = ([f"{p}_ms_{s}" for p in PHASES for s in ("mean", "std")]
           + ["peak_gib", "collective_busy_ms_per_step", "sharded_bytes", "replicated_bytes",
              "sharded_weights", "largest_sharded_bytes", "gather_uses_per_step",
              "gathers_hidden", "gathers_profiled", "gather_wait_ms_per_step",
              "gather_wait_ms_max"])
REFERENCE = "fsdp2"      # torch's FSDP2: what our FSDP is measured against
UNSHARDED = "bucketed"   # DDP: what sharding saves memory against
OURS = "fsdp"
SHAPE_KEYS = ("size", "context_length", "batch_size", "world_size")
# Parts of a training step's memory that FSDP shards (for the sharded fraction of parameters);
# the saved activations and logits belong to each rank's own rows of the batch.
SHARDED_PARTS = ("weights", "gradients", "optimizer state", "optimizer temporary")



def label(variant: str, bucket_size_mb) -> str:
    return f"{variant} {bucket_size_mb:g} MB" if variant == UNSHARDED else variant


def expected_peaks(size: str, batch_size: int, context_length: int, world_size: int,
                   sharded_bytes: float, replicated_bytes: float,
                   optimizer: str = "adamw") -> dict:
    """The analytic per-rank peak of a training step (`memory_model`, fp32, each rank's
    batch_size / world_size rows) unsharded, as DDP holds it, and with FSDP's sharding: every
    part that scales with the parameters keeps the replicated share whole and 1 / world_size of
    the sharded share. The gathered weights and the reduce-scatter window (a few layers' worth)
    are left out; they are the model's error."""
    parts = step_memory(size, batch_size // world_size, context_length, "train-step",
                        optimizer=optimizer)
    share = (replicated_bytes + sharded_bytes / world_size) / (replicated_bytes + sharded_bytes)
    sharded = {k: v * share if k in SHARDED_PARTS else v for k, v in parts.items()}
    unsharded_peak, sharded_peak = analytic_peak(parts), analytic_peak(sharded)
    return {"share": share,
            "unsharded_gib": unsharded_peak["bytes"] / GIB, "unsharded_stage": unsharded_peak["stage"],
            "sharded_gib": sharded_peak["bytes"] / GIB, "sharded_stage": sharded_peak["stage"],
            "saving_gib": (unsharded_peak["bytes"] - sharded_peak["bytes"]) / GIB,
            "parts_gib": {k: v / GIB for k, v in parts.items()}}


def step_table(frame: pd.DataFrame) -> pd.DataFrame:
    shown = pd.DataFrame({"variant": frame["label"], "status": frame["status"]})
    for phase in PHASES:
        shown[f"{phase} ms"] = [tables.mean_pm_std(m, s) for m, s in
                                zip(frame[f"{phase}_ms_mean"], frame[f"{phase}_ms_std"])]
    shown["peak GiB (max over ranks)"] = frame["peak_gib_max"]
    shown["collective busy ms/step"] = frame["collective_busy_ms_per_step"]
    return shown


def gather_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=["use", "layer", "issued_us", "gather_start_us",
                                     "gather_end_us", "ready_us", "forward_start_us", "hidden",
                                     "wait_us"])
    frame.insert(0, "use", range(len(frame)))
    times = [c for c in frame.columns if c.endswith("_us") and c != "wait_us"]
    frame[times] = frame[times] - frame["issued_us"].iloc[0]  # from the step's first gather
    return frame


def gather_figure(frame: pd.DataFrame, path: str) -> str:
    """Per forward use of a sharded layer: how long its all-gather ran on the GPU, and its
    margin, the time from the gather's end to the moment the layer could start (above zero:
    hidden; below: the layer waited that long)."""
    fig, axes = figures.subplots(2, width=5.0, height=3.8)
    duration_ax, margin_ax = axes[0]
    if frame.empty:
        for ax in (duration_ax, margin_ax):
            ax.text(0.5, 0.5, "no gather timing\n(needs a CUDA profile of the FSDP job)",
                    ha="center", va="center", transform=ax.transAxes)
    else:
        ms = 1e-3
        colours = ["0.5" if hidden else "tab:red" for hidden in frame["hidden"]]
        duration_ax.bar(frame["use"], (frame["gather_end_us"] - frame["gather_start_us"]) * ms,
                        color="0.5", width=1.0)
        duration_ax.set_ylabel("all-gather on the GPU (ms)")
        margin_ax.bar(frame["use"], (frame["ready_us"] - frame["gather_end_us"]) * ms,
                      color=colours, width=1.0)
        margin_ax.axhline(0, color="k", linewidth=0.8)
        margin_ax.set_ylabel("layer could start − gather end (ms)")
        for ax in (duration_ax, margin_ax):
            ax.set_xlabel("forward use of a sharded layer, in order")
    figures.save(fig, path)
    return path


def _accounting(ok: pd.DataFrame, shape: dict, peak) -> dict:
    """fsdp_accounting: what our FSDP shards and keeps whole, the peaks the accounting expects
    and what the runs measured (`peak(variant)`: a variant's largest peak over ranks)."""
    row = ok.loc[OURS]
    expected = expected_peaks(shape["size"], int(shape["batch_size"]),
                              int(shape["context_length"]), int(shape["world_size"]),
                              float(row["sharded_bytes"]), float(row["replicated_bytes"]),
                              row.get("optimizer") if isinstance(row.get("optimizer"), str)
                              else "adamw")  # records from before the choice: AdamW
    total = float(row["sharded_bytes"] + row["replicated_bytes"])
    measured = {other: peak(other) - peak(OURS) if peak(other) and peak(OURS) else None
                for other in (UNSHARDED, REFERENCE)}
    return {
        "sharded_gib": row["sharded_bytes"] / GIB, "replicated_gib": row["replicated_bytes"] / GIB,
        "sharded_fraction": row["sharded_bytes"] / total, "sharded_weights": row["sharded_weights"],
        "largest_sharded_gib": row["largest_sharded_bytes"] / GIB,
        "expected": expected, "measured_saving_gib": measured[UNSHARDED],
        "saving_ratio": (measured[UNSHARDED] / expected["saving_gib"]
                         if measured[UNSHARDED] is not None and expected["saving_gib"] else None),
        "model_error_gib": (peak(OURS) - expected["sharded_gib"]) if peak(OURS) else None,
        "unsharded_model_error_gib": (peak(UNSHARDED) - expected["unsharded_gib"]
                                      if peak(UNSHARDED) else None)}


WORST_COLUMNS = ["use", "layer", "gather_start_us", "gather_end_us", "ready_us", "wait_us"]


def _gather_timing(row: pd.Series, gathers: pd.DataFrame) -> dict:
    """When each all-gather of our FSDP's profiled step finished against when its layer needed
    it (`row`: our run's record)."""
    forward_ms = facts.number(row["forward_ms_mean"])
    waited = gathers[~gathers["hidden"]].sort_values("wait_us", ascending=False)
    return {"uses": int(row["gather_uses_per_step"]), "hidden": int(row["gathers_hidden"]),
            "profiled": int(row["gathers_profiled"]),
            "all_hidden": bool(row["gathers_hidden"] == row["gathers_profiled"]),
            "wait_ms_per_step": row["gather_wait_ms_per_step"],
            "wait_ms_max": row["gather_wait_ms_max"], "forward_ms": forward_ms,
            "wait_share": row["gather_wait_ms_per_step"] / forward_ms if forward_ms else None,
            "step_hidden": int(gathers["hidden"].sum()), "step_uses": len(gathers),
            "first_layer": gathers["layer"].iloc[0],
            "first_hidden": bool(gathers["hidden"].iloc[0]),
            "worst": tables.to_markdown(waited.head(5)[WORST_COLUMNS]) if not waited.empty
            else ""}


def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    frame = tables.ensure_columns(tables.records_frame(records["records"]),
                                  METRICS + ["bucket_size_mb"])
    full = {r["config"]["variant"]: r for r in map(read_record, records["records"])}
    frame["label"] = [label(v, b) for v, b in zip(frame["variant"], frame["bucket_size_mb"])]
    frame["peak_gib_max"] = [
        max((p for p in full[v]["metrics"].get("peak_gib_per_rank", []) if p is not None),
            default=None) for v in frame["variant"]]
    tables.write_table(frame, outputs["table"])
    ok = frame[frame["status"] == "ok"].set_index("variant")

    def step(variant: str) -> tuple[float | None, float | None]:
        if variant not in ok.index:
            return None, None
        row = ok.loc[variant]
        return facts.number(row["step_ms_mean"]), facts.number(row["step_ms_std"])

    def peak(variant: str) -> float | None:
        return facts.number(ok.loc[variant, "peak_gib_max"]) if variant in ok.index else None

    comparisons = {}
    for other in (REFERENCE, UNSHARDED):
        time = facts.speedup(step(OURS)[0], step(other)[0], step(OURS)[1], step(other)[1])
        ours_peak, other_peak = peak(OURS), peak(other)
        comparisons[other] = {
            "label": ok.loc[other, "label"] if other in ok.index else other,
            "step": time, "step_ms": step(other)[0],
            "peak_gib": other_peak,
            "peak_ratio": ours_peak / other_peak if ours_peak and other_peak else None}

    shape = {key: frame[key].iloc[0] for key in SHAPE_KEYS} if not frame.empty else {}
    accounting = _accounting(ok, shape, peak) if OURS in ok.index else None

    rows = full.get(OURS, {}).get("metrics", {}).get("gather_timing", [])
    gathers = gather_frame(rows)
    tables.write_table(gathers, outputs["gather_table"])
    gather_figure(gathers, outputs["gather_figure"])
    timing = _gather_timing(ok.loc[OURS], gathers) if not gathers.empty else None

    assignment = options.get("assignment", {})
    departs = [f"{key} {size_label(shape.get(key))} (the assignment's "
               f"{size_label(assignment[key])})"
               for key in SHAPE_KEYS
               if key in assignment and shape and shape.get(key) != assignment[key]]
    missing = "this preset runs " + ", ".join(departs) if departs else ""
    ours = frame[frame["variant"] == OURS]
    no_timing = "" if timing else "no gather timing: it needs a CUDA profile of the FSDP job"
    return {
        "variants": {v: FSDP_VARIANTS[v] for v in frame["variant"]},
        "shape": shape,
        "table": tables.to_markdown(step_table(frame)),
        "comparisons": comparisons,
        "peaks_per_rank": {v: r["metrics"].get("peak_gib_per_rank") for v, r in full.items()},
        "accounting": accounting,
        "timing": timing,
        "not_measured": facts.not_ok(frame, ["label"]),
        "figures": {"gathers": outputs["gather_figure"]},
        "env": tables.env_summary(frame),
        "coverage": {
            "fsdp": facts.covered(frame, missing=missing, anchor="fsdp",
                                  how="also by the FSDP class's gloo tests "
                                      "(tests/distributed/test_fsdp.py)"),
            "fsdp_accounting": facts.covered(
                ours, missing="; ".join(filter(None, [missing, no_timing])),
                anchor="fsdp_accounting"),
        },
    }
