"""autograd_residuals (assignment §2, 2026) and memory_profiling (f) (§1.5): what one RMSNorm and
one TransformerBlock save for backward, eager and compiled, against the analytic model.

`build` is the section's report module entry (see `cs336_systems.sections`); the prose
is in `template.md.j2`. Inputs: the RMSNorm records (one per variant) and the block
records (one per context, heads and variant), each listing every saved storage and the
operations that saved them (`cs336_systems.measure.saved_tensors`). Storages are also sorted into tensor
kinds by their element count: (B, T, d_model), (B, T, d_ff), the attention probabilities
(B, h, T, T), the mask (T, T), per-token scalars (B, T); kinds do not depend on how an
operation is named, so eager and compiled compare kind by kind.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.sizes import size_label
from cs336_systems.report import figures, tables
from cs336_systems.report.facts import covered, not_in_preset, not_ok
from cs336_systems.sections.residuals.saved_frames import (
    CONFIG,
    KIND_NOTES,
    KINDS,
    MIB,
    by_kind,
    operations_frame,
    read,
    summary_frame,
)

TOP = 5   # operations of (f), and per record in the tables
# The handout's figure for its compiled xl block (d_model 2560, d_ff 10240) at batch 4, context
# 2048, 16 heads, fp32: quoted, not measured here.
HANDOUT = {"mib": 3651, "batch_size": 4, "context_length": 2048, "num_heads": 16,
           "d_model": 2560, "d_ff": 10240,
           "source": "the CS336 spring 2026 assignment 2 handout, section 2 (autograd "
                     "residuals), as quoted in ASSIGNMENT.md"}
MAX_EXTRA_TENSORS = 8  # the handout's difference is read as up to this many tensors of one kind


def find(records: list[dict], **config) -> dict | None:
    """The `ok` record whose config has these values."""
    for r in records:
        if r["status"] == "ok" and all(r["config"].get(k) == v for k, v in config.items()):
            return r
    return None


def _side(record: dict | None) -> dict | None:
    if record is None:
        return None
    m = record["metrics"]
    return {"count": m["saved_count"], "mib": m["saved_bytes"] / MIB,
            "full_size": sum(s["tensor_kind"] == "(B, T, d_model)" for s in m["storages"]
                             if s["kind"] == "activation" and s["counted"]),
            "tensors": m["saved_tensors"], "parameters": m["parameter_storages"],
            "operations": [{"label": op["label"], "mib": op["bytes"] / MIB,
                            "share": op["share"]} for op in m["operations"]],
            "agrees": m["saved_agrees"], "analytic_mib": m["analytic_saved_bytes"] / MIB}


def rmsnorm_facts(records: list[dict]) -> dict:
    """RMSNorm eager against compiled: count, bytes, full-size tensors, the analytic model's
    eager entries."""
    eager, compiled = (find(records, variant=v) for v in ("eager", "compiled"))
    measured = eager or compiled
    out = {"eager": _side(eager), "compiled": _side(compiled),
           "config": measured["config"] if measured else None,
           "analytic": [{"name": k, "mib": v / MIB}
                        for k, v in measured["metrics"]["analytic_saved"].items()]
           if measured else []}
    out["analytic_mib"] = sum(a["mib"] for a in out["analytic"])
    if eager and compiled:
        out["bytes_ratio"] = out["compiled"]["mib"] / out["eager"]["mib"]
    return out


def kinds_table(left: dict, right: dict, names: tuple[str, str]) -> tuple[str, list[dict]]:
    """Two records side by side by tensor kind: counts, MiB and the operations."""
    a, b = by_kind(left), by_kind(right)
    rows, facts = [], []
    for kind in [k for k in KINDS if k in a or k in b] + sorted((set(a) | set(b)) - set(KINDS)):
        x, y = a.get(kind, {"count": 0, "mib": 0.0, "ops": []}), \
            b.get(kind, {"count": 0, "mib": 0.0, "ops": []})
        rows.append({"tensor kind": kind, "what": KIND_NOTES.get(kind, ""),
                     f"{names[0]} count": x["count"], f"{names[0]} MiB": x["mib"],
                     f"{names[1]} count": y["count"], f"{names[1]} MiB": y["mib"],
                     f"{names[0]}: saved by": ", ".join(x["ops"]),
                     f"{names[1]}: saved by": ", ".join(y["ops"])})
        facts.append({"kind": kind, "what": KIND_NOTES.get(kind, ""), "left_count": x["count"],
                      "left_mib": x["mib"], "right_count": y["count"], "right_mib": y["mib"],
                      "mib_change": y["mib"] - x["mib"]})
    return tables.to_markdown(pd.DataFrame(rows)), facts


def block_facts(records: list[dict], summary: pd.DataFrame) -> dict:
    """Every block configuration: eager and compiled side by side; 32 against 16 heads."""
    ok = summary[(summary["target"] == "block") & (summary["status"] == "ok")]
    pairs = []
    for (context, heads), g in ok.groupby(["context_length", "num_heads"]):
        sides = {r["variant"]: r for _, r in g.iterrows()}
        if {"eager", "compiled"} <= set(sides):
            e, c = sides["eager"], sides["compiled"]
            pairs.append({"context_length": int(context), "num_heads": int(heads),
                          "eager_mib": e["saved_mib"], "compiled_mib": c["saved_mib"],
                          "eager_count": e["saved_count"], "compiled_count": c["saved_count"],
                          "ratio": c["saved_mib"] / e["saved_mib"]})
    contexts = sorted(ok["context_length"].unique()) if len(ok) else []
    focus = max(contexts) if contexts else None
    heads_rows = []
    if focus is not None:
        at = ok[ok["context_length"] == focus]
        for variant, g in at.groupby("variant"):
            by_heads = g.set_index("num_heads")["saved_mib"].sort_index()
            if len(by_heads) < 2:
                continue
            low, high = by_heads.index[0], by_heads.index[-1]
            probs = {h: by_kind(find(records, target="block", context_length=focus,
                                     num_heads=h, variant=variant)).get(
                "(B, h, T, T)", {"mib": 0.0})["mib"] for h in (low, high)}
            first = at.iloc[0]
            heads_rows.append({
                "variant": variant, "low": int(low), "high": int(high),
                "low_mib": by_heads[low], "high_mib": by_heads[high],
                "difference_mib": by_heads[high] - by_heads[low],
                "probabilities_difference_mib": probs[high] - probs[low],
                "rest_mib": by_heads[high] - by_heads[low] - (probs[high] - probs[low]),
                "formula_mib": int(first["batch_size"]) * (int(high) - int(low))
                * focus * focus * 4 / MIB})
    comparison = {}
    if focus is not None:
        for heads in sorted(ok[ok["context_length"] == focus]["num_heads"].unique()):
            eager, compiled = (find(records, target="block", context_length=focus,
                                    num_heads=heads, variant=v) for v in ("eager", "compiled"))
            if eager and compiled:
                table, kinds = kinds_table(eager, compiled, ("eager", "compiled"))
                comparison[str(int(heads))] = {"num_heads": int(heads), "table": table,
                                               "kinds": kinds}
    return {"pairs": pairs, "focus_context": focus, "heads": heads_rows,
            "fused": comparison, "contexts": [int(c) for c in contexts]}


def handout_facts(records: list[dict]) -> dict:
    """Our compiled block at the handout's shape beside the handout's 3651 MiB."""
    out = {**HANDOUT, "found": False}
    for r in records:
        c = r["config"]
        if (r["status"] == "ok" and c["variant"] == "compiled" and c["precision"] == "fp32"
                and c["batch_size"] == HANDOUT["batch_size"]
                and c["context_length"] == HANDOUT["context_length"]
                and c["num_heads"] == HANDOUT["num_heads"]
                and c["d_model"] == HANDOUT["d_model"]
                and MODEL_SIZES[c["size"]].d_ff == HANDOUT["d_ff"]):
            ours = r["metrics"]["saved_bytes"] / MIB
            kinds = by_kind(r)
            token = kinds.get("(B, T, d_model)", {}).get("mib", 0) / max(
                kinds.get("(B, T, d_model)", {}).get("count", 0), 1)
            wide = kinds.get("(B, T, d_ff)", {}).get("mib", 0) / max(
                kinds.get("(B, T, d_ff)", {}).get("count", 0), 1)
            difference = HANDOUT["mib"] - ours
            # the difference in tensors of each kind ours keeps: the kind it is nearest a
            # whole number (1 to MAX_EXTRA_TENSORS) of names the likeliest tensors it has extra
            multiples = [{"kind": k, "what": KIND_NOTES.get(k, ""),
                          "each_mib": v["mib"] / v["count"],
                          "multiple": difference / (v["mib"] / v["count"])}
                         for k, v in kinds.items() if v["count"] and v["mib"]]
            nearest_kind = min((m for m in multiples
                                if 0.5 <= abs(m["multiple"]) <= MAX_EXTRA_TENSORS + 0.5),
                               key=lambda m: abs(m["multiple"] - round(m["multiple"])),
                               default=None)
            # our other compiled fp32 blocks at the handout's batch and context (other heads)
            others = [{"num_heads": o["config"]["num_heads"],
                       "mib": o["metrics"]["saved_bytes"] / MIB,
                       "difference_mib": o["metrics"]["saved_bytes"] / MIB - HANDOUT["mib"]}
                      for o in records
                      if o is not r and o["status"] == "ok"
                      and all(o["config"][k] == c[k] for k in CONFIG if k != "num_heads")]
            closest = min(others, key=lambda o: abs(o["difference_mib"]), default=None)
            eager = find(records, **{k: c[k] for k in CONFIG if k != "variant"},
                         variant="eager")
            eager_mib = eager["metrics"]["saved_bytes"] / MIB if eager else None
            out.update({"found": True, "ours_mib": ours, "difference_mib": difference,
                        "ratio": HANDOUT["mib"] / ours, "token_mib": token, "wide_mib": wide,
                        "in_tokens": difference / token if token else None,
                        "in_wide": difference / wide if wide else None,
                        "eager_mib": eager_mib, "nearest_kind": nearest_kind,
                        "closest_other": closest,
                        "between": eager_mib is not None and ours < HANDOUT["mib"] < eager_mib,
                        "kinds": [{"kind": k, "what": KIND_NOTES.get(k, ""), **v,
                                   "ops": ", ".join(v["ops"])}
                                  for k, v in sorted(kinds.items(),
                                                     key=lambda kv: -kv[1]["mib"])]})
            break
    return out


def compiled_facts(ok: list[dict]) -> dict:
    """Whether the pack hook saw what the compiled modules saved, and the graphs they made."""
    compiled = [r for r in ok if r["config"]["variant"] == "compiled"]
    errors = sorted({r["metrics"]["hooks_error"] for r in compiled if r["metrics"]["hooks_error"]})
    return {"count": len(compiled), "hooks_failed": len([r for r in compiled
                                                         if r["metrics"]["hooks_error"]]),
            "errors": errors,
            "recompiled": sum(bool(r["metrics"]["recompiled_under_hooks"]) for r in compiled),
            "unnamed": sum(s["op"].startswith("CompiledFunction") for r in compiled
                           for s in r["metrics"]["storages"] if s["counted"])}


def memory_f_facts(records: list[dict]) -> tuple[pd.DataFrame, dict]:
    """(f): one eager fp32 block with the size's own heads per context: total saved, the five
    largest operations and their share, and the gradients, each against the analytic model."""
    rows, contexts = [], []
    for r in sorted(records, key=lambda r: r["config"]["context_length"]):
        c = r["config"]
        if (r["status"] != "ok" or c["variant"] != "eager" or c["precision"] != "fp32"
                or c["num_heads"] != MODEL_SIZES[c["size"]].num_heads):
            continue
        m = r["metrics"]
        top = m["operations"][:TOP]
        grads = [("parameter gradients", m["parameter_gradient_bytes"]),
                 ("input gradient", m["input_gradient_bytes"])]
        analytic_grads = m["analytic_gradient"] or {}
        entry = {"context_length": c["context_length"], "size": c["size"],
                 "batch_size": c["batch_size"], "num_heads": c["num_heads"],
                 "saved_mib": m["saved_bytes"] / MIB, "saved_bytes": m["saved_bytes"],
                 "saved_count": m["saved_count"],
                 "analytic_mib": m["analytic_saved_bytes"] / MIB,
                 "analytic_bytes": m["analytic_saved_bytes"], "agrees": m["saved_agrees"],
                 "top": [{"label": op["label"], "mib": op["bytes"] / MIB, "share": op["share"],
                          "storages": op["storages"]} for op in top],
                 "top_share": sum(op["share"] for op in top),
                 "gradient_mib": m["gradient_bytes"] / MIB,
                 "analytic_gradient_mib": (m["analytic_gradient_bytes"] or 0) / MIB,
                 "gradients": [{"name": n, "mib": b / MIB,
                                "analytic_mib": analytic_grads.get(n, 0) / MIB,
                                "agrees": b == analytic_grads.get(n)} for n, b in grads],
                 "gradient_agrees": m["gradient_agrees"]}
        # Saved bytes are measured (the pack hook's storages); a gradient's bytes are its
        # .grad tensor's size, which equals the formula whenever backward produced it in fp32:
        # that row checks that it did, not how much memory it took.
        shown = [{"context": c["context_length"], "quantity": "saved for backward",
                  "read from": "saved-tensor hooks", "MiB": entry["saved_mib"],
                  "analytic MiB": entry["analytic_mib"],
                  "agree": "yes" if m["saved_agrees"] else "no"}]
        shown += [{"context": c["context_length"], "quantity": f"gradient: {g['name']}",
                   "read from": ".grad sizes", "MiB": g["mib"],
                   "analytic MiB": g["analytic_mib"],
                   "agree": "yes" if g["agrees"] else "no"} for g in entry["gradients"]]
        entry["table"] = tables.to_markdown(pd.DataFrame(shown))
        entry["top_table"] = tables.to_markdown(pd.DataFrame(
            [{"#": i, "operation (module: code (op))": op["label"], "MiB": op["mib"],
              "share %": 100 * op["share"]} for i, op in enumerate(entry["top"], 1)]))
        contexts.append(entry)
        rows += [{"context_length": c["context_length"], "quantity": "saved for backward",
                  "name": "total", "measured_bytes": m["saved_bytes"],
                  "analytic_bytes": m["analytic_saved_bytes"], "share": 1.0,
                  "agrees": m["saved_agrees"]}]
        rows += [{"context_length": c["context_length"], "quantity": "top operation",
                  "name": op["label"], "measured_bytes": op["bytes"], "analytic_bytes": None,
                  "share": op["share"], "agrees": None} for op in top]
        rows += [{"context_length": c["context_length"], "quantity": "gradient", "name": n,
                  "measured_bytes": b, "analytic_bytes": analytic_grads.get(n),
                  "share": None, "agrees": b == analytic_grads.get(n)} for n, b in grads]
    frame = pd.DataFrame(rows, columns=["context_length", "quantity", "name", "measured_bytes",
                                        "analytic_bytes", "share", "agrees"])
    return frame, {"contexts": contexts, "all_agree": bool(contexts) and all(
        e["agrees"] and e["gradient_agrees"] for e in contexts)}


def summary_display(summary: pd.DataFrame) -> str:
    ok = summary[summary["status"] == "ok"]
    rows = []
    for _, r in ok.iterrows():
        rows.append({"target": r["target"] if r["target"] == "rmsnorm" else
                     f"block {size_label(r['size'])}", "heads": "" if pd.isna(r["num_heads"])
                     else int(r["num_heads"]), "context": int(r["context_length"]),
                     "variant": r["variant"], "saved tensors": int(r["saved_count"]),
                     "(B, T, d_model) of them": int(r["full_size_count"]),
                     "saved MiB": r["saved_mib"],
                     "analytic (eager) MiB": r["analytic_saved_bytes"] / MIB,
                     "agree": "" if r["saved_agrees"] is None or pd.isna(r["saved_agrees"])
                     else ("yes" if r["saved_agrees"] else "no")})
    return tables.to_markdown(pd.DataFrame(rows))


def kinds_figure(rmsnorm: list[dict], block: list[dict], focus: int | None, path: str) -> None:
    """Saved MiB stacked by tensor kind: RMSNorm eager and compiled; the block at the longest
    context, each heads and variant."""
    fig, axes = figures.subplots(2, width=6.0)
    panels = [("RMSNorm", [(r["config"]["variant"], r)
                           for r in sorted(rmsnorm, key=lambda r: r["config"]["variant"] != "eager")
                           if r["status"] == "ok"]),
              (f"TransformerBlock, context {focus}",
               [(f"{r['config']['num_heads']} heads\n{r['config']['variant']}", r)
                for r in sorted(block, key=lambda r: (-r["config"]["num_heads"],
                                                      r["config"]["variant"] != "eager"))
                if r["status"] == "ok" and r["config"]["context_length"] == focus])]
    colours = dict(zip(KINDS, ["C3", "C1", "C0", "C2", "C4", "0.55", "0.8"]))
    for ax, (title, bars) in zip(axes[0], panels):
        if not bars:
            ax.set(title=f"{title}: no results")
            continue
        labels = [label for label, _ in bars]
        bottom = [0.0] * len(bars)
        present = [k for k in KINDS if any(k in by_kind(r) for _, r in bars)]
        mixed = sorted({k for _, r in bars for k in by_kind(r)} - set(KINDS))
        for kind in present + mixed:
            heights = [by_kind(r).get(kind, {"mib": 0.0})["mib"] for _, r in bars]
            ax.bar(labels, heights, bottom=bottom, label=kind, color=colours.get(kind, "0.8"))
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set(title=title, ylabel="saved for backward, MiB")
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figures.save(fig, path)


def left_out(records: list[dict], assignment: dict) -> str:
    block = [r["config"] for r in records if r["config"]["target"] == "block"]
    norm = [r["config"] for r in records if r["config"]["target"] == "rmsnorm"]
    want = assignment["block"]
    own = MODEL_SIZES[want["size"]].num_heads
    shape = assignment["rmsnorm"]
    return not_in_preset(
        {"block size": ([want["size"]], [b["size"] for b in block]),
         "block contexts": (want["context_lengths"], [b["context_length"] for b in block]),
         "heads": ([h or own for h in want["num_heads"]], [b["num_heads"] for b in block]),
         "block variants": (want["variants"], [b["variant"] for b in block])},
        more=["the RMSNorm at " + " x ".join(
            str(shape[k]) for k in ("batch_size", "context_length", "d_model"))
            if not any(all(c[k] == v for k, v in shape.items()) for c in norm) else ""])


# The allocator's bytes held after the forward "agree" with the saved bytes counted by the hooks
# when within this share of them.
ALLOCATOR_AGREES_WITHIN = 0.2


def allocator_facts(ok: list[dict]) -> dict:
    """Per record, what the forward left allocated (less its output) against the bytes the
    hooks counted as saved, and whether they agree (`ALLOCATOR_AGREES_WITHIN`). They need not:
    a saved tensor that existed before the forward is counted as saved but was not allocated by
    it."""
    rows = []
    for r in ok:
        m = r["metrics"]
        if m["held_after_forward_bytes"] is None:
            continue
        held = (m["held_after_forward_bytes"] - m["output_bytes"]) / MIB
        saved = m["saved_bytes"] / MIB
        rows.append({"target": r["config"]["target"], "variant": r["config"]["variant"],
                     "context_length": r["config"]["context_length"],
                     "num_heads": r["config"].get("num_heads"), "saved_mib": saved,
                     "held_mib": held, "peak_gib": m["forward_peak_gib"],
                     "agrees": bool(abs(held - saved) <= ALLOCATOR_AGREES_WITHIN * saved)})
    return {"rows": rows, "agree": sum(r["agrees"] for r in rows),
            "within": ALLOCATOR_AGREES_WITHIN}


def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    """Records -> outputs["table"] (one row per record), outputs["operations_table"] (every
    operation), outputs["block_table"] ((f)), the figure, and the facts. options: assignment,
    the residuals part of the full matrix."""
    rmsnorm, block = read(records["rmsnorm"]), read(records["block"])
    everything = rmsnorm + block
    summary = summary_frame(everything)
    tables.write_table(summary, outputs["table"])
    tables.write_table(operations_frame(everything), outputs["operations_table"])
    f_frame, f_facts = memory_f_facts(block)
    tables.write_table(f_frame, outputs["block_table"])
    blocks = block_facts(block, summary)
    kinds_figure(rmsnorm, block, blocks["focus_context"], outputs["figure"])
    ok = [r for r in everything if r["status"] == "ok"]
    first = everything[0]["config"] if everything else {}
    unhooked = sorted({(", ".join(st["saved_by"]), st["dtype"], str(st["shape"]), st["bytes"])
                       for r in ok for st in r["metrics"]["storages"] if not st["counted"]})
    return {
        "env": tables.env_summary(summary),
        "coverage": {"autograd_residuals": covered(
            summary, anchor="autograd_residuals", missing=left_out(everything,
                                                                   options["assignment"]))},
        "any_ok": bool(ok),
        "on_cuda": any(r["env"].get("device") == "cuda" for r in ok),
        "precision": first.get("precision"),
        "block_size": block[0]["config"]["size"] if block else None,
        "block_batch": block[0]["config"]["batch_size"] if block else None,
        "methods": {r["config"]["variant"]: r["metrics"]["method"] for r in ok},
        "compiled": compiled_facts(ok),
        "unhooked": [{"saved_by": by, "dtype": dtype, "shape": shape, "bytes": size}
                     for by, dtype, shape, size in unhooked],
        "table": summary_display(summary),
        "rmsnorm": rmsnorm_facts(rmsnorm),
        "block": blocks,
        "handout": handout_facts(block),
        "f": f_facts,
        "allocator": allocator_facts(ok),
        "failures": not_ok(summary, ["target", "size", "num_heads", "context_length",
                                     "variant"]),
        "figure": outputs["figure"],
    }
