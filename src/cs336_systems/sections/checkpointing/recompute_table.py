"""gradient_checkpointing (b): one level of recomputation at full size, k blocks per checkpoint;
its table, the predicted best k against the measured one, and its figure."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.analysis import checkpoint_trees as ckpt
from cs336_systems.analysis.memory_model import block_residuals
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.measure.memory import GIB, PEAK_SOURCES
from cs336_systems.report import facts, figures, tables
from cs336_systems.report.render import fmt, fmt_ratio

NONE = "none"  # the block size of no checkpointing, in tables


def block_label(k) -> str:
    return NONE if k is None or (isinstance(k, float) and math.isnan(k)) else str(int(k))


def step_frame(paths: list[str]) -> pd.DataFrame:
    """One row per block size, checkpointed sizes ascending, then none."""
    frame = tables.ensure_columns(tables.records_frame(paths), [
        "checkpoint_block_size", "message", "peak_gib", "start_gib", "above_start_gib",
        "step_ms_mean", "step_ms_std", "forward_ms_mean", "backward_ms_mean", "peak_source",
        "num_layers", "parameter_gradient_gib", "device_gib", "checkpoints"])
    frame["block_size"] = frame["checkpoint_block_size"].map(block_label)
    frame["order"] = frame["checkpoint_block_size"].fillna(math.inf)
    return frame.sort_values("order").drop(columns="order").reset_index(drop=True)


def prediction(frame: pd.DataFrame) -> dict | None:
    """The simulator's peak of the blocks' activations for each block size of the run, in GiB,
    with the units of `memory_model.block_residuals` for its configuration, and the size with
    the least; None where that model does not apply (it models fp32 and plain attention)."""
    if frame.empty:
        return None
    first = frame.iloc[0]
    if first["precision"] != "fp32" or first["attention"] != "eager":
        return None
    spec = MODEL_SIZES[first["size"]]
    batch, seq = int(first["batch_size"]), int(first["context_length"])
    boundary = batch * seq * spec.d_model * 4
    activations = sum(block_residuals(spec, batch, seq).values()) - boundary
    n = spec.num_layers
    gib = {}
    for k in frame["checkpoint_block_size"]:
        label = block_label(k)
        tree = ckpt.no_checkpointing(n) if label == NONE else ckpt.one_level(n, int(k))
        gib[label] = ckpt.simulate(tree, activations, boundary).peak / GIB
    checkpointed = {label: v for label, v in gib.items() if label != NONE}
    best = min(checkpointed, key=checkpointed.get) if checkpointed else None
    unit, scale = ("GiB", 1.0) if max(gib.values()) >= 1 else ("MiB", 1024.0)
    shown = {label: v * scale for label, v in gib.items()}
    return {"gib": gib, "unit": unit, "best": best, "best_peak": shown.get(best),
            "none_peak": shown.get(NONE),
            "best_is_smallest": bool(checkpointed) and best == min(checkpointed, key=int),
            "blocks": n, "activations": activations / GIB * scale,
            "boundary": boundary / GIB * scale, "ratio": activations / boundary}


def reference(ok: pd.DataFrame) -> pd.Series | None:
    """The step times are compared with no checkpointing where it ran; else with the fastest
    block size that ran."""
    none = ok[ok["block_size"] == NONE]
    if len(none):
        return none.iloc[0]
    return ok.sort_values("step_ms_mean").iloc[0] if len(ok) else None


def neighbours(best: int, sizes: list[int], layers: int) -> dict:
    """The sizes beside the best one: the next smaller and larger in the run (measured by
    construction), and whether best - 1 and best + 1 themselves were; the sizes to add."""
    smaller = [k for k in sizes if k < best]
    larger = [k for k in sizes if k > best]
    add = []
    if best > 1 and best - 1 not in sizes:
        add.append(best - 1)
    if best < layers and best + 1 not in sizes:
        add.append(best + 1)
    return {"next_smaller": max(smaller) if smaller else None,
            "next_larger": min(larger) if larger else None,
            "smallest_possible": best == 1, "largest_possible": best >= layers,
            "minus_one_measured": best - 1 in sizes, "plus_one_measured": best + 1 in sizes,
            "add": add}


def display_unit(frame: pd.DataFrame) -> tuple[str, float]:
    """GiB, or MiB where every peak is under 1 GiB (smoke runs): the unit and its factor."""
    peaks = frame["peak_gib"].dropna()
    return ("GiB", 1.0) if len(peaks) == 0 or peaks.max() >= 1 else ("MiB", 1024.0)


def step_facts(frame: pd.DataFrame, predicted: dict | None) -> dict:
    """The table of (b), the best block size and its neighbours, what it saves against no
    checkpointing and what it costs in time. Memory facts are in `unit`."""
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        return {"any_ok": False}
    unit, scale = display_unit(frame)
    simulated = predicted["gib"] if predicted else None
    ref = reference(ok)
    ref_label = NONE if ref["block_size"] == NONE else f"k={ref['block_size']}"
    rows, table = [], []
    for _, r in frame.iterrows():
        cmp = (facts.speedup(r["step_ms_mean"], ref["step_ms_mean"], r["step_ms_std"],
                       ref["step_ms_std"]) if r["status"] == "ok" else None)
        sim = simulated.get(r["block_size"]) if simulated else None
        rows.append({"block_size": r["block_size"], "status": r["status"],
                     "peak": r["peak_gib"] * scale, "above_start": r["above_start_gib"] * scale,
                     "step_ms": r["step_ms_mean"], "step_ms_std": r["step_ms_std"],
                     "time_ratio": 1 / cmp["ratio"] if cmp else None,
                     "within_spread": cmp["within_spread"] if cmp else None,
                     "simulated": sim * scale if sim is not None else None})
        ratio = fmt_ratio(1 / cmp["ratio"]) if cmp else ""
        if cmp and cmp["within_spread"] and r["block_size"] != ref["block_size"]:
            ratio += " (within spread)"
        table.append({
            "block size": r["block_size"], "status": r["status"],
            f"peak {unit}": fmt(r["peak_gib"] * scale, 2),
            f"at start {unit}": fmt(r["start_gib"] * scale, 2),
            f"peak − start {unit}": fmt(r["above_start_gib"] * scale, 2),
            **({f"simulated block activations {unit}": fmt(sim * scale, 2)
                if sim is not None else ""} if simulated else {}),
            "step ms": tables.mean_pm_std(r["step_ms_mean"], r["step_ms_std"], 1),
            f"step time / {ref_label}": ratio})
    layers = int(ok["num_layers"].iloc[0])
    sizes = sorted(int(k) for k in frame["checkpoint_block_size"].dropna())
    none = frame[frame["block_size"] == NONE]
    first = ok.iloc[0]
    out = {"any_ok": True, "table": tables.to_markdown(pd.DataFrame(table)), "rows": rows,
           "unit": unit, "reference": ref_label, "reference_is_none": ref_label == NONE,
           "num_layers": layers, "sizes": sizes, "peak_source": first["peak_source"],
           "on_cuda": first["peak_source"] == PEAK_SOURCES["cuda"],
           "device_gib": first["device_gib"],
           "parameter_gradients": first["parameter_gradient_gib"] * scale,
           "start": first["start_gib"] * scale,
           "none_status": none["status"].iloc[0] if len(none) else "not run",
           "oom": [r["block_size"] for _, r in frame.iterrows() if r["status"] == "oom"]}
    compared = [r for r in rows
                if r["time_ratio"] and r["block_size"] not in (NONE, ref["block_size"])]
    out["time_ratio_min"] = min(r["time_ratio"] for r in compared) if compared else None
    out["time_ratio_max"] = max(r["time_ratio"] for r in compared) if compared else None
    out["compared"] = len(compared)
    out["within"] = sum(1 for r in compared if r["within_spread"])
    out["slower"] = sum(1 for r in compared if not r["within_spread"] and r["time_ratio"] > 1)
    out["faster"] = sum(1 for r in compared if not r["within_spread"] and r["time_ratio"] < 1)
    checkpointed = ok[ok["block_size"] != NONE]
    if checkpointed.empty:
        return {**out, "best": None}
    best = checkpointed.sort_values(["peak_gib", "step_ms_mean"]).iloc[0]
    k = int(best["checkpoint_block_size"])
    by_size = {r["block_size"]: r for r in rows}
    near = neighbours(k, sizes, layers)
    cmp = facts.speedup(best["step_ms_mean"], ref["step_ms_mean"], best["step_ms_std"],
                  ref["step_ms_std"])
    out["best"] = {**by_size[str(k)], "block_size": k, "time": cmp, **near,
                   "next_smaller_row": by_size.get(str(near["next_smaller"])),
                   "next_larger_row": by_size.get(str(near["next_larger"])),
                   "is_reference": str(k) == str(ref["block_size"])}
    out["saving"] = None
    if len(none) and none["status"].iloc[0] == "ok":
        n = none.iloc[0]
        out["saving"] = {"amount": (n["peak_gib"] - best["peak_gib"]) * scale,
                         "fraction": 1 - best["peak_gib"] / n["peak_gib"],
                         "above_start_fraction": 1 - best["above_start_gib"]
                         / n["above_start_gib"]}
    out["prediction_agrees"] = bool(predicted) and predicted["best"] == str(k)
    return out


def step_figure(frame: pd.DataFrame, path: str) -> None:
    """Memory per block size (bars: in use at the start, and the peak above it; a size that did
    not run is marked) and step time (points with their spread)."""
    unit, scale = display_unit(frame)
    fig, axes = figures.subplots(1, width=6.5)
    ax = axes[0][0]
    if frame.empty:
        ax.set_title("(no results)")
        figures.save(fig, path)
        return
    labels = list(frame["block_size"])
    start = frame["start_gib"].fillna(0) * scale
    above = frame["above_start_gib"].fillna(0) * scale
    ax.bar(labels, start, color="tab:gray", label="in use at the start")
    bars = ax.bar(labels, above, bottom=start, color="tab:blue", label="peak above the start")
    for bar, status in zip(bars, frame["status"]):
        if status != "ok":
            ax.annotate(status, (bar.get_x() + bar.get_width() / 2, 0), ha="center",
                        va="bottom", color="tab:red")
    ax.set(xlabel="checkpoint block size (blocks per checkpoint)", ylabel=f"peak {unit}")
    twin = ax.twinx()
    ok = frame[frame["status"] == "ok"]
    twin.errorbar(ok["block_size"], ok["step_ms_mean"], yerr=ok["step_ms_std"],
                  color="tab:orange", marker="o", linestyle="none", label="step time")
    twin.set_ylabel("step ms")
    twin.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    twin.legend(loc="upper right", fontsize=8)
    figures.save(fig, path)
