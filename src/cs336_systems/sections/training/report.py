"""A training step against stock parts: the optimizer's step alone beside the bandwidth floor and
torch's fused AdamW, and whole training steps of ours beside the stock model and optimizer,
each ratio against a reference from the same process (the optimizer) or the same job matrix
(the steps), with its spread.

`build(records, options, outputs)` reads two record groups: `optimizer` (one per size: every
optimizer timed in one process, `time_optimizer.py`) and `training` (one per size and run,
`time_training.py`), and writes `optimizer_table` and `training_table`.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import pandas as pd

from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.optimizer import optimizer_label
from cs336_systems.records import read_record
from cs336_systems.report import facts, tables
from cs336_systems.sections.training.runs import RUNS

SIZE_ORDER = {name: i for i, name in enumerate(MODEL_SIZES)}
TORCH_FUSED = "torch-adamw-fused"   # the optimizer the fused one is held against
OURS_FUSED = "adamw-fused"
HF = "hf-llama-compiled"            # the stock model, compiled
STOCK = "stock-compiled"            # our model with stock parts, compiled
STOCK_FA4 = "stock-fa4-compiled"    # the same with FlashAttention-4 (a peer's package)
PHASES = ("forward", "backward", "optimizer", "step")


# --- the optimizer alone -------------------------------------------------------------------

def optimizer_rows(paths: list[str]) -> pd.DataFrame:
    """One row per (size, optimizer), the size's floor beside it."""
    rows = []
    for path in paths:
        record = read_record(path)
        config, metrics = record["config"], record["metrics"]
        base = {"size": config["size"], "record_status": record["status"],
                "message": record.get("message", ""), "floor_ms": metrics.get("floor_ms"),
                "copy_gbps": metrics.get("copy_gbps"), "parameters": metrics.get("parameters"),
                "gpu": record["env"].get("gpu"), "git": record["env"].get("git")}
        if record["status"] != "ok":
            rows.append({**base, "optimizer": None, "status": record["status"]})
            continue
        for entry in metrics["optimizers"]:
            rounds = entry.get("rounds_ms") or []
            rows.append({**base, **{k: v for k, v in entry.items() if k != "rounds_ms"},
                         "ms_mean": statistics.fmean(rounds) if rounds else None,
                         "ms_std": statistics.stdev(rounds) if len(rounds) > 1 else None})
    frame = tables.ensure_columns(pd.DataFrame(rows), ["optimizer", "status", "ms_median", "ms_min",
                                                "ms_max", "ms_mean", "ms_std", "extra_gib",
                                                "floor_ms", "copy_gbps", "message"])
    if frame.empty:
        return frame
    frame["size_rank"] = frame["size"].map(SIZE_ORDER)
    return frame.sort_values(["size_rank"], kind="stable").drop(columns="size_rank")


def _spread(median, low, high, digits=2) -> str:
    if median is None or pd.isna(median):
        return ""
    return f"{median:.{digits}f} [{low:.{digits}f}–{high:.{digits}f}]"


def optimizer_facts(frame: pd.DataFrame) -> list[dict]:
    out = []
    for size, group in frame.groupby("size", sort=False):
        ok = group[group["status"] == "ok"].set_index("optimizer")
        floor = facts.number(group["floor_ms"].iloc[0])
        shown = pd.DataFrame({
            "optimizer": [optimizer_label(o) for o in ok.index],
            "step ms (median [min–max] of rounds)": [
                _spread(r.ms_median, r.ms_min, r.ms_max) for r in ok.itertuples()],
            "x floor": [r.ms_median / floor if floor else None for r in ok.itertuples()],
            f"x {optimizer_label(TORCH_FUSED)}": [
                r.ms_median / ok.loc[TORCH_FUSED, "ms_median"] if TORCH_FUSED in ok.index
                else None for r in ok.itertuples()],
            "extra GiB during the step": list(ok["extra_gib"])})
        fused = None
        if {OURS_FUSED, TORCH_FUSED} <= set(ok.index):
            a, b = ok.loc[OURS_FUSED], ok.loc[TORCH_FUSED]
            fused = {"vs_torch": facts.median_speedup(a["ms_median"], b["ms_median"],
                                                (a["ms_min"], a["ms_max"]),
                                                (b["ms_min"], b["ms_max"])),
                     "ms": facts.number(a["ms_median"]), "torch_ms": facts.number(b["ms_median"]),
                     "ratio_to_torch": facts.number(a["ms_median"] / b["ms_median"]),
                     "ratio_to_floor": facts.number(a["ms_median"] / floor) if floor else None,
                     "extra_gib": facts.number(a["extra_gib"])}
        reference = ok.loc["adamw"] if "adamw" in ok.index else None
        out.append({"size": size, "parameters": facts.number(group["parameters"].iloc[0]),
                    "gpu": group["gpu"].iloc[0], "git": group["git"].iloc[0],
                    "floor_ms": floor, "copy_gbps": facts.number(group["copy_gbps"].iloc[0]),
                    "table": (tables.to_markdown(shown) if len(shown)
                              else "_(no optimizer measured)_"),
                    "fused": fused,
                    "written_out_extra_gib": facts.number(reference["extra_gib"])
                    if reference is not None else None,
                    "not_measured": facts.not_ok(group.assign(optimizer=group["optimizer"].fillna(
                        "all")), ["optimizer"])})
    return out


# --- whole training steps --------------------------------------------------------------------

STATS = ("mean", "std", "median", "min", "max")


def training_frame(paths: list[str]) -> pd.DataFrame:
    """One row per run: its phases (each timed on its own) and `ms_*`, the step time of whole
    steps run back to back (`loop_step_ms_*`), which the comparisons use."""
    metrics = [f"{p}_ms_{s}" for p in (*PHASES, "loop_step") for s in STATS]
    frame = tables.ensure_columns(tables.records_frame(paths),
                                  ["message", "peak_gib", "matmul_tflops",
                                                  "model_flops", *metrics])
    if frame.empty:
        return frame
    for stat in STATS:
        frame[f"ms_{stat}"] = frame[f"loop_step_ms_{stat}"]
    frame["label"] = [RUNS[r].label if r in RUNS else r for r in frame["run"]]
    frame["stock"] = [RUNS[r].stock if r in RUNS else False for r in frame["run"]]
    frame["tflops"] = frame["model_flops"] / (frame["ms_median"] * 1e-3) / 1e12
    frame["size_rank"] = frame["size"].map(SIZE_ORDER)
    frame["run_rank"] = frame["run"].map({r: i for i, r in enumerate(RUNS)})
    return (frame.sort_values(["size_rank", "run_rank"]).drop(columns=["size_rank", "run_rank"])
            .reset_index(drop=True))


def _step_speedup(a: pd.Series, b: pd.Series) -> dict | None:
    """The step times' comparison as the tables show them: medians, with [min–max]."""
    return facts.median_speedup(a["ms_median"], b["ms_median"], (a["ms_min"], a["ms_max"]),
                          (b["ms_min"], b["ms_max"]))


def _twin_gains(ok: pd.DataFrame, lever: str, on: object, off: object) -> list[dict]:
    """Each measured run with `lever` (a field of `TrainingRun`) at `on`, beside its twin: the
    run that differs only in that field, set to `off`, where it was measured too, in the same
    job matrix (the same commit). The speedup and the peaks' difference."""
    names = {run: name for name, run in RUNS.items()}
    gains = []
    for name in ok.index:
        run = RUNS.get(name)
        if run is None or getattr(run, lever) != on:
            continue
        twin = names.get(replace(run, **{lever: off}))
        if twin in ok.index and ok.loc[twin, "env_git"] == ok.loc[name, "env_git"]:
            peak = ok.loc[twin, "peak_gib"] - ok.loc[name, "peak_gib"]
            gains.append({"run": run.label, "twin": RUNS[twin].label,
                          "ms": facts.number(ok.loc[name, "ms_median"]),
                          "twin_ms": facts.number(ok.loc[twin, "ms_median"]),
                          "speedup": _step_speedup(ok.loc[name], ok.loc[twin]),
                          "peak_gib": facts.number(abs(peak)),
                          "peak_word": "lower" if peak > 0 else "higher",
                          "optimizer": _optimizer_share(ok.loc[name], ok.loc[twin])})
    return gains


def _optimizer_share(run: pd.Series, twin: pd.Series) -> dict | None:
    """The optimizer's own phase (timed apart) in a run and its twin, and how much of the
    step's difference lies outside that phase: where most of it does, the lever (which changes
    only the optimizer) is not what made it."""
    phase, twin_phase = run["optimizer_ms_median"], twin["optimizer_ms_median"]
    if pd.isna(phase) or pd.isna(twin_phase):
        return None
    step_diff = run["ms_median"] - twin["ms_median"]
    outside = step_diff - (phase - twin_phase)
    return {"ms": facts.number(phase), "twin_ms": facts.number(twin_phase),
            "outside_ms": facts.number(outside),
            "mostly_outside": bool(abs(outside) > abs(phase - twin_phase))}


def training_facts(frame: pd.DataFrame) -> list[dict]:
    out = []
    for size, group in frame.groupby("size", sort=False):
        ok = group[group["status"] == "ok"].set_index("run")
        ceiling = facts.number(ok["matmul_tflops"].median()) if len(ok) else None
        shown = pd.DataFrame({
            "run": group["label"], "status": group["status"],
            "step ms (median [min–max])": [
                _spread(r.ms_median, r.ms_min, r.ms_max, 1) for r in group.itertuples()],
            "TFLOP/s": group["tflops"],
            "% of matmul ceiling": 100 * group["tflops"] / ceiling if ceiling else None,
            "optimizer % (phases timed apart)": 100 * group["optimizer_ms_median"]
            / group["step_ms_median"],
            "peak GiB": group["peak_gib"]})
        if group["env_git"].nunique() > 1:  # a table of several commits says which row is whose
            shown["commit"] = group["env_git"].to_numpy()
        ours = ok[~ok["stock"]]
        best = ours["ms_median"].idxmin() if len(ours) else None
        against = {}
        for reference in (HF, STOCK, STOCK_FA4):
            # a reference is compared with the fastest of ours measured in its own job matrix
            # (the same commit): rows of other matrices ran on another day, or another GPU
            beside = ours[ours["env_git"] == ok.loc[reference, "env_git"]] \
                if reference in ok.index else ours.iloc[:0]
            if beside.empty:
                continue
            mine = beside["ms_median"].idxmin()
            against[reference] = {
                "label": RUNS[reference].label,
                "ms": facts.number(ok.loc[reference, "ms_median"]),
                "ours_label": RUNS[mine].label, "ours_ms": facts.number(ok.loc[mine, "ms_median"]),
                "ours_is_best": bool(mine == best),
                "ratio": facts.number(ok.loc[mine, "ms_median"] / ok.loc[reference, "ms_median"]),
                "speedup": _step_speedup(ok.loc[mine], ok.loc[reference])}
        # what one lever buys: each run beside its twin without it, in the same matrix
        fused_gain = _twin_gains(ok, "optimizer", "adamw-fused", "adamw")
        masters_gain = _twin_gains(ok, "master_weights", True, False)
        # the ceiling is measured in each job: its range says how far the share can be trusted
        ceilings = ok["matmul_tflops"].dropna()
        out.append({
            "size": size, "ceiling_tflops": ceiling,
            "ceiling_range": None if ceilings.empty else {
                "min": facts.number(ceilings.min()), "max": facts.number(ceilings.max()),
                "jobs": len(ceilings)},
            "table": tables.to_markdown(shown),
            "best": None if best is None else {
                "label": RUNS[best].label, "ms": facts.number(ok.loc[best, "ms_median"]),
                "tflops": facts.number(ok.loc[best, "tflops"]),
                "ceiling_share": (facts.number(ok.loc[best, "tflops"] / ceiling)
                                  if ceiling else None),
                "ceiling_share_range": None if ceilings.empty else {
                    "min": facts.number(ok.loc[best, "tflops"] / ceilings.max()),
                    "max": facts.number(ok.loc[best, "tflops"] / ceilings.min())},
                "peak_gib": facts.number(ok.loc[best, "peak_gib"])},
            "against": against, "fused_gain": fused_gain, "masters_gain": masters_gain,
            "not_measured": facts.not_ok(group, ["label"])})
    return out


def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    optimizer = optimizer_rows(records["optimizer"])
    training = training_frame(records["training"])
    tables.write_table(optimizer, outputs["optimizer_table"])
    tables.write_table(training, outputs["training_table"])
    shape = training.iloc[0] if len(training) else None
    optimizer_out = optimizer_facts(optimizer) if len(optimizer) else []
    training_out = training_facts(training) if len(training) else []
    extra = {entry["size"]: entry["written_out_extra_gib"] for entry in optimizer_out}
    for entry in training_out:  # beside a step's peak: what the optimizer alone allocated
        entry["written_out_extra_gib"] = extra.get(entry["size"])
    return {
        "optimizer": optimizer_out,
        "training": training_out,
        "shape": None if shape is None else {
            "context_length": int(shape["context_length"]),
            "batch_size": int(shape["batch_size"]), "precision": shape["precision"],
            "warmup_steps": int(shape["warmup_steps"]),
            "measure_steps": int(shape["measure_steps"])},
        "optimizer_table": outputs["optimizer_table"],
        "training_table": outputs["training_table"],
        "env": tables.env_summary(training, tables.records_frame(records["optimizer"])),
        "coverage": {},
    }
