"""nsys_profile (assignment 1.2): where a step's device time goes, from the profile records.

`build` is the section's report module entry (see `cs336_systems.sections`); the prose
is in `template.md.j2`. Each record holds the harness's timing of its configuration
and, from the profiled steps, device time by (kernel, step range, attention part): CUDA kernels
on a GPU, ATen ops' CPU self time on a CPU. "Per step" below is per profiled step.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from cs336_systems.lm.attention import ATTENTION_PARTS
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.step import MODES
from cs336_systems.records import read_record
from cs336_systems.report import facts, figures, tables
from cs336_systems.report.render import fmt

CONFIG = ["size", "context_length", "mode"]
TOP = 5                 # kernels shown per configuration
NOTABLE_SHARE = 0.01    # non-matmul kernels above this share of device time (c)
SIZE_RANK = {name: i for i, name in enumerate(MODEL_SIZES)}


# --- reading ---------------------------------------------------------------------------------

def short_kernel(name: str, width: int = 64) -> str:
    """A kernel's name for a table: no `void`, namespaces or argument list; a template kernel
    named with what tells its instances apart: the function it wraps
    (`vectorized_elementwise_kernel<exp_kernel_cuda>`), else its last functor
    (`elementwise_kernel<MulFunctor>`), else a long first template argument
    (`Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>`)."""
    kernel = name.startswith("void ")  # a CUDA kernel's signature, not an op like aten::mm
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    base = re.split(r"[<(]", name, maxsplit=1)[0]
    rest = name[len(base):] if name[len(base):].startswith("<") else ""
    template = rest.split(">(")[0]  # the template arguments, not the function's
    base = base.split("::")[-1] if kernel else base
    wrapped = re.search(r"(\w+_kernel\w*)(?:<[^<>]*>)?\(", rest)
    functors = re.findall(r"\b(\w*(?:Functor|functor|Ops)\w*|multiplies|plus|divides|Sqrt)\b",
                          template)
    first = re.match(r"<(\w{12,})", template)
    detail = (wrapped.group(1) if wrapped else functors[-1] if functors
              else first.group(1) if first else "")
    short = f"{base}<{detail}>" if detail else base
    # cuBLAS: up to the tile size (what tells its gemms apart), and whether it splits k
    tiled = re.match(r"(.*_tilesize\w+?)_.*?(_split_k)?_kernel", short)
    if tiled:
        short = tiled.group(1) + (tiled.group(2) or "")
    return short if len(short) <= width else short[:width - 1] + "…"


def kernel_frame(paths: list[str]) -> pd.DataFrame:
    """One row per (record, kernel, phase, part) of the `ok` records: time and calls per step."""
    rows = []
    for path in paths:
        record = read_record(path)
        if record["status"] != "ok":
            continue
        config, metrics = record["config"], record["metrics"]
        steps = metrics["profiled_steps"]
        for k in metrics["kernels"]:
            rows.append({**{key: config[key] for key in CONFIG}, "tool": metrics["tool"],
                         "kernel": k["kernel"], "phase": k["phase"], "part": k["part"],
                         "matmul": k["matmul"], "calls_per_step": k["calls"] / steps,
                         "ms_per_step": k["us"] / 1e3 / steps})
    columns = [*CONFIG, "tool", "kernel", "phase", "part", "matmul", "calls_per_step",
               "ms_per_step"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["share"] = frame["ms_per_step"] / frame.groupby(CONFIG + ["tool"])[
        "ms_per_step"].transform("sum")
    return frame


def summary_table(paths: list[str]) -> pd.DataFrame:
    """One row per record: the harness's timings, the profiler's ranges, matmul share."""
    frame = tables.ensure_columns(tables.records_frame(paths), [
        "message", "forward_ms_mean", "forward_ms_std", "step_ms_mean", "step_ms_std",
        "profiled_forward_ms_mean", "profiled_step_ms_mean", "device_work", "peak_gib"])
    extra = []
    for path in paths:
        metrics = read_record(path)["metrics"]
        ranges, steps = metrics.get("ranges", {}), metrics.get("profiled_steps") or 1
        kernels = metrics.get("kernels", [])
        row = {f"{name}_{clock}_ms": r[f"{clock}_us"] / 1e3 / r["calls"]
               for name, r in ranges.items() for clock in ("cpu", "device")}
        busy = {}
        for k in kernels:
            busy[k["phase"]] = busy.get(k["phase"], 0.0) + k["us"] / 1e3 / steps
        row.update({f"{phase}_busy_ms": ms for phase, ms in busy.items() if phase})
        total = sum(k["us"] for k in kernels)
        row["device_ms_per_step"] = total / 1e3 / steps if kernels else None
        row["matmul_share"] = (sum(k["us"] for k in kernels if k["matmul"]) / total
                               if total else None)
        row["trace_path"] = str(Path(path).parent / metrics["trace_file"]) if "trace_file" in metrics \
            else None
        extra.append(row)
    frame = pd.concat([frame, pd.DataFrame(extra, index=frame.index)], axis=1)
    frame["size_rank"] = frame["size"].map(SIZE_RANK)
    frame["mode_rank"] = frame["mode"].map(MODES.index)
    return frame.sort_values(["size_rank", "context_length", "mode_rank"]).drop(
        columns=["size_rank", "mode_rank"])


# --- the answers, (a) to (e) -----------------------------------------------------------------

def largest_contexts(summary: pd.DataFrame) -> dict[str, int]:
    """Per size, the longest context whose every mode profiled: the tables' focus."""
    ok = summary[summary["status"] == "ok"]
    out = {}
    for size, group in ok.groupby("size"):
        complete = [c for c, g in group.groupby("context_length")
                    if set(g["mode"]) == set(summary["mode"])]
        if complete:
            out[size] = max(complete)
    return dict(sorted(out.items(), key=lambda kv: SIZE_RANK[kv[0]]))


def forward_time(summary: pd.DataFrame) -> dict:
    """(a) The forward range in the profile (its device span: first kernel's start to last
    kernel's end) against the harness's forward time without the profiler and under it, per
    forward-only configuration."""
    rows, configs = [], []
    for _, r in summary[(summary["mode"] == "forward") & (summary["status"] == "ok")].iterrows():
        span, busy = r["forward_device_ms"], r["forward_busy_ms"]
        harness, spread = r["forward_ms_mean"], r["forward_ms_std"]
        profiled = r["profiled_forward_ms_mean"]
        rows.append({"size": r["size"], "context": r["context_length"],
                     "harness ms": tables.mean_pm_std(harness, spread, 3),
                     "harness under profiler ms": fmt(profiled, 3),
                     "profile: forward range span ms": fmt(span, 3),
                     "profile: kernels' own time ms": fmt(busy, 3)})
        configs.append({"size": r["size"], "context_length": r["context_length"],
                        "span_over_harness": span / harness,
                        "span_over_profiled": span / profiled,
                        "busy_over_harness": busy / harness,
                        "within_spread": bool(abs(span - harness) <= spread)})
    if not configs:
        return {}
    frame = pd.DataFrame(configs)
    return {"table": tables.to_markdown(pd.DataFrame(rows)), "configs": configs,
            **{f"{key}_{stat}": getattr(frame[key], stat)()
               for key in ("span_over_harness", "span_over_profiled", "busy_over_harness")
               for stat in ("min", "max")},
            "within_spread": int(frame["within_spread"].sum()), "count": len(configs),
            "profiler_slows": bool((frame["span_over_harness"] > 1).all()
                                   and not frame["within_spread"].any())}


def by_kernel(kernels: pd.DataFrame) -> pd.DataFrame:
    """Kernels of each configuration over all ranges: time, calls and share per step, and the
    ranges they ran in (`forward`, `forward/attention.softmax`, ...)."""
    where = kernels["phase"].where(kernels["part"] == "", kernels["phase"] + "/" + kernels["part"])
    return (kernels.assign(ranges=where)
            .groupby([*CONFIG, "kernel", "matmul"], as_index=False)
            .agg(ms_per_step=("ms_per_step", "sum"), calls_per_step=("calls_per_step", "sum"),
                 share=("share", "sum"),
                 ranges=("ranges", lambda r: ", ".join(sorted(set(r) - {""})) or "(none)"))
            .sort_values([*CONFIG, "ms_per_step"], ascending=[True, True, True, False]))


def top_kernels(kernels: pd.DataFrame, focus: dict[str, int]) -> dict:
    """(b) The kernel with the most device time in each forward-only configuration, its calls
    per forward and share, and whether it also leads forward+backward; the top kernels of the
    focus configurations as a table."""
    totals = by_kernel(kernels)
    leaders, rows = [], []
    for (size, context), group in totals.groupby(["size", "context_length"]):
        lead = {mode: g.iloc[0] for mode, g in group.groupby("mode")}
        if "forward" not in lead:
            continue
        fwd = lead["forward"]
        entry = {"size": size, "context_length": context, "kernel": short_kernel(fwd["kernel"]),
                 "calls": fwd["calls_per_step"], "share": fwd["share"],
                 "matmul": bool(fwd["matmul"])}
        if "forward-backward" in lead:
            both = lead["forward-backward"]
            entry["leads_forward_backward"] = both["kernel"] == fwd["kernel"]
            entry["forward_backward_kernel"] = short_kernel(both["kernel"])
            entry["forward_backward_share"] = both["share"]
        leaders.append(entry)
        if focus.get(size) == context:
            for mode in ("forward", "forward-backward"):
                for rank, (_, k) in enumerate(group[group["mode"] == mode].head(TOP).iterrows()):
                    rows.append({"size": size, "context": context, "mode": mode, "#": rank + 1,
                                 "kernel": short_kernel(k["kernel"]),
                                 "calls/step": fmt(k["calls_per_step"], 1),
                                 "ms/step": fmt(k["ms_per_step"], 3),
                                 "share %": fmt(100 * k["share"], 1), "ran in": k["ranges"]})
    leaders.sort(key=lambda e: (SIZE_RANK[e["size"]], e["context_length"]))
    return {"leaders": leaders, "table": tables.to_markdown(pd.DataFrame(rows)),
            "same_leader": all(e.get("leads_forward_backward", True) for e in leaders),
            "leader_names": sorted({e["kernel"] for e in leaders})}


# Beyond MAX_SHOWN_ROWS rows, (c)'s table in the text keeps each configuration's this many.
NON_MATMUL_SHOWN = 5


def non_matmul(kernels: pd.DataFrame, focus: dict[str, int], csv_path: str) -> dict:
    """(c) Kernels that are not matrix multiplies yet take at least NOTABLE_SHARE of the device
    time of a focus configuration, forward and training step, the largest first."""
    totals = by_kernel(kernels)
    rows, largest = [], []
    for size, context in focus.items():
        for mode in ("forward", "train-step"):
            g = totals[(totals["size"] == size) & (totals["context_length"] == context)
                       & (totals["mode"] == mode) & ~totals["matmul"]
                       & (totals["share"] >= NOTABLE_SHARE)].sort_values("share",
                                                                         ascending=False)
            largest += [len(rows) + i for i in range(min(len(g), NON_MATMUL_SHOWN))]
            for _, k in g.iterrows():
                rows.append({"size": size, "context": context, "mode": mode,
                             "kernel": short_kernel(k["kernel"]),
                             "calls/step": fmt(k["calls_per_step"], 1),
                             "share %": fmt(100 * k["share"], 1), "ran in": k["ranges"]})
    frame = pd.DataFrame(rows)
    share = {}
    for size, context in focus.items():
        for mode in ("forward", "train-step"):
            sel = totals[(totals["size"] == size) & (totals["context_length"] == context)
                         & (totals["mode"] == mode) & ~totals["matmul"]]
            share[f"{size}/{mode}"] = sel["share"].sum()
    return {"table": tables.long_table(frame, csv_path,
                                       frame.iloc[largest] if len(frame) else None),
            "count": len(frame), "shown": NON_MATMUL_SHOWN,
            "threshold": NOTABLE_SHARE, "non_matmul_share": share}


def matmul_share(summary: pd.DataFrame, kernels: pd.DataFrame, focus: dict[str, int]) -> dict:
    """(d) The matmul share of device time per mode, and the kernels whose share grows most
    from inference (forward) to the training step."""
    ok = summary[summary["status"] == "ok"]
    pivot = ok.pivot_table(index=["size", "context_length"], columns="mode",
                           values="matmul_share")
    rows, configs = [], []
    for (size, context), r in pivot.iterrows():
        rows.append({"size": size, "context": context,
                     **{f"{m} matmul %": fmt(100 * r[m], 1) for m in MODES if m in r}})
        if pd.notna(r.get("forward")) and pd.notna(r.get("train-step")):
            configs.append({"size": size, "context_length": context, "forward": r["forward"],
                            "train_step": r["train-step"],
                            "word": "falls" if r["train-step"] < r["forward"] else "rises"})
    rows.sort(key=lambda x: (SIZE_RANK[x["size"]], x["context"]))
    totals = by_kernel(kernels)
    growth = []
    for size, context in focus.items():
        at = totals[(totals["size"] == size) & (totals["context_length"] == context)]
        fwd = at[at["mode"] == "forward"].set_index("kernel")
        train = at[at["mode"] == "train-step"].set_index("kernel")
        if fwd.empty or train.empty:
            continue
        gain = (train["share"] - fwd["share"].reindex(train.index).fillna(0)).sort_values(
            ascending=False)
        for kernel in gain.index[:TOP]:
            growth.append({"size": size, "context": context, "kernel": short_kernel(kernel),
                           "forward share %": fmt(100 * fwd["share"].get(kernel, 0.0), 1),
                           "train-step share %": fmt(100 * train.loc[kernel, "share"], 1),
                           "train-step ms/step": fmt(train.loc[kernel, "ms_per_step"], 3)})
    return {"table": tables.to_markdown(pd.DataFrame(rows)), "configs": configs,
            "growth_table": tables.to_markdown(pd.DataFrame(growth)),
            "all_fall": bool(configs) and all(c["word"] == "falls" for c in configs)}


def attention_parts(summary: pd.DataFrame, kernels: pd.DataFrame, paths: list[str]) -> dict:
    """(e) Device time of each part of attention in the forward pass against its FLOPs."""
    flops = {}
    for path in paths:
        record = read_record(path)
        if record["status"] == "ok" and record["config"]["mode"] == "forward":
            flops[(record["config"]["size"], record["config"]["context_length"])] = \
                record["metrics"]["attention_flops"]
    fwd = kernels[(kernels["mode"] == "forward") & (kernels["part"] != "")]
    rows, configs = [], []
    for (size, context), part_flops in sorted(flops.items(),
                                              key=lambda kv: (SIZE_RANK[kv[0][0]], kv[0][1])):
        at = fwd[(fwd["size"] == size) & (fwd["context_length"] == context)]
        ms = at.groupby("part")["ms_per_step"].sum()
        if not set(ATTENTION_PARTS) <= set(ms.index):
            continue
        for part in ATTENTION_PARTS:
            rows.append({"size": size, "context": context, "part": part,
                         "ms/forward": fmt(ms[part], 3), "GFLOP": part_flops[part] / 1e9,
                         "TFLOP/s": part_flops[part] / (ms[part] / 1e3) / 1e12})
        scores, softmax, output = ATTENTION_PARTS
        matmul_ms, matmul_flops = ms[scores] + ms[output], part_flops[scores] + part_flops[output]
        per_flop = (ms[softmax] / part_flops[softmax]) / (matmul_ms / matmul_flops)
        configs.append({"size": size, "context_length": context,
                        "softmax_over_matmul_time": ms[softmax] / matmul_ms,
                        "softmax_over_matmul_flops": part_flops[softmax] / matmul_flops,
                        "per_flop": max(per_flop, 1 / per_flop),
                        "per_flop_word": "slower" if per_flop > 1 else "faster"})
    return {"table": tables.to_markdown(pd.DataFrame(rows)), "configs": configs}


def nsys_facts(paths: list[str]) -> dict:
    """Nsight Systems' kernel summary where it ran; else why not."""
    if not paths:
        return {"configured": False}
    frame = tables.ensure_columns(tables.records_frame(paths), ["message"])
    kernels = kernel_frame(paths)
    rows = []
    for key, g in by_kernel(kernels).groupby(CONFIG):
        for rank, (_, k) in enumerate(g.head(TOP).iterrows()):
            rows.append({"size": key[0], "context": key[1], "mode": key[2], "#": rank + 1,
                         "kernel": short_kernel(k["kernel"]),
                         "calls/step": fmt(k["calls_per_step"], 1),
                         "share %": fmt(100 * k["share"], 1)})
    return {"configured": True, "ran": int((frame["status"] == "ok").sum()),
            "count": len(frame),
            "reasons": sorted({facts.reason(m)
                               for m in frame.loc[frame["status"] != "ok", "message"]} - {""}),
            "table": tables.to_markdown(pd.DataFrame(rows)) if rows else ""}


# --- figure ----------------------------------------------------------------------------------

def breakdown_figure(summary: pd.DataFrame, path: str) -> None:
    """Device time per step, matmul and the rest, per configuration and mode."""
    ok = summary[(summary["status"] == "ok") & summary["device_ms_per_step"].notna()]
    sizes = sorted(set(ok["size"]), key=SIZE_RANK.get) or ["(no results)"]
    fig, axes = figures.subplots(len(sizes), width=6.0)
    for ax, size in zip(axes[0], sizes):
        rows = ok[ok["size"] == size]
        labels = [f"ctx {c}\n{m}" for c, m in zip(rows["context_length"], rows["mode"])]
        matmul = rows["device_ms_per_step"] * rows["matmul_share"]
        other = rows["device_ms_per_step"] - matmul
        ax.bar(labels, matmul, label="matmul")
        ax.bar(labels, other, bottom=matmul, label="other kernels")
        ax.set(title=size, ylabel="device ms per step")
        ax.tick_params(axis="x", labelsize=7, rotation=90)
        ax.legend(fontsize=8)
    figures.save(fig, path)


# --- the section -----------------------------------------------------------------------------

def left_out(summary: pd.DataFrame, assignment: dict) -> str:
    return facts.not_in_preset({"sizes": (assignment["sizes"], summary["size"]),
                          "contexts": (assignment["context_lengths"], summary["context_length"]),
                          "modes": (assignment["modes"], summary["mode"])})


def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    """Records -> outputs["kernel_table"] (every kernel row), outputs["summary_table"] (one row
    per record), the figure, and the facts. options: assignment, the profile part of the full
    matrix."""
    paths = records["records"]
    summary = summary_table(paths)
    kernels = kernel_frame(paths)
    tables.write_table(summary, outputs["summary_table"])
    tables.write_table(kernels, outputs["kernel_table"])
    breakdown_figure(summary, outputs["figure"])
    ok = summary[summary["status"] == "ok"]
    on_cuda = bool((ok["device_work"] == "cuda kernels").any()) if len(ok) else False
    focus = largest_contexts(summary)
    traces = [{"size": r["size"], "context_length": r["context_length"], "mode": r["mode"],
               "trace": r["trace_path"]} for _, r in ok.iterrows() if r["trace_path"]]
    first = summary.iloc[0] if len(summary) else None
    nsys = nsys_facts(records.get("nsys_records", []))
    missing = [left_out(summary, options["assignment"])]
    if nsys["configured"] and nsys["ran"] < nsys["count"]:
        missing.append(f"Nsight Systems ran for {nsys['ran']} of {nsys['count']} "
                       f"configurations ({'; '.join(nsys['reasons'])}), torch.profiler "
                       "answers in its place")
    return {
        "env": tables.env_summary(summary),
        "coverage": {"nsys_profile": facts.covered(summary, anchor="nsys_profile",
                                             missing="; ".join(m for m in missing if m))},
        "on_cuda": on_cuda,
        "any_ok": bool(len(ok)),
        "batch_size": first["batch_size"] if first is not None else None,
        "precision": first["precision"] if first is not None else None,
        "warmup_steps": first["warmup_steps"] if first is not None else None,
        "measure_steps": first["measure_steps"] if first is not None else None,
        "attention": first["attention"] if first is not None else None,
        "focus": [{"size": s, "context_length": c} for s, c in focus.items()],
        "forward_time": forward_time(summary),
        "top": top_kernels(kernels, focus),
        "non_matmul": non_matmul(kernels, focus, outputs["kernel_table"]),
        "matmul": matmul_share(summary, kernels, focus),
        "attention_parts": attention_parts(summary, kernels, paths),
        "nsys": nsys,
        "traces": traces,
        "failures": facts.not_ok(summary, CONFIG),
        "figure": outputs["figure"],
    }
