"""memory_profiling's records read into one frame, and its peaks: (b) and (c) each
configuration's peak, bf16 against fp32, and the analytic memory model beside each peak."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.analysis.memory_model import analytic_peak, step_memory
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.lm.step import MODES
from cs336_systems.measure.memory import GIB
from cs336_systems.measure.memory_timeline import PREEXISTING, Timeline
from cs336_systems.records import read_record
from cs336_systems.report.tables import (
    ensure_columns,
    records_frame,
    to_markdown,
)

CONFIG = ["size", "context_length", "mode", "precision"]
SIZE_RANK = {name: i for i, name in enumerate(MODEL_SIZES)}
MIB = 2**20
SAME = 0.01     # bf16 and fp32 peaks within 1 % of each other: "barely changes"
# The analytic model's stages, and the phases of a step (lm_step) they fall in: the end of the
# forward is where backward starts (the logits' gradient is its first allocation).
ANALYTIC_PHASES = {"forward": ("forward",), "end of forward": ("forward", "backward"),
                   "optimizer step": ("optimizer",)}
# The parts of the analytic model shaped like the parameters: fp32 under autocast too.
PARAMETER_SHAPED = ("weights", "gradients", "optimizer state", "optimizer temporary")
MODEL_PARTS = ("weights", "optimizer state", "gradients", "saved activations", "logits",
               "optimizer temporary")


def gib(nbytes) -> float:
    return nbytes / GIB


def gib_text(value: float) -> str:
    """GiB for a table: two decimals, or three significant digits below 0.1 (tiny models)."""
    return f"{value:.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3g}"


def analytic(size: str, batch: int, context: int, mode: str, optimizer: str = "adamw") -> dict:
    """The analytic model of one configuration (fp32, with the optimizer its record names):
    its parts and peak in GiB."""
    parts = step_memory(size, batch, context, mode, optimizer=optimizer)
    peak = analytic_peak(parts)
    return {"parts_gib": {k: gib(v) for k, v in parts.items()}, "analytic_gib": gib(peak["bytes"]),
            "analytic_stage": peak["stage"],
            "analytic_resident_gib": gib(parts["weights"] + parts.get("optimizer state", 0)),
            "parameter_shaped_gib": gib(sum(parts.get(k, 0) for k in PARAMETER_SHAPED))}


def peak_frame(paths: list[str]) -> pd.DataFrame:
    """One row per record: configuration, status, the measured peaks and the analytic model's,
    and where the record's files are."""
    frame = ensure_columns(records_frame(paths), [
        "message", "peak_gib", "peak_reserved_gib", "trace_peak_gib", "start_gib",
        "weights_gib", "peak_stage", "peak_step", "residual_allocations", "residual_bytes",
        "parameters", "step_ms_mean", "step_ms_std", "timeline_file", "snapshot_file",
        "html_file", "trace_full"])
    frame["record"] = [str(p) for p in paths]
    frame["optimizer"] = frame.get("optimizer", pd.Series(index=frame.index, dtype=object)
                                   ).fillna("adamw")  # records from before the choice: AdamW
    models = [analytic(r["size"], r["batch_size"], r["context_length"], r["mode"],
                       r["optimizer"]) for _, r in frame.iterrows()]
    for key in ("analytic_gib", "analytic_stage", "analytic_resident_gib",
                "parameter_shaped_gib"):
        frame[key] = [m[key] for m in models]
    frame["size_rank"] = frame["size"].map(SIZE_RANK)
    frame["mode_rank"] = frame["mode"].map(MODES.index)
    frame["precision_rank"] = frame["precision"].map(list(PRECISIONS).index)
    return (frame.sort_values(["size_rank", "mode_rank", "context_length", "precision_rank"])
            .drop(columns=["size_rank", "mode_rank", "precision_rank"]).reset_index(drop=True))


def sidecar(row, key: str) -> str | None:
    """A file beside a record (its name is in the record), or None."""
    name = row.get(key)
    return str(Path(row["record"]).parent / name) if isinstance(name, str) and name else None


def load_timeline(row) -> Timeline | None:
    path = sidecar(row, "timeline_file")
    return Timeline.load(path) if path and Path(path).is_file() else None


def metrics_of(row) -> dict:
    return read_record(row["record"])["metrics"]


def status_text(row) -> str:
    return "" if row["status"] == "ok" else row["status"]


def peak_cell(row, key: str) -> str:
    return f"{row[key]:.2f}" if row["status"] == "ok" else status_text(row)


def peak_table(frame: pd.DataFrame) -> str:
    """Peak allocated (reserved) GiB per size, mode and context, each precision side by side,
    with the analytic model's fp32 peak and stage."""
    rows = []
    for (size, mode, context), group in frame.groupby(["size", "mode", "context_length"],
                                                      sort=False):
        row = {"size": size, "mode": mode, "context": context}
        for _, r in group.iterrows():
            p = r["precision"]
            row[f"{p} peak GiB (reserved)"] = (f"{r['peak_gib']:.2f} ({r['peak_reserved_gib']:.2f})"
                                              if r["status"] == "ok" else status_text(r))
            row[f"{p} peak in"] = r["peak_stage"] if r["status"] == "ok" else ""
        first = group.iloc[0]
        row["model fp32 GiB"] = f"{first['analytic_gib']:.2f}"
        row["model peak at"] = first["analytic_stage"]
        rows.append(row)
    return to_markdown(pd.DataFrame(rows))


def weight_copies(pairs: list[dict], copies_gib: float) -> dict:
    """Whether autocast's bf16 copies of the weights (`copies_gib` if all were held at once:
    it caches each weight's cast inside its region) show in the measured peaks: they do when
    the bf16 peak exceeds fp32's by at least half of them at some context."""
    delta_max = float(max(p["delta_gib"] for p in pairs))
    return {"bf16_weight_copies_gib": copies_gib, "delta_max_gib": delta_max,
            "copies_show": bool(delta_max >= copies_gib / 2)}


def bf16_facts(frame: pd.DataFrame) -> dict:
    """(c) bf16 against fp32, per mode and context where both ran: the peaks' ratio and the
    difference, the stages, and what the analytic model keeps fp32 (the parameter-shaped
    parts), with its share of the fp32 peak."""
    ok = frame[frame["status"] == "ok"]
    rows, modes = [], []
    for (size, mode), group in ok.groupby(["size", "mode"], sort=False):
        pairs = []
        for context, g in group.groupby("context_length"):
            by = {r["precision"]: r for _, r in g.iterrows()}
            if not {"fp32", "bf16"} <= set(by):
                continue
            fp32, bf16 = by["fp32"], by["bf16"]
            ratio = bf16["peak_gib"] / fp32["peak_gib"]
            entry = {"size": size, "mode": mode, "context_length": int(context),
                     "fp32_gib": fp32["peak_gib"], "bf16_gib": bf16["peak_gib"],
                     "ratio": ratio, "delta_gib": bf16["peak_gib"] - fp32["peak_gib"],
                     "word": change_word([ratio]),
                     "stage_fp32": fp32["peak_stage"], "stage_bf16": bf16["peak_stage"],
                     "fixed_gib": fp32["parameter_shaped_gib"],
                     "fixed_share": fp32["parameter_shaped_gib"] / fp32["peak_gib"],
                     "rest_fp32_gib": fp32["peak_gib"] - fp32["parameter_shaped_gib"],
                     "rest_bf16_gib": bf16["peak_gib"] - fp32["parameter_shaped_gib"]}
            pairs.append(entry)
        if not pairs:
            continue
        rows += pairs
        ratios = [p["ratio"] for p in pairs]
        parts = [k for k in PARAMETER_SHAPED if k in step_memory(size, 1, 1, mode)]
        modes.append({"size": size, "mode": mode, "count": len(pairs),
                      "ratio_min": min(ratios), "ratio_max": max(ratios),
                      "word": change_word(ratios), **change_counts(ratios),
                      "fixed_parts": ", ".join(parts),
                      "fixed_gib": pairs[0]["fixed_gib"],
                      "fixed_share_min": min(p["fixed_share"] for p in pairs),
                      "fixed_share_max": max(p["fixed_share"] for p in pairs),
                      **weight_copies(pairs, gib(group["parameters"].iloc[0] * 2))})
    table = pd.DataFrame([{"size": r["size"], "mode": r["mode"], "context": r["context_length"],
                           "fp32 GiB": r["fp32_gib"], "bf16 GiB": r["bf16_gib"],
                           "bf16 / fp32": f"{r['ratio']:.3f}",
                           "bf16 - fp32 GiB": f"{r['delta_gib']:+.2f}",
                           "peak in (fp32 / bf16)": f"{r['stage_fp32']} / {r['stage_bf16']}",
                           "fp32 parameter-shaped GiB (model)": r["fixed_gib"]}
                          for r in rows])
    return {"rows": rows, "modes": modes, "table": to_markdown(table), "same_within": SAME}


def change_word(ratios: list[float]) -> str:
    """What bf16 does to the peak over `ratios` (bf16 / fp32): "barely changes" where every
    ratio is within SAME of 1, "raises" or "lowers" only where every one is beyond it on that
    side; anything else is mixed (`change_counts` says how)."""
    if all(abs(r - 1) <= SAME for r in ratios):
        return "barely changes"
    if all(r > 1 + SAME for r in ratios):
        return "raises"
    if all(r < 1 - SAME for r in ratios):
        return "lowers"
    return "changes by context"


def change_counts(ratios: list[float]) -> dict:
    """How many of `ratios` (bf16 / fp32 peaks) are ties (within SAME of 1), rises and falls."""
    return {"same": sum(abs(r - 1) <= SAME for r in ratios),
            "raised": sum(r > 1 + SAME for r in ratios),
            "lowered": sum(r < 1 - SAME for r in ratios)}


def model_table(frame: pd.DataFrame) -> str:
    """The analytic model's parts and peak (fp32) for every configured size, mode and context."""
    rows = []
    for (size, mode, context, batch, optimizer), _ in frame.groupby(
            ["size", "mode", "context_length", "batch_size", "optimizer"], sort=False):
        model = analytic(size, batch, context, mode, optimizer)
        rows.append({"size": size, "mode": mode, "context": context,
                     "optimizer": optimizer if mode == "train-step" else "",
                     **{f"{part} GiB": gib_text(model["parts_gib"][part])
                        if part in model["parts_gib"] else "" for part in MODEL_PARTS},
                     "peak GiB": gib_text(model["analytic_gib"]),
                     "peak at": model["analytic_stage"]})
    return to_markdown(pd.DataFrame(rows))


def comparisons(frame: pd.DataFrame) -> dict:
    """Each measured peak against the model: the difference and its parts named from the data.

    resident: memory in use before the measured steps against the model's weights and optimizer
      state; rounding: the allocator's peak less the trace's (requested bytes); cache: reserved
      less allocated; stage: whether the peak falls where the model puts it; live at the peak:
      the two largest categories the trace made (not what was there before recording)."""
    rows, entries = [], []
    for _, r in frame[frame["status"] == "ok"].iterrows():
        live = [c for c in metrics_of(r).get("live_at_peak", []) if c["category"] != PREEXISTING]
        agrees = r["peak_stage"] in ANALYTIC_PHASES[r["analytic_stage"]]
        entry = {"size": r["size"], "mode": r["mode"], "context_length": r["context_length"],
                 "precision": r["precision"], "measured_gib": r["peak_gib"],
                 "analytic_gib": r["analytic_gib"],
                 "difference_gib": r["peak_gib"] - r["analytic_gib"],
                 "ratio": r["peak_gib"] / r["analytic_gib"],
                 "resident_difference_gib": r["start_gib"] - r["analytic_resident_gib"],
                 "rounding_gib": r["peak_gib"] - r["trace_peak_gib"],
                 "cache_gib": r["peak_reserved_gib"] - r["peak_gib"],
                 "stage": r["peak_stage"], "analytic_stage": r["analytic_stage"],
                 "stage_agrees": bool(agrees),
                 "live_top": [{"category": c["category"], "gib": gib(c["bytes"])}
                              for c in live[:2]]}
        entries.append(entry)
        rows.append({"size": r["size"], "mode": r["mode"], "context": r["context_length"],
                     "precision": r["precision"], "measured GiB": f"{r['peak_gib']:.2f}",
                     "model GiB": f"{r['analytic_gib']:.2f}",
                     "measured - model": f"{entry['difference_gib']:+.2f}",
                     "start - model resident": f"{entry['resident_difference_gib']:+.2f}",
                     "allocator rounding": f"{entry['rounding_gib']:.3f}",
                     "reserved - allocated": f"{entry['cache_gib']:.2f}",
                     "peak in (measured / model)": f"{r['peak_stage']} / {r['analytic_stage']}",
                     "largest live at the peak, made in the steps": "; ".join(
                         f"{c['category']} {c['gib']:.2f}" for c in entry["live_top"])})
    fp32 = [e for e in entries if e["precision"] == "fp32"]
    return {"table": to_markdown(pd.DataFrame(rows)), "configs": entries,
            "fp32_count": len(fp32),
            "fp32_stage_agrees": sum(e["stage_agrees"] for e in fp32),
            **{f"fp32_ratio_{stat}": (getattr(pd.Series([e["ratio"] for e in fp32]), stat)()
                                      if fp32 else None) for stat in ("min", "max")},
            "max_rounding_gib": max((e["rounding_gib"] for e in entries), default=None),
            "max_cache_gib": max((e["cache_gib"] for e in entries), default=None)}
