"""The DDP benchmark's part of the distributed section: the step table, the overlap timelines
and figures, and the facts per variant and model size (what overlap hides, what bucketing
costs on a slower link)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from cs336_systems.distributed.variants import DDP_VARIANTS, TRAINING_PHASES
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.sizes import size_label
from cs336_systems.records import read_record
from cs336_systems.report import figures, tables
from cs336_systems.report.facts import not_ok, number, speedup
from cs336_systems.report.render import fmt
from cs336_systems.sections.distributed.allreduce_table import fit_latency_bandwidth

DDP_PHASES = [*TRAINING_PHASES, "step"]  # each phase, and the whole step
OVERLAP_METRICS = ["collective_busy_ms_per_step", "compute_busy_ms_per_step",
                   "collective_hidden_ms_per_step", "collective_hidden_fraction"]
DDP_METRICS = ([f"{p}_ms_{s}" for p in DDP_PHASES for s in ("mean", "std")] + OVERLAP_METRICS
               + ["profile_steps", "gradient_bytes", "buckets", "parameters", "peak_gib",
                  "trace_file"])

MIB = 2**20

SIZE_ORDER = {size: i for i, size in enumerate(MODEL_SIZES)}


def edition_name(size: str) -> str:
    """A size as the writeup names it (`lm.sizes.size_label`: 2026's xl, 2025's xl-2025)."""
    return size_label(size)


def _int(value) -> int | None:
    """A plain int, or None for a missing value."""
    return None if value is None or pd.isna(value) else int(value)


def ddp_table(paths: list[str]) -> pd.DataFrame:
    """One row per DDP run: by model size, then in the order of `DDP_VARIANTS`, bucketed runs
    by bucket size."""
    frame = tables.ensure_columns(tables.records_frame(paths), DDP_METRICS + ["bucket_size_mb"])
    frame["variant_rank"] = frame["variant"].map({v: i for i, v in enumerate(DDP_VARIANTS)})
    frame["size_rank"] = frame["size"].map(SIZE_ORDER)
    frame = frame.sort_values(["size_rank", "variant_rank", "bucket_size_mb"], ignore_index=True)
    frame["label"] = [_label(r) for _, r in frame.iterrows()]
    return frame[["variant", "bucket_size_mb", "label", "size", "context_length", "batch_size",
                  "world_size", "backend", "status", *DDP_METRICS, "message", *tables.env_columns(frame)]]


def timelines(paths: list[str]) -> dict[tuple[str, str], dict]:
    """(size, label) -> the `timeline` of one profiled step, of the DDP records that have one."""
    out = {}
    for path in paths:
        record = read_record(path)
        if record["status"] == "ok" and record["metrics"].get("timeline"):
            out[(record["config"]["size"], _label(record["config"]))] = \
                record["metrics"]["timeline"]
    return out


# ddp_bucketed_benchmarking (a) asks what setup would show the bucket size mattering: the same
# model on two nodes over a 100 Gb/s network, where the all-reduce moves 12.5 GB/s.
SLOW_LINK_GBPS = 12.5


def overhead_ms(s_bytes: float, buckets: int, o_ms: float, w_gbps: float) -> float:
    """The bucketed DDP overhead model: the last bucket's transfer plus a fixed cost per
    bucket, s / (n_b w) + n_b o, in ms."""
    return s_bytes / buckets / (w_gbps * 1e6) + buckets * o_ms


def _label(row) -> str:
    return (f"bucketed {row['bucket_size_mb']:g} MiB" if row["variant"] == "bucketed"
            else str(row["variant"]))


def ddp_figure(table: pd.DataFrame, path: str | Path) -> None:
    ok = table[table["status"] == "ok"]
    several = ok["size"].nunique() > 1
    labels = [f"{r['size']} {r['label']}" if several else r["label"] for _, r in ok.iterrows()]
    fig, axes = figures.subplots(1, width=7.5)
    ax = axes[0][0]
    bottom = np.zeros(len(ok))
    for phase in ("forward", "backward", "communicate", "optimizer"):
        values = ok[f"{phase}_ms_mean"].fillna(0).to_numpy(dtype=float)
        ax.bar(labels, values, bottom=bottom, label=phase)
        bottom += values
    ax.set(ylabel="time per step (ms)", title="Data-parallel step by phase")
    ax.tick_params(axis="x", rotation=30)
    if len(ok):
        ax.legend(fontsize=7)
    figures.save(fig, path)


def overlap_figure(table: pd.DataFrame, steps: dict[tuple[str, str], dict],
                   path: str | Path) -> None:
    """One row per DDP run with a timeline: compute (lower lane) and collectives (upper lane)
    over one profiled step, the phases' device spans shaded, the hidden fraction in the title."""
    rows = [(r, steps[(r["size"], r["label"])]) for _, r in table.iterrows()
            if (r["size"], r["label"]) in steps]
    fig, axes = figures.subplots(1, max(len(rows), 1), width=7.5, height=0.95)
    several = len({r["size"] for r, _ in rows}) > 1
    longest = max((t["step_ms"] for _, t in rows), default=1.0)
    for ax, (row, t) in zip(axes[:, 0], rows):
        for phase, (start, end) in t["phases"].items():
            if phase != "forward":
                ax.axvline(start, color="0.6", linewidth=0.6)
            if end - start > 0.06 * longest:  # room for its name
                ax.text((start + end) / 2, 2.05, phase, ha="center", va="bottom", fontsize=6,
                        color="0.35")
        for lane, key, color in ((0, "compute", "tab:blue"), (1, "collective", "tab:orange")):
            spans = [(s, e - s) for s, e in t[key]]
            ax.broken_barh(spans, (lane + 0.1, 0.8), facecolors=color, linewidth=0)
        fraction = row["collective_hidden_fraction"]
        hidden = f"{fraction:.0%} of collective time under compute" if pd.notna(fraction) else ""
        name = f"{row['size']} {row['label']}" if several else row["label"]
        ax.set_title(f"{name}: {hidden}", fontsize=7, loc="left", pad=9)
        ax.set(xlim=(0, longest), ylim=(0, 2.6), yticks=[0.5, 1.5])
        ax.set_yticklabels(["compute", "NCCL"], fontsize=6)
        ax.tick_params(axis="x", labelsize=6)
        ax.grid(False)
    axes[-1][0].set_xlabel("ms from the step's first kernel (rank 0, one profiled step)",
                           fontsize=7)
    if not rows:
        axes[0][0].text(0.5, 0.5, "no DDP record has a profiled timeline", ha="center",
                        va="center", transform=axes[0][0].transAxes)
    figures.save(fig, path)


def _ddp_display(table: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"model": table["size"], "variant": table["label"],
                        "status": table["status"]})
    for phase in DDP_PHASES:
        out[f"{phase} ms"] = [tables.mean_pm_std(m, s) for m, s in
                              zip(table[f"{phase}_ms_mean"], table[f"{phase}_ms_std"])]
    # n/a: the run finished but its record has no such metric
    out["collectives busy ms/step"] = [
        fmt(v, 2) if pd.notna(v) else ("n/a" if status == "ok" else "")
        for v, status in zip(table["collective_busy_ms_per_step"], table["status"])]
    out["hidden under compute"] = [f"{v:.0%}" if pd.notna(v) else ""
                                   for v in table["collective_hidden_fraction"]]
    out["profiled steps"] = [
        str(int(v)) if pd.notna(v) else ("n/a" if status == "ok" else "")
        for v, status in zip(table["profile_steps"], table["status"])]
    out["trace"] = [v if pd.notna(v) else "" for v in table["trace_file"]]
    return out


def _step(row: pd.Series, phase: str = "step") -> dict:
    return {"label": row["label"], "ms": number(row[f"{phase}_ms_mean"]),
            "std": number(row[f"{phase}_ms_std"])}


def compare(time: dict, reference: dict) -> dict | None:
    """speedup() of two {ms, std} facts: above 1, `time` is faster than `reference`."""
    return speedup(time["ms"], reference["ms"], time["std"], reference["std"])


def sizes_of(ok: pd.DataFrame) -> list[str]:
    return sorted(set(ok["size"]), key=lambda size: SIZE_ORDER.get(size, len(SIZE_ORDER)))


def ddp_facts(table: pd.DataFrame) -> dict:
    """The DDP runs' facts, one entry of `sizes` per model size (each edition's xl), and what
    the records lack."""
    ok = table[table["status"] == "ok"]
    several = ok["size"].nunique() > 1
    named = [f"{r['size']} {r['label']}" if several else r["label"] for _, r in ok.iterrows()]
    busy_missing = [n for n, (_, r) in zip(named, ok.iterrows())
                    if pd.isna(r["collective_busy_ms_per_step"])]
    steps_missing = [n for n, (_, r) in zip(named, ok.iterrows()) if pd.isna(r["profile_steps"])]
    return {
        "table": tables.to_markdown(_ddp_display(table)),
        "sizes": [size_facts(ok[ok["size"] == size]) for size in sizes_of(ok)],
        "runs": len(ok),
        # runs whose records have no collective busy time / no count of profiled steps
        "collective_busy_missing": busy_missing,
        # the distinct numbers of profiled steps the finished runs recorded
        "profile_steps": sorted({int(v) for v in ok["profile_steps"].dropna()}),
        "profile_steps_missing": steps_missing,
        "traces": [r["trace_file"] for _, r in ok.iterrows() if pd.notna(r["trace_file"])],
        "not_measured": not_ok(table.assign(run=[f"{r['size']} {r['label']}"
                                                 for _, r in table.iterrows()]), ["run"]),
    }


def _overlap(row: pd.Series) -> dict:
    """What rank 0's profile says of one run: per step, the time collectives ran, other device
    work ran, and both at once, and the exposed communication after backward."""
    return {"label": row["label"], "variant": row["variant"],
            "collective_busy_ms": number(row["collective_busy_ms_per_step"]),
            "compute_busy_ms": number(row["compute_busy_ms_per_step"]),
            "hidden_ms": number(row["collective_hidden_ms_per_step"]),
            "hidden_fraction": number(row["collective_hidden_fraction"]),
            "exposed": _step(row, "communicate")}


def _naive_vs_flat(by_label: pd.DataFrame) -> dict | None:
    if not {"naive", "flat"} <= set(by_label.index):
        return None
    naive, flat = by_label.loc["naive"], by_label.loc["flat"]
    return {"naive_communicate": _step(naive, "communicate"),
            "flat_communicate": _step(flat, "communicate"),
            "naive_step": _step(naive), "flat_step": _step(flat),
            # above 1: the flat variant is faster
            "communicate": compare(_step(flat, "communicate"), _step(naive, "communicate")),
            "step": compare(_step(flat), _step(naive))}


def _naive_share(by_label: pd.DataFrame) -> dict | None:
    if "naive" not in by_label.index:
        return None
    naive = by_label.loc["naive"]
    return {"fraction": naive["communicate_ms_mean"] / naive["step_ms_mean"],
            "communicate_ms": naive["communicate_ms_mean"], "step_ms": naive["step_ms_mean"]}


def _busy_vs_timed(by_label: pd.DataFrame) -> list[dict]:
    """Where all communication follows backward (naive, flat), the profile's collective time
    and the timed `communicate` phase measure the same calls two ways: how they differ."""
    rows = []
    for label in ("naive", "flat"):
        if label not in by_label.index:
            continue
        row = by_label.loc[label]
        if pd.isna(row["collective_busy_ms_per_step"]):
            continue
        busy, timed = row["collective_busy_ms_per_step"], row["communicate_ms_mean"]
        rows.append({"label": label, "busy_ms": number(busy), "timed_ms": number(timed),
                     "difference_ms": number(abs(busy - timed)),
                     "word": "more" if busy > timed else "less"})
    return rows


def _overlap_vs_rest(by_label: pd.DataFrame) -> dict | None:
    """The overlapped variant against naive and flat; its backward and exposed communication
    against naive's (else flat's)."""
    if "overlap" not in by_label.index:
        return None
    row = by_label.loc["overlap"]
    refs = [ref for ref in ("naive", "flat") if ref in by_label.index]
    overlap = {"step": _step(row), "communicate": _step(row, "communicate"),
               "backward": _step(row, "backward"),
               # above 1: the overlapped variant is faster
               "vs": {ref: compare(_step(row), _step(by_label.loc[ref])) for ref in refs},
               "reference": None}
    if refs:
        ref = by_label.loc[refs[0]]
        overlap["reference"] = {
            "label": refs[0], "backward": _step(ref, "backward"),
            "communicate": _step(ref, "communicate"),
            "backward_vs": compare(_step(row, "backward"), _step(ref, "backward"))}
    return overlap


def _fastest(ok: pd.DataFrame, by_label: pd.DataFrame) -> tuple[dict | None, dict | None]:
    """The fastest variant (and how much slower the next is), and our fastest against torch's
    DDP."""
    ranked = ok.dropna(subset=["step_ms_mean"]).sort_values("step_ms_mean")
    fastest = None
    if len(ranked):
        best = _step(ranked.iloc[0])
        runner_up = _step(ranked.iloc[1]) if len(ranked) > 1 else None
        fastest = {**best, "runner_up": runner_up,
                   # above 1 never: how much slower the next variant is than the fastest
                   "runner_up_vs_fastest": compare(runner_up, best) if runner_up else None}
    vs_torch = None
    ours = ranked[ranked["variant"] != "torch"]
    if "torch" in by_label.index and len(ours):
        best, torch_ddp = _step(ours.iloc[0]), _step(by_label.loc["torch"])
        vs_torch = {"ours": best, "torch": torch_ddp, "speedup": compare(best, torch_ddp)}
    return fastest, vs_torch


def _evidence_table(evidence: list[dict]) -> str:
    if not evidence:
        return ""
    return tables.to_markdown(pd.DataFrame([{
        "variant": e["label"],
        "collectives ms/step": fmt(e["collective_busy_ms"], 2),
        "compute ms/step": fmt(e["compute_busy_ms"], 2),
        "both at once ms/step": fmt(e["hidden_ms"], 2),
        "hidden under compute": f"{e['hidden_fraction']:.0%}",
        "exposed after backward ms": tables.mean_pm_std(e["exposed"]["ms"], e["exposed"]["std"]),
    } for e in evidence]))


def size_facts(ok: pd.DataFrame) -> dict:
    """One model size's finished DDP runs: setup, naive against flat, overlap, the fastest,
    ours against torch's, and the overlap evidence from the profiles."""
    by_label = ok.set_index("label", drop=False)
    first = ok.iloc[0]
    setup = {k: (first[k] if k in ("size", "backend") else int(first[k]))
             for k in ("size", "context_length", "batch_size", "world_size", "backend")}
    variants = [{"label": r["label"], "variant": r["variant"], "status": r["status"],
                 "step": _step(r), "communicate": _step(r, "communicate"),
                 "backward": _step(r, "backward"),
                 "collective_busy_ms": number(r["collective_busy_ms_per_step"]),
                 "profile_steps": _int(r["profile_steps"])}
                for _, r in ok.iterrows()]
    fastest, vs_torch = _fastest(ok, by_label)
    # per run, from its profile: the collective time hidden under compute
    evidence = [_overlap(r) for _, r in ok.iterrows()
                if pd.notna(r["collective_hidden_fraction"])]
    return {"size": setup["size"], "name": edition_name(setup["size"]), "setup": setup,
            "variants": variants, "naive_vs_flat": _naive_vs_flat(by_label),
            "naive_communication_share": _naive_share(by_label),
            "busy_vs_timed": _busy_vs_timed(by_label), "overlap": _overlap_vs_rest(by_label),
            "fastest": fastest, "vs_torch": vs_torch, "evidence": evidence,
            "evidence_table": _evidence_table(evidence)}


def overhead_facts(ddp: pd.DataFrame, allreduce: pd.DataFrame) -> dict:
    """The bucketed DDP overhead model against each size's bucketed runs."""
    ok = ddp[ddp["status"] == "ok"]
    sizes = [size_overhead(ok[ok["size"] == size], allreduce) for size in sizes_of(ok)
             if (ok[ok["size"] == size]["variant"] == "bucketed").any()]
    return {"sizes": sizes, "available": any(s["available"] for s in sizes),
            "needs": "; ".join(s["needs"] for s in sizes if s["needs"])
                     or "the bucketed DDP records"}


def _overhead_display(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame({
        "bucket MiB": [f"{r['bucket_mib']:g}" for r in rows],
        "buckets n_b": [r["buckets"] for r in rows],
        "predicted ms": [fmt(r["predicted_ms"], 2) for r in rows],
        "measured after backward ms": [
            tables.mean_pm_std(r["measured"]["ms"], r["measured"]["std"]) for r in rows],
        "measured - predicted ms": [fmt(r["gap_ms"], 2) for r in rows],
        "backward vs naive ms": [fmt(r["backward_slowdown_ms"], 1) for r in rows],
        "collectives under compute": [f"{r['hidden_fraction']:.0%}"
                                      if r["hidden_fraction"] is not None else ""
                                      for r in rows]})


def _bucket_expectation(rows: list[dict], s_bytes: float, o_ms: float) -> dict:
    """(a): how much the bucket size changed the wait after backward, against its noise, and
    what the same model predicts on a slow link, where it would matter."""
    waits = [r["measured"]["ms"] for r in rows]
    noise = max(r["measured"]["std"] for r in rows)
    slow = [{"bucket_mib": r["bucket_mib"],
             "predicted_ms": overhead_ms(s_bytes, r["buckets"], o_ms, SLOW_LINK_GBPS)}
            for r in rows]
    slow_b_star = math.sqrt(s_bytes * SLOW_LINK_GBPS * 1e6 * o_ms)
    return {
        "wait_min_ms": min(waits), "wait_max_ms": max(waits),
        "wait_range_ms": max(waits) - min(waits), "noise_ms": noise,
        "predicted_min_ms": min(r["predicted_ms"] for r in rows),
        "predicted_max_ms": max(r["predicted_ms"] for r in rows),
        "resolved": (max(waits) - min(waits)) > 2 * noise,
        "slow_link": {"w_gbps": SLOW_LINK_GBPS,
                      "best": min(slow, key=lambda x: x["predicted_ms"]),
                      "worst": max(slow, key=lambda x: x["predicted_ms"]),
                      "b_star_mib": slow_b_star / MIB}}


def size_overhead(ok: pd.DataFrame, allreduce: pd.DataFrame) -> dict:
    """Predicted against measured overhead of bucketed DDP for one model size, and the optimal
    bucket size.

    Predicted: s / (n_b w) + n_b o, the time after backward to send the last bucket plus a
    fixed cost per bucket, with o and w fitted to the all-reduce records of the same backend
    and world size. Measured, in the same run: its `communicate` phase, the wait for the
    all-reduces after its own backward has finished (step minus the run's own forward,
    backward and optimizer). What the model leaves out, also measured: how much longer the
    run's backward takes than naive DDP's (same size, no communication during backward), and
    how much of the collective time ran under compute (the run's profile)."""
    bucketed = ok[ok["variant"] == "bucketed"]
    naive = ok[ok["variant"] == "naive"]
    size = str(bucketed.iloc[0]["size"])
    world, backend = int(bucketed.iloc[0]["world_size"]), str(bucketed.iloc[0]["backend"])
    facts = {"size": size, "name": edition_name(size), "backend": backend,
             "world_size": world, "available": False, "needs": ""}
    fit = fit_latency_bandwidth(allreduce[(allreduce["status"] == "ok")
                                          & (allreduce["backend"] == backend)
                                          & (allreduce["world_size"] == world)])
    if fit is None or fit[0] is None:
        needs = (f"{backend} all-reduce records at two or more sizes for {world} processes, "
                 "with a resolvable per-call cost o")
        return {**facts, "needs": needs, "table": f"_(needs {needs})_"}
    o_ms, w_gbps = fit
    s_bytes = float(bucketed.iloc[0]["gradient_bytes"])
    naive_backward = _step(naive.iloc[0], "backward") if len(naive) else None
    rows = []
    for _, r in bucketed.iterrows():
        n_b = int(r["buckets"])
        predicted = overhead_ms(s_bytes, n_b, o_ms, w_gbps)
        measured, backward = _step(r, "communicate"), _step(r, "backward")
        gap = measured["ms"] - predicted
        inside = abs(gap) <= measured["std"]
        rows.append({
            "bucket_mib": float(r["bucket_size_mb"]), "buckets": n_b,
            "predicted_ms": predicted, "last_bucket_ms": s_bytes / n_b / (w_gbps * 1e6),
            "per_call_ms": n_b * o_ms,
            "measured": measured, "gap_ms": gap,
            "verdict": "inside the spread" if inside else "above" if gap > 0 else "below",
            "factor": measured["ms"] / predicted if predicted > 0 else None,
            "backward": backward,
            "backward_slowdown_ms": backward["ms"] - naive_backward["ms"]
            if naive_backward else None,
            "hidden_fraction": number(r["collective_hidden_fraction"]),
            "collective_busy_ms": number(r["collective_busy_ms_per_step"])})
    b_star = math.sqrt(s_bytes * w_gbps * 1e6 * o_ms)  # bytes
    off = [r for r in rows if r["verdict"] != "inside the spread"]
    slowdowns = [r["backward_slowdown_ms"] for r in rows if r["backward_slowdown_ms"] is not None]
    return {
        **facts, "available": True,
        "table": tables.to_markdown(_overhead_display(rows)),
        "rows": rows,
        "fits": [r for r in rows if r["verdict"] == "inside the spread"],
        "above": [r for r in off if r["verdict"] == "above"],
        "below": [r for r in off if r["verdict"] == "below"],
        "o_ms": o_ms, "o_us": o_ms * 1e3, "w_gbps": w_gbps,
        "s_bytes": s_bytes, "s_mib": s_bytes / MIB,
        "naive_backward": naive_backward,
        "b_star_bytes": b_star, "b_star_mib": b_star / MIB, "n_b_star": s_bytes / b_star,
        "backward_slowdown_min_ms": min(slowdowns) if slowdowns else None,
        "backward_slowdown_max_ms": max(slowdowns) if slowdowns else None,
        "expectation": _bucket_expectation(rows, s_bytes, o_ms),
    }
