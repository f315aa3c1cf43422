"""memory_profiling (assignment §1.5, parts (a) to (e)): peaks, timelines, the residual-stream
activation and the largest allocations, from the memory records, with the analytic model
(`memory_model`) beside every measured peak. Part (f) is the `residuals` section's.

`build` is the section's report module entry (see `cs336_systems.sections`); the prose
is in `template.md.j2`. Each record holds one configuration's peaks (the allocator's,
allocated and reserved), the stage of the peak, the live bytes at the peak by category, the
largest allocations with the source lines that made them and the count of residual-sized
allocations; the compact timeline beside it (`<record>.timeline.json.gz`) is what the figures
are drawn from, so they redraw without the heavy snapshot.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.sizes import size_label
from cs336_systems.lm.step import MODES
from cs336_systems.measure.memory_timeline import Timeline
from cs336_systems.report import facts, figures
from cs336_systems.report.tables import (
    env_summary,
    to_markdown,
    write_table,
)
from cs336_systems.sections.memory import timeline_figure as plot
from cs336_systems.sections.memory.peaks import (
    CONFIG,
    MIB,
    bf16_facts,
    comparisons,
    load_timeline,
    metrics_of,
    model_table,
    peak_frame,
    peak_table,
    sidecar,
)


def panel_title(row) -> str:
    return f"{size_label(row['size'])} ctx {row['context_length']}, {row['precision']}"


def timeline_figure(rows: pd.DataFrame, timelines: dict[int, Timeline],
                    palette: dict[str, str], title: str, path: str) -> None:
    """One panel per (size, context) row and precision column; a panel for each configuration
    without a timeline says why; the legend names the coloured source lines."""
    keys = list(dict.fromkeys(zip(rows["size"], rows["context_length"]))) or [("", 0)]
    precisions = list(dict.fromkeys(rows["precision"])) or ["fp32"]
    drawn = [t for i, t in timelines.items() if i in rows.index]
    sources = {t.sites[int(t.site[k])]["label"]: t.sites[int(t.site[k])]["source"]
               for t in drawn for k in t.largest_indices()}
    handles = plot.legend_handles(palette, sources, sources)
    legend_height = 0.3 + 0.17 * -(-len(handles) // 2)       # inches: two columns of entries
    fig = figures.plt.figure(figsize=(6.0 * len(precisions),
                                      3.4 * len(keys) + legend_height + 0.4))
    grid = fig.add_gridspec(len(keys) + 1, len(precisions),
                            height_ratios=[3.4] * len(keys) + [legend_height])
    for i, (size, context) in enumerate(keys):
        for j, precision in enumerate(precisions):
            ax = fig.add_subplot(grid[i, j])
            match = rows[(rows["size"] == size) & (rows["context_length"] == context)
                          & (rows["precision"] == precision)]
            if match.empty:
                plot.not_measured(ax, f"{size} ctx {context}, {precision}",
                                  "not in this preset")
                continue
            row = match.iloc[0]
            timeline = timelines.get(match.index[0])
            if timeline is None:
                why = facts.reason(row["message"]) or "the timeline file is missing"
                plot.not_measured(ax, panel_title(row), f"{row['status']}: {why}"
                                  if row["status"] != "ok" else why)
                continue
            plot.draw(ax, timeline, palette, panel_title(row))
    legend = fig.add_subplot(grid[len(keys), :])
    legend.set_axis_off()
    legend.legend(handles=handles, loc="upper center", ncol=2, fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=10)
    figures.save(fig, path)


def stages(frame: pd.DataFrame) -> list[dict]:
    """(a) The stage of each measured peak."""
    ok = frame[frame["status"] == "ok"]
    return [{"size": r["size"], "context_length": r["context_length"], "mode": r["mode"],
             "precision": r["precision"],
             "stage": "an unmarked phase" if pd.isna(r["peak_stage"]) else r["peak_stage"],
             "step": None if pd.isna(r["peak_step"]) else int(r["peak_step"]),
             "peak_gib": r["trace_peak_gib"]}
            for _, r in ok.iterrows()]


def peak_summary(frame: pd.DataFrame) -> list[dict]:
    """(a), (b) in one line per size and mode: where its peaks fall (how many runs in each
    stage), and its fp32 peak from the shortest context measured to the longest."""
    ok = frame[frame["status"] == "ok"]
    summary = []
    for (size, mode), group in ok.groupby(["size", "mode"], sort=False):
        stage_counts = group["peak_stage"].fillna("an unmarked phase").value_counts()
        fp32 = group[group["precision"] == "fp32"].sort_values("context_length")
        summary.append({
            "size": size, "mode": mode, "runs": len(group),
            "stages": [{"stage": stage, "count": int(n)} for stage, n in stage_counts.items()],
            "fp32": None if fp32.empty else {
                "first_context": int(fp32["context_length"].iloc[0]),
                "first_gib": float(fp32["peak_gib"].iloc[0]),
                "last_context": int(fp32["context_length"].iloc[-1]),
                "last_gib": float(fp32["peak_gib"].iloc[-1]),
                "contexts": len(fp32)}})
    return summary


def residual_facts(frame: pd.DataFrame) -> dict:
    """(d) One residual-stream activation (batch x context x d_model x 4 bytes) per size and
    context, and how many allocations of that block size each measured step made."""
    derived = []
    for (size, context, batch), _ in frame.groupby(["size", "context_length", "batch_size"],
                                                   sort=False):
        d_model = MODEL_SIZES[size].d_model
        nbytes = batch * context * d_model * 4
        derived.append({"size": size, "context_length": context, "batch_size": batch,
                        "d_model": d_model, "bytes": nbytes, "mib": nbytes / MIB})
    rows, found = [], []
    for _, r in frame[frame["status"] == "ok"].iterrows():
        metrics = metrics_of(r)
        per_step = metrics["residual_allocations"] / r["measure_steps"]
        lines = metrics.get("residual_lines", [])
        found.append({"size": r["size"], "context_length": r["context_length"],
                      "mode": r["mode"], "precision": r["precision"],
                      "count": metrics["residual_allocations"], "per_step": per_step,
                      "top_line": lines[0]["label"] if lines else None})
        rows.append({"size": r["size"], "context": r["context_length"], "mode": r["mode"],
                     "precision": r["precision"], "MiB": metrics["residual_bytes"] / MIB,
                     "allocations per step": f"{per_step:g}",
                     "lines that made most of them (per step)": ", ".join(
                         f"{x['label']} ({x['count'] / r['measure_steps']:g})"
                         for x in lines[:3])})
    return {"derived": derived, "found": found, "table": to_markdown(pd.DataFrame(rows)),
            "any_found": any(f["count"] for f in found)}


def largest_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Every record's largest allocations (top 10 % by size, by source line and size)."""
    rows = []
    for _, r in frame[frame["status"] == "ok"].iterrows():
        for a in metrics_of(r).get("largest_allocations", []):
            rows.append({**{k: r[k] for k in CONFIG}, "mib": a["bytes"] / MIB,
                         "count": a["count"], "phases": ", ".join(a["phases"]),
                         "label": a["label"], "function": a["function"],
                         "source": a["source"], "category": a["category"]})
    return pd.DataFrame(rows, columns=[*CONFIG, "mib", "count", "phases", "label", "function",
                                       "source", "category"])


def focus(frame: pd.DataFrame) -> list[dict]:
    """Per size and mode, the longest context measured, fp32 where it ran: the tables' focus."""
    ok = frame[frame["status"] == "ok"]
    out = []
    for (size, mode), group in ok.groupby(["size", "mode"], sort=False):
        longest = group[group["context_length"] == group["context_length"].max()]
        pick = longest[longest["precision"] == "fp32"]
        row = (pick if len(pick) else longest).iloc[0]
        out.append({k: row[k] for k in CONFIG})
    return out


def largest_facts(largest: pd.DataFrame, chosen: list[dict]) -> dict:
    tables = []
    for config in chosen:
        rows = largest
        for key in CONFIG:
            rows = rows[rows[key] == config[key]]
        shown = pd.DataFrame({"MiB": rows["mib"], "count": rows["count"],
                              "made in": rows["phases"], "where": rows["label"],
                              "function": rows["function"],
                              "code": rows["source"].map(lambda s: f"`{s}`" if s else "")})
        top = rows.iloc[0] if len(rows) else None
        tables.append({**config, "table": to_markdown(shown),
                       "top": None if top is None else {
                           "mib": top["mib"], "count": int(top["count"]), "label": top["label"],
                           "function": top["function"], "source": top["source"],
                           "phases": top["phases"]}})
    return {"tables": tables}


def left_out(frame: pd.DataFrame, assignment: dict) -> str:
    return facts.not_in_preset({"sizes": (assignment["sizes"], frame["size"]),
                          "contexts": (assignment["context_lengths"], frame["context_length"]),
                          "modes": (assignment["modes"], frame["mode"]),
                          "precisions": (assignment["precisions"], frame["precision"])})


def files(frame: pd.DataFrame) -> list[dict]:
    """The snapshot, torch's HTML and the compact timeline of each measured configuration."""
    return [{**{k: r[k] for k in CONFIG}, "snapshot": sidecar(r, "snapshot_file"),
             "html": sidecar(r, "html_file"), "timeline": sidecar(r, "timeline_file")}
            for _, r in frame[frame["status"] == "ok"].iterrows()]


def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    """Records -> outputs["peak_table"] (one row per record, with the analytic model),
    outputs["allocations_table"] (every record's largest allocations), one timeline figure
    per mode (outputs["timeline_<mode>"], "-" as "_"), and the facts. options: assignment,
    the memory part of the full matrix."""
    frame = peak_frame(records["records"])
    largest = largest_frame(frame)
    write_table(frame, outputs["peak_table"])
    write_table(largest, outputs["allocations_table"])
    timelines = {i: t for i, r in frame.iterrows() if r["status"] == "ok"
                 and (t := load_timeline(r)) is not None}
    palette = plot.colours(timelines.values())
    figure_paths = {}
    for mode in MODES:
        key = "timeline_" + mode.replace("-", "_")
        if key not in outputs:
            continue
        rows = frame[frame["mode"] == mode]
        batch = ", ".join(map(str, sorted(set(rows["batch_size"])))) or "?"
        timeline_figure(rows, timelines, palette,
                        f"active memory timeline: {mode}, batch {batch}", outputs[key])
        figure_paths[mode] = outputs[key]
    ok = frame[frame["status"] == "ok"]
    chosen = focus(frame)
    first = frame.iloc[0] if len(frame) else None
    return {
        "env": env_summary(frame),
        "coverage": {"memory_profiling": facts.covered(
            frame, anchor="memory_profiling", missing=left_out(frame, options["assignment"]),
            how="(f), one block's residuals and gradients, is answered in the residuals "
                "section")},
        "any_ok": bool(len(ok)),
        "sizes": list(dict.fromkeys(frame["size"])),
        "batch_size": None if first is None else first["batch_size"],
        "warmup_steps": None if first is None else first["warmup_steps"],
        "measure_steps": None if first is None else first["measure_steps"],
        "max_entries": None if first is None else first["max_entries"],
        "attention": None if first is None else first["attention"],
        "figures": figure_paths,
        "stages": stages(frame),
        "peak_summary": peak_summary(frame),
        "peak_table": peak_table(frame),
        "bf16": bf16_facts(frame),
        "model_table": model_table(frame),
        "comparison": comparisons(frame),
        "residual": residual_facts(frame),
        "largest": largest_facts(largest, chosen),
        "files": files(frame),
        "trace_full": [{k: r[k] for k in CONFIG} for _, r in ok.iterrows()
                       if pd.notna(r["trace_full"]) and bool(r["trace_full"])],
        "unmarked": [{k: r[k] for k in CONFIG} for _, r in ok.iterrows()
                     if pd.isna(r["peak_stage"])],
        "failures": failures(frame),
    }


def failures(frame: pd.DataFrame) -> list[dict]:
    """The configurations not measured, grouped by status and reason."""
    groups: dict[tuple[str, str], list[str]] = {}
    for f in facts.not_ok(frame, CONFIG):
        name = f"{size_label(f['size'])} ctx {f['context_length']} {f['mode']} {f['precision']}"
        groups.setdefault((f["status"], f["reason"]), []).append(name)
    return [{"status": status, "reason": why, "configs": names}
            for (status, why), names in groups.items()]
