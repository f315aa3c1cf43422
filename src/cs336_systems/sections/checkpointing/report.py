"""gradient_checkpointing (assignment §2): (a) which nested strategy needs the least memory for N
identical blocks, from the simulator over N and from real blocks; (b) one level of
recomputation at the LM's full size: peak memory and step time per block size.

`build` is the section's report module entry (see `cs336_systems.sections`); the prose
is in `template.md.j2`. Inputs: the step records (one per block size, `none`
for no checkpointing) and the nested-strategy record of real blocks; the simulation itself is
computed here from `cs336_systems.analysis.checkpoint_trees` (pure Python,
                                                              no record), with the units of
`options["simulation"]`.
"""

from __future__ import annotations

import math

import pandas as pd
from matplotlib import ticker

from cs336_systems.analysis import checkpoint_trees as ckpt
from cs336_systems.analysis.checkpoint_trees import OPTIMAL
from cs336_systems.lm.sizes import size_label
from cs336_systems.records import read_record
from cs336_systems.report import facts, figures, tables
from cs336_systems.report.render import fmt
from cs336_systems.sections.checkpointing.recompute_table import (
    block_label,
    prediction,
    step_facts,
    step_figure,
    step_frame,
)

LABELS = {**{name: label for name, (label, _) in ckpt.STRATEGIES.items()},
          OPTIMAL: "least peak (the programme)"}


def simulation_frame(max_blocks: int, activations, boundary
                     ) -> tuple[pd.DataFrame, dict[str, ckpt.Strategy]]:
    """Peak and compute of every compared strategy and of the programme's optimum, N = 1 to
    max_blocks, in the given units; and each one's tree at N = max_blocks."""
    programme = ckpt.Programme(activations, boundary)
    rows = []
    for n in range(1, max_blocks + 1):
        trees = {name: make(n) for name, (_, make) in ckpt.STRATEGIES.items()}
        trees[OPTIMAL] = programme.optimal(n)[0]
        for name, tree in trees.items():
            cost = ckpt.simulate(tree, activations, boundary)
            rows.append({"strategy": name, "label": LABELS[name], "blocks": n,
                         "peak": cost.peak, "compute": cost.compute,
                         "tree": ckpt.notation(tree)})
    return pd.DataFrame(rows), trees


def fit_range(max_blocks: int) -> list[int]:
    """The N the growth fits use: the upper part of the range, where the leading term shows."""
    return list(range(max(2, max_blocks // 8), max_blocks + 1))


def growth_facts(frame: pd.DataFrame, trees: dict[str, ckpt.Strategy], max_blocks: int,
                 activations, boundary) -> dict[str, dict]:
    """Per strategy: the growth class that fits its peak and its compute over `fit_range`, and
    its peak at N = max_blocks as a * A + b * s."""
    ns = fit_range(max_blocks)
    out = {}
    for name in LABELS:
        rows = frame[(frame["strategy"] == name) & frame["blocks"].isin(ns)]
        terms = ckpt.peak_terms(trees[name], activations, boundary)
        out[name] = {"label": LABELS[name],
                     "peak": ckpt.growth(list(rows["blocks"]), list(rows["peak"])),
                     "compute": ckpt.growth(list(rows["blocks"]), list(rows["compute"])),
                     "terms": {"activations": terms[0], "boundary": terms[1]} if terms else None,
                     "terms_text": terms_text(terms)}
    return out


def terms_text(terms: tuple[float, float] | None) -> str:
    """(1, 4) -> 'A + 4s'."""
    if terms is None:
        return ""
    parts = [f"{'' if c == 1 else fmt(c, 0)}{unit}" for c, unit in zip(terms, ("A", "s")) if c]
    return " + ".join(parts) or "0"


def brute_force_facts(max_blocks: int, activations, boundary) -> dict:
    """Every nested tree for N up to max_blocks through the simulator: its least peak, the
    least compute at that peak, and the whole (peak, compute) front, against the programme."""
    programme = ckpt.Programme(activations, boundary)
    checked = []
    for n in range(1, max_blocks + 1):
        costs = {(c.peak, c.compute) for c in
                 (ckpt.simulate(t, activations, boundary) for t in ckpt.all_strategies(n))}
        front = []
        for peak, compute in sorted(costs):
            if not front or compute < front[-1][1]:
                front.append((peak, compute))
        dp = [(c.peak, c.compute) for _, c in programme.pareto(n)]
        checked.append({"blocks": n, "trees": sum(1 for _ in ckpt.all_strategies(n)),
                        "optimum_agrees": front[0] == dp[0], "front_agrees": front == dp})
    return {"max_blocks": max_blocks, "checked": checked,
            "trees": checked[-1]["trees"] if checked else 0,
            "agrees": all(c["optimum_agrees"] and c["front_agrees"] for c in checked)}


def simulation_display(frame: pd.DataFrame, max_blocks: int) -> pd.DataFrame:
    """Strategies by rows, N = powers of two by columns: `peak / compute`."""
    ns = [2 ** i for i in range(int(math.log2(max_blocks)) + 1)]
    rows = []
    for name in LABELS:
        at = frame[frame["strategy"] == name].set_index("blocks")
        rows.append({"strategy": LABELS[name],
                     **{f"N={n}": f"{fmt(at.loc[n, 'peak'], 0)} / {at.loc[n, 'compute']}"
                        for n in ns}})
    return pd.DataFrame(rows)


def growth_display(growth: dict[str, dict], max_blocks: int) -> pd.DataFrame:
    return pd.DataFrame([{
        "strategy": g["label"], f"peak at N={max_blocks}": g["terms_text"],
        "peak grows as": g["peak"]["class"],
        f"peak(N={max_blocks}) / peak(N={max_blocks // 2})": fmt(g["peak"]["doubling_ratio"], 2),
        "compute grows as": g["compute"]["class"],
        f"compute(N={max_blocks}) / compute(N={max_blocks // 2})":
            fmt(g["compute"]["doubling_ratio"], 2)} for g in growth.values()])


def front_facts(max_blocks: int, activations, boundary, frame: pd.DataFrame) -> dict:
    """The (peak, compute) front at N = max_blocks, and where each compared strategy stands:
    on the front, or how much more compute it takes than the front's at its peak or less."""
    front = [(c.peak, c.compute) for _, c in
             ckpt.Programme(activations, boundary).pareto(max_blocks)]
    at = frame[frame["blocks"] == max_blocks]
    places = []
    for _, r in at.iterrows():
        least = min(c for p, c in front if p <= r["peak"])
        places.append({"strategy": r["strategy"], "label": r["label"], "peak": r["peak"],
                       "compute": r["compute"], "front_compute": least,
                       "on_front": bool(r["compute"] == least),
                       "extra_compute": r["compute"] / least})
    return {"blocks": max_blocks, "points": [{"peak": p, "compute": c} for p, c in front],
            "size": len(front), "places": places}


def optimum_facts(frame: pd.DataFrame, max_blocks: int) -> dict:
    """The programme's answer: its trees for small N, its peak against the left-nested
    chain's for every N, its compute against N^2."""
    dp = frame[frame["strategy"] == OPTIMAL].set_index("blocks")
    left = frame[frame["strategy"] == "left_nested"].set_index("blocks")
    equal = [n for n in dp.index if dp.loc[n, "peak"] == left.loc[n, "peak"]]
    peaks = sorted(set(dp.loc[2:, "peak"])) if max_blocks >= 2 else []
    # the chain of N - 1 blocks, then one plain block
    chained = [n for n in range(2, max_blocks + 1) if dp.loc[n, "tree"] == ckpt.notation(
        (ckpt.left_nested(n - 1)[0], ckpt.BLOCK))]
    top = dp.loc[max_blocks]
    return {"trees": [{"blocks": n, "tree": dp.loc[n, "tree"], "peak": dp.loc[n, "peak"],
                       "compute": dp.loc[n, "compute"]}
                      for n in (1, 2, 3, 4, 8) if n <= max_blocks],
            "equals_left_nested": len(equal), "count": len(dp),
            "chain_then_plain": len(chained), "chain_then_plain_of": max(0, max_blocks - 1),
            "differs_at": [n for n in dp.index if n not in equal],
            "peak_values_from_2": peaks,
            "peak": top["peak"], "compute": top["compute"],
            "compute_over_n2": top["compute"] / max_blocks ** 2,
            "left_nested_compute": left.loc[max_blocks, "compute"],
            "compute_saved_vs_left_nested": 1 - top["compute"] / left.loc[max_blocks, "compute"]}


def _plain_ticks(ax) -> None:
    """Log axes labelled 1, 2, 4, ... instead of 10^0, 2 x 10^0, ..."""
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "log":
            axis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(ticker.NullFormatter())


def simulation_figure(frame: pd.DataFrame, front: dict, path: str) -> None:
    """Peak and recomputed block forwards against N per strategy (log-log), and peak against
    compute at the largest N with the programme's Pareto front."""
    fig, axes = figures.subplots(3, width=4.6)
    peak_ax, compute_ax, front_ax = axes[0]
    for name in LABELS:
        rows = frame[frame["strategy"] == name]
        style = {"linestyle": "--", "color": "black"} if name == OPTIMAL else {}
        peak_ax.plot(rows["blocks"], rows["peak"], label=LABELS[name], **style)
        compute_ax.plot(rows["blocks"], rows["compute"] - rows["blocks"], label=LABELS[name],
                        **style)
    peak_ax.set(xscale="log", yscale="log", xlabel="blocks N", ylabel="peak (units)",
                title="peak memory")
    compute_ax.set(xscale="log", yscale="symlog", xlabel="blocks N",
                   ylabel="recomputed block forwards", title="recomputation")
    compute_ax.set_ylim(bottom=0)
    peak_ax.legend(fontsize=7)
    points = pd.DataFrame(front["points"]).sort_values("compute")
    front_ax.step(points["compute"], points["peak"], where="post", color="black",
                  label="Pareto front (programme)")
    for place in front["places"]:
        front_ax.scatter(place["compute"], place["peak"], label=place["label"], zorder=3)
    front_ax.set(xscale="log", yscale="log", xlabel="block forwards",
                 ylabel="peak (units)", title=f"N = {front['blocks']}: peak against compute")
    front_ax.legend(fontsize=7)
    for ax in (peak_ax, compute_ax, front_ax):
        _plain_ticks(ax)
    figures.save(fig, path)


def nested_facts(paths: list[str]) -> tuple[pd.DataFrame, dict]:
    """Measured against simulated, per strategy and N: peak (bytes and boundaries), the
    offset between them, and block forward calls against the simulated compute."""
    if not paths:
        return pd.DataFrame(), {"measured": False, "status": "not configured", "reason": ""}
    record = read_record(paths[0])
    if record["status"] != "ok":
        return pd.DataFrame(), {"measured": False, "status": record["status"],
                                "reason": facts.reason(record.get("message"))}
    metrics, config = record["metrics"], record["config"]
    units = metrics["units"]
    s = units["boundary"]
    frame = pd.DataFrame(metrics["rows"])
    frame["label"] = frame["strategy"].map(LABELS)
    frame["measured_boundaries"] = frame["peak_bytes"] / s
    frame["simulated_boundaries"] = frame["simulated_peak_bytes"] / s
    frame["offset_boundaries"] = frame["measured_boundaries"] - frame["simulated_boundaries"]
    frame["calls_match"] = frame["block_calls"] == frame["simulated_compute"]
    display = pd.DataFrame({
        "strategy": frame["label"], "N": frame["blocks"],
        "measured peak KiB": (frame["peak_bytes"] / 1024).map(lambda v: fmt(v, 0)),
        "simulated KiB": (frame["simulated_peak_bytes"] / 1024).map(lambda v: fmt(v, 0)),
        "measured − simulated (boundaries)": frame["offset_boundaries"].map(lambda v: fmt(v, 2)),
        "block forwards": frame["block_calls"], "simulated": frame["simulated_compute"]})
    spans = {}
    for name, rows in frame.groupby("strategy"):
        rows = rows.sort_values("blocks")
        first, last = rows.iloc[0], rows.iloc[-1]
        spans[name] = {"label": LABELS[name], "from_blocks": first["blocks"],
                       "to_blocks": last["blocks"],
                       "measured_growth": last["measured_boundaries"]
                       - first["measured_boundaries"],
                       "simulated_growth": last["simulated_boundaries"]
                       - first["simulated_boundaries"]}
    offsets = frame["offset_boundaries"]
    return frame, {
        "measured": True, "device": record["env"]["device"],
        "peak_source": metrics["peak_source"], "size": config["size"],
        "context_length": config["context_length"], "batch_size": config["batch_size"],
        "blocks": config["blocks"], "boundary_bytes": s,
        "activation_bytes": units["activations"], "ratio": units["activations"] / s,
        "calls_match": bool(frame["calls_match"].all()), "rows": len(frame),
        "offset_min": offsets.min(), "offset_max": offsets.max(),
        "offset_spread": offsets.max() - offsets.min(),
        "offset_spread_of_activations": (offsets.max() - offsets.min()) * s
        / units["activations"],
        "simulated_span": frame["simulated_boundaries"].max()
        - frame["simulated_boundaries"].min(),
        "growth": [spans[name] for name in LABELS if name in spans],
        "table": tables.to_markdown(display)}


def left_out(frame: pd.DataFrame, assignment: dict) -> str:
    """What of the defaults' configuration the run did not include."""
    if frame.empty:
        return ""
    first = frame.iloc[0]
    return facts.not_in_preset(
        {"block sizes": ([block_label(k) for k in assignment["block_sizes"]],
                         frame["block_size"])},
        more=[f"{what} {size_label(assignment[key])} (ran {size_label(first[key])})"
              for key, what in (("size", "size"), ("context_length", "context"),
                                ("batch_size", "batch"), ("mode", "mode"),
                                ("precision", "precision"))
              if first[key] != assignment[key]])


def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    """Records -> the simulation table and figure, the nested-strategy table, the step table
    and figure, and the facts. options: simulation (max_blocks, brute_force_max_blocks,
    activations, boundary) and assignment (the defaults' checkpointing block)."""
    sim = options["simulation"]
    units = (sim["activations"], sim["boundary"])
    max_blocks = sim["max_blocks"]
    frame, trees = simulation_frame(max_blocks, *units)
    tables.write_table(frame, outputs["simulation_table"])
    growth = growth_facts(frame, trees, max_blocks, *units)
    front = front_facts(max_blocks, *units, frame)
    simulation_figure(frame, front, outputs["simulation_figure"])

    nested, nested_summary = nested_facts(records.get("nested", []))
    tables.write_table(nested, outputs["nested_table"])

    steps = step_frame(records["records"])
    tables.write_table(steps, outputs["step_table"])
    step_figure(steps, outputs["step_figure"])
    predicted = prediction(steps)
    first = steps.iloc[0] if len(steps) else None

    nested_rows = pd.DataFrame([{"status": read_record(p)["status"],
                                 "message": read_record(p).get("message", "")}
                                for p in records.get("nested", [])])
    answered = pd.concat([steps[["status", "message"]], nested_rows], ignore_index=True)
    return {
        "env": tables.env_summary(steps, *([tables.records_frame(records["nested"])]
                                    if records.get("nested") else [])),
        "coverage": {"gradient_checkpointing": facts.covered(
            answered, anchor="gradient_checkpointing",
            missing=left_out(steps, options["assignment"]))},
        "simulation": {
            "max_blocks": max_blocks, "activations": units[0], "boundary": units[1],
            "fit_from": fit_range(max_blocks)[0],
            "table": tables.to_markdown(simulation_display(frame, max_blocks)),
            "growth_table": tables.to_markdown(growth_display(growth, max_blocks)),
            "growth": growth, "optimum": optimum_facts(frame, max_blocks), "front": front,
            "brute_force": brute_force_facts(sim["brute_force_max_blocks"], *units),
            "figure": outputs["simulation_figure"]},
        "nested": nested_summary,
        "config": ({key: first[key] for key in ("size", "context_length", "batch_size",
                                                  "mode", "precision", "attention",
                                                  "warmup_steps", "measure_steps")}
                   if first is not None else None),
        "prediction": predicted,
        "steps": {**step_facts(steps, predicted), "figure": outputs["step_figure"],
                  "failures": facts.not_ok(steps, ["block_size"])},
    }
