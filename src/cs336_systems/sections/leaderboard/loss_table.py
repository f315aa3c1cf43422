"""The leaderboard's loss benchmark: one record, each way of taking the LM head and its loss a
row (`loss_timing`); its table, and our chunked loss against each stock fused loss: time, the
memory it adds, and whether it meets the target against Liger's (no slower, no more memory)."""

from __future__ import annotations

import pandas as pd

from cs336_systems.records import read_record
from cs336_systems.report import facts, tables
from cs336_systems.report.render import fmt

OURS = "chunked"
STOCK = ("liger", "cut-cross-entropy")  # what users take for the LM head and loss instead
TARGET = "liger"  # the target: ours no slower than Liger's fused loss at no more memory
WHOLE = "whole-logits"
COLUMNS = ["loss", "label", "status", "step_ms_median", "step_ms_mean", "step_ms_std",
           "step_ms_min", "step_ms_max", "added_gib", "loss_abs_diff", "grad_hidden_rel_diff",
           "grad_weight_rel_diff", "message"]


def loss_frame(record: dict) -> pd.DataFrame:
    rows = [{k: v for k, v in row.items() if not k.endswith("_samples")}
            for row in record["metrics"].get("losses", [])]
    return tables.ensure_columns(pd.DataFrame(rows), COLUMNS)[COLUMNS]


def loss_display(frame: pd.DataFrame) -> pd.DataFrame:
    def ok(column, digits=None):  # errors in significant digits: they span decades
        shown = tables.format_number if digits is None else (lambda v: fmt(v, digits))
        return [shown(v) if s == "ok" else "" for v, s in zip(frame[column], frame["status"])]
    return pd.DataFrame({
        "LM head and loss": frame["label"], "status": frame["status"],
        "forward+backward ms": [tables.mean_pm_std(m, s) if st == "ok" else ""
                                for m, s, st in zip(frame["step_ms_mean"], frame["step_ms_std"],
                                                    frame["status"])],
        "added GiB": ok("added_gib", 2),
        "loss |diff|": ok("loss_abs_diff"),
        "dhidden rel diff": ok("grad_hidden_rel_diff"),
        "dW rel diff": ok("grad_weight_rel_diff")})


def _versus(ours: pd.Series, other: pd.Series) -> dict:
    """Ours against one other way: time (above 1, ours is faster) and the memory it adds."""
    time = facts.speedup(ours["step_ms_mean"], other["step_ms_mean"], ours["step_ms_std"],
                         other["step_ms_std"])
    memory = ours["added_gib"] / other["added_gib"] if other["added_gib"] > 0 else None
    no_slower = time is not None and (time["ratio"] >= 1 or bool(time["within_spread"]))
    return {"label": other["label"], "ms": facts.number(other["step_ms_mean"]),
            "added_gib": facts.number(other["added_gib"]), "time": time,
            "memory_ratio": facts.number(memory),
            "meets_target": no_slower and memory is not None and memory <= 1.0}


def loss_facts(paths: list[str], csv_path: str | None) -> dict:
    """The loss benchmark's facts (`measured` False where the preset has no record, or its
    record did not run)."""
    if not paths:
        return {"measured": False}
    record = read_record(paths[0])
    if record["status"] != "ok":
        return {"measured": False, "status": record["status"],
                "reason": facts.reason(record.get("message"))}
    frame = loss_frame(record)
    tables.write_table(frame, csv_path)
    ok = frame[frame["status"] == "ok"].set_index("loss")
    ours = ok.loc[OURS] if OURS in ok.index else None
    return {
        "measured": True, "tokens": record["config"]["tokens"],
        "shape": record["config"]["shape"], "precision": record["config"]["precision"],
        "d_model": record["metrics"]["d_model"], "vocab_size": record["metrics"]["vocab_size"],
        "logits_gib": record["metrics"]["logits_gib"],
        "table": tables.to_markdown(loss_display(frame)),
        "ours": None if ours is None else {"label": ours["label"],
                                           "ms": facts.number(ours["step_ms_mean"]),
                                           "added_gib": facts.number(ours["added_gib"])},
        "stock": [{**_versus(ours, ok.loc[s]), "is_target": s == TARGET}
                  for s in STOCK if ours is not None and s in ok.index],
        "whole": _versus(ours, ok.loc[WHOLE]) if ours is not None and WHOLE in ok.index
        else None,
        "not_run": [{"label": r["label"], "status": r["status"],
                     "reason": facts.reason(r["message"])}
                    for _, r in frame[frame["status"] != "ok"].iterrows()],
    }
