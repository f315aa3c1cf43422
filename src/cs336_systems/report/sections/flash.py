"""flash_benchmarking (§3.4-3.5): tables, figures and writeup section from the flash records.

    python -m cs336_systems.report.sections.flash --records ... --leaderboard-records ... \
        --csv flash.csv --markdown flash.md --leaderboard-csv board.csv \
        --latency-figure a.png --speedup-figure b.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from cs336_systems.report import figures
from cs336_systems.report.render import bullets, fmt, fmt_ratio, relative_link, render_template
from cs336_systems.report.tables import ensure_columns, records_frame, to_markdown, write_table

PASSES = ["forward", "backward", "forward_backward"]
CONFIG_COLUMNS = ["impl", "seq", "d", "dtype", "batch_size", "causal", "compile"]
METRIC_COLUMNS = ([f"{p}_ms" for p in PASSES] + [f"{p}_status" for p in PASSES] + ["peak_gib"])
IMPL_ORDER = ["triton", "flash-pytorch", "sdpa", "pytorch"]
IMPL_LABEL = {"triton": "Triton FA2", "flash-pytorch": "PyTorch FA2 (tiled)",
              "sdpa": "torch SDPA", "pytorch": "plain PyTorch"}
# Given by the assignment (its leaderboard, H100), for context; not measured here.
CLASS_BEST_H100_MS = 5.364


def build_table(record_paths: list[str]) -> pd.DataFrame:
    frame = ensure_columns(records_frame(record_paths), CONFIG_COLUMNS + METRIC_COLUMNS)
    for p in PASSES:  # a pass with no time and no status of its own shares the record's
        frame[f"{p}_status"] = frame[f"{p}_status"].astype(object)
        missing = frame[f"{p}_ms"].isna() & frame[f"{p}_status"].isna()
        frame.loc[missing, f"{p}_status"] = frame.loc[missing, "status"]
        frame.loc[frame[f"{p}_ms"].notna(), f"{p}_status"] = "ok"
    frame["impl_rank"] = frame["impl"].map({n: i for i, n in enumerate(IMPL_ORDER)})
    frame = frame.sort_values(["d", "dtype", "seq", "impl_rank"])
    env = [c for c in frame.columns if c.startswith("env_")]
    return frame[CONFIG_COLUMNS + ["status"] + METRIC_COLUMNS + ["message"] + env]


def _cell(row: pd.Series) -> str:
    """'fwd / bwd / fwd+bwd' in ms; a pass that did not run shows its status."""
    parts = []
    for p in PASSES:
        value = row[f"{p}_ms"]
        parts.append(fmt(value, 3) if pd.notna(value) else str(row[f"{p}_status"]))
    return " / ".join(parts)


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (d, dtype, seq), one column per implementation."""
    rows = []
    for (d, dtype, seq), group in table.groupby(["d", "dtype", "seq"], sort=True):
        row = {"d": d, "dtype": dtype, "seq": seq}
        for _, r in group.iterrows():
            row[f"{IMPL_LABEL.get(r['impl'], r['impl'])} ms"] = _cell(r)
        rows.append(row)
    return pd.DataFrame(rows)


def speedups(table: pd.DataFrame, over: str, of: str = "triton",
             metric: str = "forward_backward_ms") -> pd.DataFrame:
    """time(over) / time(of) per (d, dtype, seq) where both ran."""
    keys = ["d", "dtype", "seq"]
    a = table[table["impl"] == of].set_index(keys)[metric]
    b = table[table["impl"] == over].set_index(keys)[metric]
    return (b / a).dropna().rename("speedup").reset_index()


def latency_figure(table: pd.DataFrame, path: str | Path) -> None:
    ds = sorted(table["d"].unique())
    fig, axes = figures.subplots(max(len(ds), 1), width=4.2)
    for ax, d in zip(axes[0], ds):
        for (impl, dtype), group in table[table["d"] == d].groupby(["impl", "dtype"]):
            group = group.dropna(subset=["forward_backward_ms"]).sort_values("seq")
            if len(group):
                ax.plot(group["seq"], group["forward_backward_ms"], marker="o",
                        linestyle="-" if dtype == "bf16" else "--",
                        label=f"{IMPL_LABEL.get(impl, impl)}, {dtype}")
        ax.set(xscale="log", yscale="log", xlabel="sequence length",
               ylabel="forward+backward (ms)", title=f"d = {d}")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=6)
    figures.save(fig, path)


def speedup_figure(table: pd.DataFrame, path: str | Path) -> None:
    fig, axes = figures.subplots(1, width=8.0)
    ax = axes[0][0]
    for over in ("pytorch", "sdpa"):
        s = speedups(table, over=over)
        for (d, dtype), group in s.groupby(["d", "dtype"]):
            ax.plot(group["seq"], group["speedup"], marker="o",
                    linestyle="-" if over == "pytorch" else ":",
                    label=f"over {IMPL_LABEL[over]}, d={d}, {dtype}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set(xlabel="sequence length", ylabel="speed-up of Triton FA2 (forward+backward)",
           title="Triton FlashAttention-2 speed-up")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if ax.lines:
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    figures.save(fig, path)


# --- writeup -------------------------------------------------------------------------------

def _speedup_sentence(table: pd.DataFrame, over: str) -> str:
    s = speedups(table, over=over)
    if s.empty:
        return ""
    best = s.loc[s["speedup"].idxmax()]
    worst = s.loc[s["speedup"].idxmin()]
    where = lambda r: f"seq {r['seq']}, d {r['d']}, {r['dtype']}"  # noqa: E731
    return (f"Speed-up of Triton FA2 over {IMPL_LABEL[over]} (its forward+backward time / "
            f"Triton's; under 1x Triton is slower): median {fmt_ratio(s['speedup'].median())} over "
            f"{len(s)} shapes where both ran, from {fmt_ratio(worst['speedup'])} ({where(worst)}) "
            f"to {fmt_ratio(best['speedup'])} ({where(best)}).")


def _pass_sentence(table: pd.DataFrame) -> str:
    parts = []
    for p in ("forward", "backward"):
        s = speedups(table, over="pytorch", metric=f"{p}_ms")
        if len(s):
            parts.append(f"{p} {fmt_ratio(s['speedup'].median())}")
    return ("Median speed-up over plain PyTorch by pass: " + ", ".join(parts) + ".") if parts else ""


LAUNCH_BOUND_MS = 0.2


def _launch_bound_sentence(table: pd.DataFrame) -> str:
    timed = table.dropna(subset=["forward_backward_ms"])
    small = timed[timed["forward_backward_ms"] < LAUNCH_BOUND_MS]
    if small.empty:
        return ""
    return (f"{len(small)} of {len(timed)} measured cells take under {LAUNCH_BOUND_MS} ms for "
            "forward+backward, where kernel-launch and Python overhead, not the attention "
            "itself, set the time; the speed-ups above include them.")


def _memory_sentence(table: pd.DataFrame) -> str:
    parts = []
    for (impl, d, dtype), group in table.groupby(["impl", "d", "dtype"]):
        failed = group[group["forward_backward_status"] == "oom"]
        if len(failed):
            parts.append(f"{IMPL_LABEL.get(impl, impl)} (d {d}, {dtype}) from seq {failed['seq'].min()}")
    if not parts:
        return "No configuration ran out of memory."
    return "Forward+backward ran out of memory for " + "; ".join(parts) + "."


def _leaderboard(board: pd.DataFrame) -> tuple[str, str]:
    if board.empty:
        return "_(no leaderboard records)_", ""
    first = board.iloc[0]
    shape = f"q, k, v of shape ({first['batch_size']}, {first['seq']}, {first['d']}), {first['dtype']}, causal"
    rows = pd.DataFrame({
        "implementation": board["impl"].map(lambda i: IMPL_LABEL.get(i, i)),
        "status": board["status"],
        "forward ms": board["forward_ms"].map(lambda v: fmt(v, 3)),
        "backward ms": board["backward_ms"].map(lambda v: fmt(v, 3)),
        "forward+backward ms": board["forward_backward_ms"].map(lambda v: fmt(v, 3)),
    })
    ok = board.dropna(subset=["forward_backward_ms"]).set_index("impl")["forward_backward_ms"]
    sentences = [f"Case: {shape}, `torch.compile` of each implementation, {_timer(board)}."]
    if "triton" in ok.index:
        sentences.append(f"Triton FA2 forward+backward: {fmt(ok['triton'], 3)} ms "
                         f"({fmt_ratio(ok['triton'] / CLASS_BEST_H100_MS)} the class's best "
                         f"entry of {CLASS_BEST_H100_MS} ms on an H100, a figure the assignment "
                         f"gives, not measured here).")
        if "sdpa" in ok.index:
            ratio = ok["sdpa"] / ok["triton"]
            sentences.append(f"torch SDPA in the same run: {fmt(ok['sdpa'], 3)} ms, so Triton is "
                             f"{fmt_ratio(ratio)} {'faster' if ratio > 1 else 'the speed'} "
                             f"(SDPA time / Triton time).")
    for _, r in board[board["status"] != "ok"].iterrows():
        sentences.append(f"{IMPL_LABEL.get(r['impl'], r['impl'])}: {r['status']} "
                         f"({str(r['message']).splitlines()[0] if r['message'] else ''}).")
    return to_markdown(rows), bullets(sentences)


def _timer(table: pd.DataFrame) -> str:
    on_cuda = "env_device" in table and (table["env_device"] == "cuda").any()
    return ("`triton.testing.do_bench` medians" if on_cuda
            else "wall-clock medians on the CPU (`do_bench` needs CUDA)")


def render(table: pd.DataFrame, board: pd.DataFrame, latency_figure_path: str,
           speedup_figure_path: str, writeup_path: str) -> str:
    skipped = table[table["status"] == "skipped"]
    notes = [f"{len(skipped)} configuration(s) skipped: "
             + "; ".join(sorted(set(skipped["message"].astype(str))))] if len(skipped) else []
    board_table, board_sentences = _leaderboard(board)
    first = table.iloc[0] if len(table) else None
    return render_template(
        "flash.md",
        batch_size=first["batch_size"] if first is not None else "",
        timer=_timer(table),
        causal="causal" if first is not None and bool(first["causal"]) else "non-causal",
        latency_table=to_markdown(display_table(table)),
        findings=bullets([_speedup_sentence(table, "pytorch"), _speedup_sentence(table, "sdpa"),
                          _pass_sentence(table), _launch_bound_sentence(table),
                          _memory_sentence(table), *notes]),
        latency_figure=relative_link(latency_figure_path, writeup_path),
        speedup_figure=relative_link(speedup_figure_path, writeup_path),
        leaderboard_table=board_table,
        leaderboard_sentences=board_sentences,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", nargs="+", required=True)
    parser.add_argument("--leaderboard-records", nargs="+", required=True)
    parser.add_argument("--csv", required=True)
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--leaderboard-csv", required=True)
    parser.add_argument("--latency-figure", required=True)
    parser.add_argument("--speedup-figure", required=True)
    args = parser.parse_args(argv)
    table = build_table(args.records)
    write_table(table, args.csv, args.markdown, display_table(table))
    write_table(build_table(args.leaderboard_records), args.leaderboard_csv)
    latency_figure(table, args.latency_figure)
    speedup_figure(table, args.speedup_figure)


if __name__ == "__main__":
    main()
