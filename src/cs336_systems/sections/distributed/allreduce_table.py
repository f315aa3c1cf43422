"""The all-reduce benchmark's part of the distributed section: its table, the latency-bandwidth
fit, its figure and facts, and how time scales with ranks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cs336_systems.report import figures, tables
from cs336_systems.report.facts import not_ok, number
from cs336_systems.report.render import fmt

ALLREDUCE_METRICS = ["allreduce_ms_median", "allreduce_ms_mean", "allreduce_ms_std",
                     "size_bytes", "algbw_gbps", "busbw_gbps"]


def allreduce_table(paths: list[str]) -> pd.DataFrame:
    frame = tables.ensure_columns(tables.records_frame(paths), ["backend", "world_size", "size_mb"]
                           + ALLREDUCE_METRICS)
    frame = frame.sort_values(["backend", "world_size", "size_mb"], ignore_index=True)
    return frame[["backend", "world_size", "size_mb", "status", *ALLREDUCE_METRICS, "message",
                  *tables.env_columns(frame)]]


def fit_latency_bandwidth(rows: pd.DataFrame) -> tuple[float | None, float] | None:
    """Fit t = o + bytes / w over the sizes of one (backend, world size), weighting each size
    by 1/t so that the small sizes, which carry o, are not drowned by the large ones.
    Returns (o in ms, or None where the fit's intercept is not positive; w in GB/s), or None
    with fewer than two sizes."""
    rows = rows.dropna(subset=["allreduce_ms_median"])
    if rows["size_bytes"].nunique() < 2:
        return None
    t = rows["allreduce_ms_median"].to_numpy(dtype=float)
    slope, intercept = np.polyfit(rows["size_bytes"].to_numpy(dtype=float), t, 1, w=1.0 / t)
    if slope <= 0:
        return None
    return (float(intercept) if intercept > 0 else None), 1.0 / slope / 1e6  # ms/byte -> GB/s


def allreduce_figure(table: pd.DataFrame, path: str | Path) -> None:
    fig, axes = figures.subplots(2)
    ok = table[table["status"] == "ok"]
    for (backend, world), group in ok.groupby(["backend", "world_size"]):
        group = group.sort_values("size_bytes")
        label = f"{backend}, {world} processes"
        megabytes = group["size_bytes"] / 1e6
        axes[0][0].plot(megabytes, group["allreduce_ms_median"], marker="o", label=label)
        axes[0][1].plot(megabytes, group["busbw_gbps"], marker="o", label=label)
    axes[0][0].set(xscale="log", yscale="log", xlabel="tensor size (MB)",
                   ylabel="all-reduce (ms)", title="Latency")
    axes[0][1].set(xscale="log", yscale="log", xlabel="tensor size (MB)",
                   ylabel="bus bandwidth (GB/s)", title="Bus bandwidth")
    for ax in axes[0]:
        if ax.lines:
            ax.legend(fontsize=7)
    figures.save(fig, path)


def _allreduce_display(table: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "backend": table["backend"], "world_size": table["world_size"],
        "size MB": table["size_mb"].map(lambda v: f"{v:g}"), "status": table["status"],
        "median ms": table["allreduce_ms_median"].map(lambda v: fmt(v, 3)),
        "algbw GB/s": table["algbw_gbps"].map(lambda v: fmt(v, 2)),
        "busbw GB/s": table["busbw_gbps"].map(lambda v: fmt(v, 2))})


def allreduce_facts(table: pd.DataFrame) -> dict:
    """Per (backend, world size): the largest size's bus bandwidth and the fitted o and w;
    NCCL against gloo where both ran; what did not run."""
    ok = table[table["status"] == "ok"]
    runs = []
    for (backend, world), group in ok.groupby(["backend", "world_size"]):
        largest = group.loc[group["size_bytes"].idxmax()]
        fit = fit_latency_bandwidth(group)
        runs.append({
            "backend": backend, "world_size": int(world), "sizes": int(len(group)),
            "largest_size_mb": float(largest["size_mb"]),
            "largest_busbw_gbps": number(largest["busbw_gbps"]),
            "largest_median_ms": number(largest["allreduce_ms_median"]),
            "fit": None if fit is None else {
                "o_ms": fit[0], "o_us": None if fit[0] is None else fit[0] * 1e3,
                "w_gbps": fit[1]},
        })
    both = ok.pivot_table(index=["world_size", "size_mb"], columns="backend",
                          values="allreduce_ms_median")
    nccl_vs_gloo = None
    if {"gloo", "nccl"} <= set(both.columns):
        ratio = (both["gloo"] / both["nccl"]).dropna()  # above 1: NCCL is faster
        if len(ratio):
            low, high = float(ratio.min()), float(ratio.max())
            nccl_vs_gloo = {
                "pairs": int(len(ratio)), "ratio_min": low, "ratio_max": high,
                "word": "faster" if low > 1 else "slower" if high < 1 else "mixed",
                # the factors of a sentence: "Ax to Bx faster" or "Ax to Bx slower"
                "factor_min": low if low > 1 else 1 / high,
                "factor_max": high if low > 1 else 1 / low,
                # NCCL's time as a fraction of gloo's, for a "mixed" sentence
                "time_fraction_min": 1 / high, "time_fraction_max": 1 / low}
    return {
        "table": tables.to_markdown(_allreduce_display(table)),
        "runs": runs,
        "nccl_vs_gloo": nccl_vs_gloo,
        "rank_scaling": rank_scaling(ok),
        "not_measured": not_ok(table.assign(run=[
            f"{r['backend']} x {r['world_size']} at {r['size_mb']:g} MB"
            for _, r in table.iterrows()]), ["run"]),
        "world_sizes": sorted(int(w) for w in set(ok["world_size"])),
        "sizes_mb": sorted(float(s) for s in set(ok["size_mb"])),
    }


def rank_scaling(ok: pd.DataFrame) -> list[dict]:
    """Per backend, each larger world size against the smallest: how the median time and the
    bus bandwidth change over the sizes both ran. A ring all-reduce sends 2(n-1)/n of the data
    per rank, so where the links alone set the time it grows by that factor's ratio
    (`ring_time_ratio`) and the bus bandwidth stays flat."""
    out = []
    for backend, group in ok.groupby("backend"):
        worlds = sorted(int(w) for w in set(group["world_size"]))
        by = group.assign(world_size=group["world_size"].astype(int)).pivot_table(
            index="size_mb", columns="world_size",
            values=["allreduce_ms_median", "busbw_gbps"])
        for world in worlds[1:]:
            base = worlds[0]
            pair = by.dropna(subset=[("allreduce_ms_median", base),
                                     ("allreduce_ms_median", world)])
            if pair.empty:
                continue
            time = pair[("allreduce_ms_median", world)] / pair[("allreduce_ms_median", base)]
            busbw = pair[("busbw_gbps", world)] / pair[("busbw_gbps", base)]
            largest = pair.index.max()
            out.append({
                "backend": backend, "from": base, "to": world, "sizes": int(len(pair)),
                "time_ratio_min": float(time.min()), "time_ratio_max": float(time.max()),
                "busbw_ratio_min": float(busbw.min()), "busbw_ratio_max": float(busbw.max()),
                "ring_time_ratio": ((world - 1) / world) / ((base - 1) / base),
                "largest_size_mb": float(largest),
                "largest_ms": [float(pair.loc[largest, ("allreduce_ms_median", w)])
                               for w in (base, world)],
                "largest_busbw_gbps": [float(pair.loc[largest, ("busbw_gbps", w)])
                                       for w in (base, world)]})
            ring, largest_ratio = out[-1]["ring_time_ratio"], float(time.loc[largest])
            out[-1].update(largest_time_ratio=largest_ratio,
                           against_ring="less" if largest_ratio < ring else "more")
    return out
