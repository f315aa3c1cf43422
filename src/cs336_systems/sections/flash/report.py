"""FlashAttention-2 (assignment §4): the flash_benchmarking and leaderboard tables, figures and
facts, from the records of `cs336_systems.sections.flash.time_flash`, the speed targets' table
(`speed_table`, from the records of `time_targets`) and the kernel profile (`kernel_table`,
from the records of `kernel_profile`).

`build` is the section's entry point (`cs336_systems.pipeline.jobs.section_tables`); its facts are
rendered by `template.md.j2`. `options["assignment"]` is the assignment's own matrix (the
config's `defaults.flash`): what of it this preset leaves out goes into the coverage notes.
Speed-ups are ratios of do_bench medians (one number per cell, no spread), so no fact claims a
difference is beyond noise. Throughput is in TFLOP/s of the FlashAttention-2 paper's count
(`pass_flops`). Each table's facts say which commits its records came from.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.lm.attention import attention_label, attention_part_flops
from cs336_systems.report import facts, figures, tables
from cs336_systems.report.render import fmt, fmt_ratio
from cs336_systems.sections.flash import kernel_table, speed_table
from cs336_systems.sections.flash.targets import CLASS_BEST_MS, OURS

PASSES = ["forward", "backward", "forward_backward"]
CONFIG_COLUMNS = ["attention", "seq", "d", "precision", "batch_size", "causal", "compile"]
METRIC_COLUMNS = ([f"{p}_ms" for p in PASSES] + [f"{p}_status" for p in PASSES]
                  + ["peak_gib", "sdpa_backend"])  # the backend unpinned SDPA chose
TFLOPS_COLUMNS = [f"{p}_tflops" for p in PASSES]
SHAPE_KEYS = ["d", "precision", "seq"]
# FLOPs of each pass as multiples of the forward's, and the share of the score matrix a causal
# kernel computes: the FlashAttention-2 paper's convention (backward: five matmuls against the
# forward's two; causal: half the scores).
PASS_FLOPS = {"forward": 1.0, "backward": 2.5, "forward_backward": 3.5}
CAUSAL_FRACTION = 0.5
# Display order; the speed-ups are of FLASH over each REFERENCES implementation.
ATTENTION_ORDER = ["flash-triton", "flash-pytorch", "sdpa", "sdpa-flash", "sdpa-cudnn", "eager"]
FLASH = OURS
REFERENCES = ("eager", "sdpa")
# The leaderboard case's keys that the config sets (the leaderboard rule always times it
# causal and compiled).
LEADERBOARD_KEYS = ("batch_size", "seq", "d", "precision")
CODE_AND_TESTS = ("by the kernels and their tests (tests/kernels/test_flash_kernels.py), not by a job of "
                  "this pipeline")


# --- tables and figures ----------------------------------------------------------------------

def pass_flops(batch: int, seq: int, d: int, causal: bool, pass_name: str) -> float:
    """FLOPs of one pass of attention over q, k, v of (batch, seq, d): the forward's two
    matmuls, q k^T and P v (`attention_part_flops`, 2 per multiply-add; the softmax is not
    counted), times CAUSAL_FRACTION under a causal mask, times PASS_FLOPS[pass_name]."""
    parts = attention_part_flops(batch, seq, d)
    forward = parts["attention.scores"] + parts["attention.output"]
    return forward * (CAUSAL_FRACTION if causal else 1.0) * PASS_FLOPS[pass_name]


def with_tflops(frame: pd.DataFrame) -> pd.DataFrame:
    """`{pass}_tflops` for each pass with a time: pass_flops / time."""
    for p in PASSES:
        frame[f"{p}_tflops"] = [
            pass_flops(int(r["batch_size"]), int(r["seq"]), int(r["d"]), bool(r["causal"]), p)
            / (r[f"{p}_ms"] * 1e-3) / 1e12 if pd.notna(r[f"{p}_ms"]) else float("nan")
            for _, r in frame.iterrows()]
    return frame


def build_table(record_paths: list[str]) -> pd.DataFrame:
    """One row per record; each pass has a time or a status of its own (`ok`, `oom`, or the
    record's status where the whole configuration did not run)."""
    frame = tables.ensure_columns(tables.records_frame(record_paths),
                           CONFIG_COLUMNS + ["status", "message"] + METRIC_COLUMNS)
    for p in PASSES:  # a pass with no time and no status of its own shares the record's
        frame[f"{p}_status"] = frame[f"{p}_status"].astype(object)
        missing = frame[f"{p}_ms"].isna() & frame[f"{p}_status"].isna()
        frame.loc[missing, f"{p}_status"] = frame.loc[missing, "status"]
        frame.loc[frame[f"{p}_ms"].notna(), f"{p}_status"] = "ok"
    frame = with_tflops(frame)
    frame["attention_rank"] = frame["attention"].map({n: i for i, n in enumerate(ATTENTION_ORDER)})
    frame = frame.sort_values(["d", "precision", "seq", "attention_rank"])
    return frame[CONFIG_COLUMNS + ["status"] + METRIC_COLUMNS + TFLOPS_COLUMNS + ["message"]
                 + tables.env_columns(frame)]


def overhead_cells(table: pd.DataFrame) -> pd.Series:
    """Per row, whether its forward+backward time is overhead-bound (`facts.overhead_bound`,
    against longer sequences of the same implementation, d and dtype, in FLOPs)."""
    flops = pd.Series([pass_flops(int(r["batch_size"]), int(r["seq"]), int(r["d"]),
                                  bool(r["causal"]), "forward_backward")
                       for _, r in table.iterrows()], index=table.index, dtype=float)
    return facts.overhead_bound(table, ["attention", "d", "precision"], flops,
                                "forward_backward_ms")


def _pass(row: pd.Series, p: str) -> str:
    """One pass's time in ms, or its status (`oom`, `skipped`, ...) where it has none."""
    value = row[f"{p}_ms"]
    return fmt(value, 3) if pd.notna(value) else str(row[f"{p}_status"])


def _cell(row: pd.Series, overhead: bool = False) -> str:
    """'fwd / bwd / fwd+bwd' in ms; a pass that did not run shows its status; * marks an
    overhead-bound cell."""
    return " / ".join(_pass(row, p) for p in PASSES) + (" *" if overhead else "")


def _tflops(row: pd.Series) -> str:
    """Forward+backward TFLOP/s ('' where it has no time)."""
    return fmt(row["forward_backward_tflops"], 1)


def display_table(table: pd.DataFrame, flags: pd.Series) -> pd.DataFrame:
    """One row per (d, dtype, seq); per implementation, its three times (* where `flags`, from
    `overhead_cells`, marks the cell) and its forward+backward TFLOP/s (blank: no record)."""
    rows = []
    for (d, dtype, seq), group in table.groupby(SHAPE_KEYS, sort=True):
        row = {"d": d, "precision": dtype, "seq": seq}
        for i, r in group.iterrows():
            row[f"{attention_label(r['attention'])} ms"] = _cell(r, flags[i])
            row[f"{attention_label(r['attention'])} TFLOP/s"] = _tflops(r)
        rows.append(row)
    return pd.DataFrame(rows).fillna("")


# The head dimension of the writeup's own latency table (the 2025 leaderboard's); the companion
# page has every one.
FOCUS_D = 64


def latency_focus(display: pd.DataFrame) -> dict:
    """The latency table at one head dimension (FOCUS_D where measured, else the largest), both
    dtypes: what the writeup shows of the handout's table."""
    if display.empty:
        return {"d": None, "markdown": tables.to_markdown(display)}
    d = FOCUS_D if FOCUS_D in set(display["d"]) else max(display["d"])
    return {"d": int(d), "markdown": tables.to_markdown(display[display["d"] == d])}


def speedup_display(table: pd.DataFrame, flags: pd.Series) -> pd.DataFrame:
    """Our kernel's forward+backward speed-up over each reference, one row per (d, dtype,
    reference) and one column per sequence length: time(reference) / time(ours), * where
    either cell is overhead-bound, or the status of whichever did not run."""
    indexed = table.assign(overhead=flags).set_index(["attention", *SHAPE_KEYS])
    seqs = sorted(set(table["seq"]))
    rows = []
    for over in REFERENCES:
        for d, dtype in sorted(set(zip(table["d"], table["precision"]))):
            row = {"d": d, "precision": dtype, "over": attention_label(over)}
            for seq in seqs:
                cells = [indexed.loc[(impl, d, dtype, seq)] if (impl, d, dtype, seq)
                         in indexed.index else None for impl in (FLASH, over)]
                ours, ref = cells
                if ours is None or ref is None:
                    row[f"seq {seq}"] = ""
                elif pd.isna(ours["forward_backward_ms"]) or pd.isna(ref["forward_backward_ms"]):
                    missing = ours if pd.isna(ours["forward_backward_ms"]) else ref
                    row[f"seq {seq}"] = str(missing["forward_backward_status"])
                else:
                    row[f"seq {seq}"] = fmt_ratio(
                        ref["forward_backward_ms"] / ours["forward_backward_ms"]) + (
                        " *" if ours["overhead"] or ref["overhead"] else "")
            rows.append(row)
    return pd.DataFrame(rows)


def leaderboard_display(board: pd.DataFrame) -> pd.DataFrame:
    """One row per implementation: status and the three pass times in ms; a pass that did
    not run shows its status (`oom`: out of memory), as in the main table."""
    return pd.DataFrame({
        "implementation": board["attention"].map(attention_label),
        "status": board["status"],
        **{f"{p.replace('_', '+')} ms": [_pass(r, p) for _, r in board.iterrows()]
           for p in PASSES},
        "forward+backward TFLOP/s": [_tflops(r) for _, r in board.iterrows()],
    })


def speedups(table: pd.DataFrame, over: str, of: str = FLASH,
             metric: str = "forward_backward_ms") -> pd.DataFrame:
    """time(over) / time(of) per (d, dtype, seq) where both ran: above 1, `of` is faster."""
    a = table[table["attention"] == of].set_index(SHAPE_KEYS)[metric]
    b = table[table["attention"] == over].set_index(SHAPE_KEYS)[metric]
    return (b / a).dropna().rename("speedup").reset_index()


def latency_figure(table: pd.DataFrame, path: str | Path) -> None:
    ds = sorted(table["d"].dropna().unique())
    fig, axes = figures.subplots(max(len(ds), 1), width=4.2)
    for ax, d in zip(axes[0], ds):
        for (impl, dtype), group in table[table["d"] == d].groupby(["attention", "precision"]):
            group = group.dropna(subset=["forward_backward_ms"]).sort_values("seq")
            if len(group):
                ax.plot(group["seq"], group["forward_backward_ms"], marker="o",
                        linestyle="-" if dtype == "bf16" else "--",
                        label=f"{attention_label(impl)}, {dtype}")
        ax.set(yscale="log", xlabel="sequence length", ylabel="forward+backward (ms)",
               title=f"d = {d}")
        ax.set_xscale("log", base=2)
        if ax.lines:
            ax.legend(fontsize=6)
    figures.save(fig, path)


def speedup_figure(table: pd.DataFrame, path: str | Path) -> None:
    fig, axes = figures.subplots(1, width=8.0)
    ax = axes[0][0]
    for over in REFERENCES:
        s = speedups(table, over=over)
        for (d, dtype), group in s.groupby(["d", "precision"]):
            group = group.sort_values("seq")
            ax.plot(group["seq"], group["speedup"], marker="o",
                    linestyle="-" if over == "eager" else ":",
                    label=f"over {attention_label(over)}, d={d}, {dtype}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set(xlabel="sequence length",
           ylabel=f"speed-up of {attention_label(FLASH)} (forward+backward)",
           title=f"{attention_label(FLASH)} speed-up")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    figures.save(fig, path)


# --- facts -----------------------------------------------------------------------------------

def _where(row: pd.Series) -> dict:
    return {"seq": int(row["seq"]), "d": int(row["d"]), "precision": str(row["precision"])}


def speedup_summary(table: pd.DataFrame, over: str) -> dict | None:
    """Forward+backward speed-up of FLASH over `over` across the shapes where both ran:
    median, extremes and where they occur, how many shapes FLASH wins."""
    s = speedups(table, over=over)
    if s.empty:
        return None
    best = s.loc[s["speedup"].idxmax()]
    worst = s.loc[s["speedup"].idxmin()]
    median = float(s["speedup"].median())
    return {"attention": over, "label": attention_label(over), "shapes": len(s),
            # the median ratio as a verdict: time 1 against reference `median`, no spread
            "median": median, "median_verdict": facts.speedup(1.0, median),
            "min": float(worst["speedup"]), "min_at": _where(worst),
            "max": float(best["speedup"]), "max_at": _where(best),
            "faster_shapes": int((s["speedup"] > 1).sum())}


def pass_speedups(table: pd.DataFrame, over: str) -> dict:
    """Median speed-up of FLASH over `over` per pass (None where no shape has both times)."""
    medians = {}
    for p in PASSES:
        s = speedups(table, over=over, metric=f"{p}_ms")
        medians[p] = float(s["speedup"].median()) if len(s) else None
    return {"attention": over, "label": attention_label(over), "medians": medians,
            "any": any(m is not None for m in medians.values())}


def _status_facts(table: pd.DataFrame, status: str) -> dict:
    rows = table[table["status"] == status]
    return {"count": len(rows),
            "reasons": sorted({facts.reason(m) for m in rows["message"]} - {""})}


def oom_facts(table: pd.DataFrame) -> list[dict]:
    """Per (implementation, d, dtype) with any pass out of memory: the shortest such sequence
    and which passes ran out."""
    out = []
    any_oom = pd.concat([table[f"{p}_status"] == "oom" for p in PASSES], axis=1).any(axis=1)
    oom = table[any_oom]
    for (impl, d, dtype), group in oom.groupby(["attention", "d", "precision"], sort=True):
        out.append({"attention": impl, "label": attention_label(impl), "d": int(d),
                    "precision": str(dtype), "from_seq": int(group["seq"].min()),
                    "configurations": len(group),
                    "passes": [p for p in PASSES if (group[f"{p}_status"] == "oom").any()]})
    return out


def _only(values: pd.Series):
    """The one value a column holds, or None where it holds none or several."""
    distinct = values.dropna().unique()
    return facts.jsonable(distinct[0]) if len(distinct) == 1 else None


def _ran_with_do_bench(table: pd.DataFrame) -> bool:
    """Whether the timed rows ran on CUDA (triton's do_bench) rather than the CPU fallback
    (wall-clock medians of a few calls)."""
    ok = table[table["status"] == "ok"]
    return bool("env_device" in ok and (ok["env_device"] == "cuda").any())


def _interpreted(table: pd.DataFrame) -> bool:
    """Whether FLASH has times from a CPU, where its kernels run in Triton's interpreter."""
    ok = table[(table["status"] == "ok") & (table["attention"] == FLASH)]
    return bool("env_device" in ok and (ok["env_device"] == "cpu").any())


def sweep_gap(table: pd.DataFrame, assignment: dict) -> str:
    """What of the assignment's flash_benchmarking sweep (`assignment`: the config's
    `defaults.flash`) this table leaves out ('' if none)."""
    return facts.not_in_preset(
        {name: (assignment[key], table[name].dropna().tolist())
         for name, key in (("seq", "seq_lengths"), ("d", "d_heads"), ("precision", "precisions"))},
        more=[f"no {attention_label(impl)} rows" for impl in assignment["attention"]
              if impl not in set(table["attention"])],
        lead="not in this preset's sweep")


def leaderboard_shape(board: pd.DataFrame) -> dict | None:
    if board.empty:
        return None
    first = board.iloc[0]
    return {"batch_size": int(first["batch_size"]), "seq": int(first["seq"]),
            "d": int(first["d"]), "precision": str(first["precision"]),
            "causal": bool(first["causal"]), "compile": bool(first["compile"])}


def assignment_case(assignment: dict) -> dict:
    """The assignment's leaderboard case (batch, seq, d, dtype), from its matrix."""
    return {key: assignment["leaderboard"][key] for key in LEADERBOARD_KEYS}


def is_assignment_case(shape: dict | None, assignment: dict) -> bool:
    """Whether the timed case is the assignment's (the rule always times it causal, compiled)."""
    return shape is not None and all(shape[k] == v for k, v in assignment_case(assignment).items())


# SDPA's backends as its dispatch names them (lm.attention.sdpa_choice), in prose
SDPA_BACKENDS = {"FLASH_ATTENTION": "flash", "CUDNN_ATTENTION": "cuDNN",
                 "EFFICIENT_ATTENTION": "memory-efficient", "MATH": "math"}


def sdpa_backend(board: pd.DataFrame) -> str | None:
    """The backend unpinned SDPA's dispatch chose in the leaderboard case, where its record
    names one (records before that field: None)."""
    if "sdpa_backend" not in board.columns:
        return None
    chosen = board.set_index("attention")["sdpa_backend"].dropna()
    if "sdpa" not in chosen.index:
        return None
    return SDPA_BACKENDS.get(chosen["sdpa"], chosen["sdpa"])


def leaderboard_facts(board: pd.DataFrame, assignment: dict) -> dict:
    """The leaderboard case: its table, shape, Triton and SDPA times, their ratio, and Triton's
    time against the class's best entry (only where the shape is the assignment's)."""
    shape = leaderboard_shape(board)
    ok = board.dropna(subset=["forward_backward_ms"]).set_index("attention")["forward_backward_ms"]
    triton_ms = float(ok[FLASH]) if FLASH in ok.index else None
    sdpa_ms = float(ok["sdpa"]) if "sdpa" in ok.index else None
    assignment_shape = is_assignment_case(shape, assignment)
    return {
        "table": tables.to_markdown(leaderboard_display(board)),
        "rows": len(board),
        "shape": shape,
        "assignment_shape": assignment_case(assignment),
        "is_assignment_shape": assignment_shape,
        "do_bench": _ran_with_do_bench(board),
        "triton_ms": triton_ms,
        "sdpa_ms": sdpa_ms,
        "sdpa_backend": sdpa_backend(board),
        # ratio = SDPA time / Triton time: above 1, Triton is faster
        "vs_sdpa": facts.speedup(triton_ms, sdpa_ms),
        "class_best_ms": CLASS_BEST_MS,
        # ratio = class best / Triton time; only meaningful on the assignment's shape
        "vs_class_best": facts.speedup(triton_ms, CLASS_BEST_MS) if assignment_shape else None,
        "not_ok": [{**r, "label": attention_label(r["attention"])}
                   for r in facts.not_ok(board, ["attention"])],
    }


def coverage(table: pd.DataFrame, board: pd.DataFrame, assignment: dict) -> dict[str, dict]:
    """What this section answers of §4, by the assignment's problem keys."""
    shape = leaderboard_shape(board)
    gaps = []
    if shape is not None and not is_assignment_case(shape, assignment):
        gaps.append(f"this preset times ({shape['batch_size']}, {shape['seq']}, {shape['d']}) "
                    f"{shape['precision']}, not the assignment's case")
    if not board.empty:
        gaps += [f"no {attention_label(impl)} entry"
                 for impl in assignment["leaderboard"]["attention"]
                 if impl not in set(board["attention"])]
    return {
        **{key: facts.covered(None, how=CODE_AND_TESTS, anchor=key)
           for key in ("weighted_sum", "flash_forward", "flash_backward")},
        "flash_benchmarking": facts.covered(table, missing=sweep_gap(table, assignment),
                                      anchor="flash_benchmarking"),
        "leaderboard (2025)": facts.covered(board, missing="; ".join(gaps),
                                            anchor="leaderboard_2025"),
    }


def commits(table: pd.DataFrame, column: str = "env_git") -> dict:
    """The commits a table's records came from, and whether there are several."""
    found = sorted({str(c) for c in table[column].dropna()}) if column in table else []
    return {"commits": found, "mixed": len(found) > 1}


def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    """Write the flash table, the leaderboard table, the speed table and both figures to
    `outputs`; return the section's facts. options: assignment, the assignment's matrix (the
    config's `defaults.flash`)."""
    assignment = options["assignment"]
    table = build_table(records["records"])
    board = build_table(records["leaderboard"])
    speed = speed_table.speed_table(records["speed"])
    tables.write_table(table, outputs["table"])
    tables.write_table(board, outputs["leaderboard_table"])
    tables.write_table(speed, outputs["speed_table"])
    kernels = kernel_table.kernels_table(records["kernels"])
    tables.write_table(kernels, outputs["kernels_table"])
    latency_figure(table, outputs["latency_figure"])
    speedup_figure(table, outputs["speedup_figure"])

    timed = table.dropna(subset=["forward_backward_ms"])
    flags = overhead_cells(table)
    busy = table[~flags]
    return {
        # where and from which code every record of the section came, the speed targets'
        # and the kernel profile's included
        "env": tables.env_summary(table, board, tables.records_frame(records["speed"]),
                           tables.records_frame(records["kernels"])),
        "commits": {"flash": commits(table), "leaderboard": commits(board),
                    "speed": commits(speed, "commit"), "kernels": commits(kernels, "commit")},
        "flops": {"pass_factors": PASS_FLOPS, "causal_fraction": CAUSAL_FRACTION},
        "speed": {**speed_table.speed_facts(speed, records["speed"]),
                  "clock_bounds": kernel_table.clock_bounds(speed, records["kernels"]),
                  "csv": outputs["speed_table"]},
        "kernels": kernel_table.kernel_facts(records["kernels"], outputs["kernels_table"]),
        "coverage": coverage(table, board, assignment),
        "flash_label": attention_label(FLASH),
        "batch_size": _only(table["batch_size"]),
        "causal": _only(table["causal"]),
        "do_bench": _ran_with_do_bench(table),
        "flash_interpreted": _interpreted(table),
        "configurations": len(table),
        "shapes": len(table.groupby(SHAPE_KEYS)) if len(table) else 0,
        "implementations": [attention_label(i) for i in ATTENTION_ORDER if i in set(table["attention"])],
        "latency": tables.long_table(display_table(table, flags), outputs["table"],
                              speedup_display(table, flags)),
        "latency_full": tables.to_markdown(display_table(table, flags)),
        "latency_focus": latency_focus(display_table(table, flags)),
        "speedup_over": {over: speedup_summary(table, over) for over in REFERENCES},
        "pass_speedups": {over: pass_speedups(table, over) for over in REFERENCES},
        "timed_cells": len(timed),
        "overhead": {**facts.overhead_rule(), "of": len(timed),
                     "count": int(flags.sum())},
        # the kernels compared where the GPU is busy: neither cell overhead-bound
        "speedup_busy": {over: speedup_summary(busy, over) for over in REFERENCES},
        "oom": oom_facts(table),
        "skipped": _status_facts(table, "skipped"),
        "errors": _status_facts(table, "error"),
        "latency_figure": outputs["latency_figure"],
        "speedup_figure": outputs["speedup_figure"],
        "leaderboard": leaderboard_facts(board, assignment),
    }
