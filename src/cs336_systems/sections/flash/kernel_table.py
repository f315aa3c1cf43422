"""The flash section's kernel profile: where one forward+backward spends its GPU time, from the
records of the `flash_kernels` job (`flash.kernel_profile`, one per shape).

Two views of each record. By kernel (the CSV): each kernel's device milliseconds a step (median
over the profiled steps, with their standard deviation), the matmul units it executes and at
what rate (ours only), and what its compiled binary asks of a multiprocessor. By pass (the
text): each variant's forward and backward, the rate of the work the pass needs, and for ours
the work it executes. The facts then answer why ours is slower or faster than cuDNN: whether
its kernels do more work or do it more slowly, what the deterministic backward's recomputation
costs (predicted from its executed rate) and what dropping it measured (the atomic-dQ variant).
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.measure.timing import summarize
from cs336_systems.records import read_record
from cs336_systems.report import facts, tables
from cs336_systems.report.render import fmt, fmt_ratio
from cs336_systems.sections.flash.kernel_variants import (
    GLUON_KERNELS,
    NEEDED,
    SUSTAINED_PASSES,
    VARIANTS,
    variant_label,
)
from cs336_systems.sections.flash.targets import GRAPH_METRICS, GROUPS, TARGETS

OURS, ATOMIC, REFERENCE = "flash-triton", "flash-triton-atomic-dq", "sdpa-cudnn"
GLUON = "flash-gluon"  # our Gluon kernels for Hopper (kernels/flash_gluon/)
PEER = "fa4"  # FlashAttention-4, the other stock kernel set beside cuDNN's, where installed
KEY_TILE_KERNEL = "flash_bwd_kernel"  # ours whose work changes with atomic dQ
PASSES = ("forward", "backward")
KERNEL_COLUMNS = ["shape", "variant", "label", "kernel", "pass", "calls_per_step", "ms", "ms_std",
                  "matmul_units", "executed_tflops", "warps", "registers", "spills",
                  "shared_kib", "programs_per_sm", "limited_by", "status", "reason", "commit",
                  "device"]


def _shape(record: dict) -> str:
    return "x".join(map(str, record["config"]["shape"]))


def _median_std(values: list[float]) -> tuple[float, float]:
    summary = summarize(values)
    return summary["median"], summary["std"]


def _binary_name(variant: str, kernel: str) -> str:
    return kernel + ("[atomic dQ]" if VARIANTS[variant][1] and kernel == KEY_TILE_KERNEL else "")


def _base(record: dict) -> dict:
    return {"shape": _shape(record), "commit": record["env"].get("git"),
            "device": record["env"].get("gpu") or record["env"].get("device")}


def kernel_rows(records: list[dict]) -> list[dict]:
    """One row per (shape, variant, kernel); a record that did not end `ok` gives one row with
    its status and reason."""
    rows = []
    for record in records:
        base = _base(record)
        if record["status"] != "ok":
            rows.append({**base, "status": record["status"],
                         "reason": facts.reason(record.get("message"))})
            continue
        metrics = record["metrics"]
        steps = len(record["metrics"]["kernels"][0]["step_ms"]) if metrics["kernels"] else 1
        for entry in metrics["kernels"]:
            ms, std = _median_std(entry["step_ms"])
            units = entry["matmul_units"]
            binary = metrics["binaries"].get(_binary_name(entry["variant"], entry["kernel"]), {})
            rows.append({**base, "variant": entry["variant"],
                         "label": variant_label(entry["variant"]), "kernel": entry["kernel"],
                         "pass": entry["pass"], "calls_per_step": entry["calls"] / steps,
                         "ms": ms, "ms_std": std, "matmul_units": units,
                         "executed_tflops": (units * metrics["unit_tflop"] / (ms / 1e3)
                                             if units else None),
                         **binary, "status": "ok", "reason": ""})
        for entry in metrics["variants"]:
            if entry["status"] != "ok":
                rows.append({**base, "variant": entry["variant"],
                             "label": variant_label(entry["variant"]), "status": entry["status"],
                             "reason": facts.reason(entry.get("message"))})
    return rows


def kernels_table(record_paths: list[str]) -> pd.DataFrame:
    return pd.DataFrame(kernel_rows([read_record(p) for p in record_paths]),
                        columns=KERNEL_COLUMNS)


def pass_rows(record: dict) -> dict[tuple[str, str], dict]:
    """(variant, pass) -> its device ms a step (median and std over the steps, each step the sum
    of the pass's kernels), the rate of the work it needs and, for ours, of what it executes,
    and that rate's share of the job's bf16 matmul ceiling (`ceiling_share`; None in a record
    without one)."""
    metrics = record["metrics"]
    unit_tflop = metrics["unit_tflop"]
    ceiling = metrics.get("matmul_tflops")
    out = {}
    for variant in VARIANTS:
        for pass_name in PASSES:
            entries = [e for e in metrics["kernels"]
                       if e["variant"] == variant and e["pass"] == pass_name]
            if not entries:
                continue
            ms, std = _median_std([sum(steps) for steps in zip(*(e["step_ms"] for e in entries))])
            units = [e["matmul_units"] for e in entries]
            executed = sum(units) if None not in units else None
            needed_tflops = NEEDED[pass_name] * unit_tflop / (ms / 1e3)
            executed_tflops = executed * unit_tflop / (ms / 1e3) if executed else None
            out[variant, pass_name] = {
                "variant": variant, "label": variant_label(variant), "pass": pass_name,
                "ms": ms, "std": std, "needed_units": NEEDED[pass_name],
                "needed_tflops": needed_tflops, "executed_units": executed,
                "executed_tflops": executed_tflops,
                "ceiling_share": (executed_tflops or needed_tflops) / ceiling if ceiling else None}
    return out


def passes_display(passes: dict) -> pd.DataFrame:
    rows = [{"implementation": p["label"], "pass": p["pass"],
             "device ms a step": fmt(p["ms"], 3) + (f" ± {fmt(p['std'], 3)}" if p["std"] else ""),
             "TFLOP/s of the work needed": fmt(p["needed_tflops"], 0),
             "matmul units executed (needed)": (f"{p['executed_units']} ({p['needed_units']})"
                                                if p["executed_units"] is not None
                                                else f"({p['needed_units']})"),
             "TFLOP/s executed": fmt(p["executed_tflops"], 0),
             "% of the matmul ceiling": fmt(100 * p["ceiling_share"], 0)
             if p["ceiling_share"] is not None else ""}
            for p in passes.values()]
    return pd.DataFrame(rows)


def _compare(passes: dict, a: str, b: str, pass_name: str) -> dict | None:
    """How variant a's pass compares with variant b's: `speedup` (ratio = b / a), with the
    steps' spread."""
    if (a, pass_name) not in passes or (b, pass_name) not in passes:
        return None
    x, y = passes[a, pass_name], passes[b, pass_name]
    return facts.speedup(x["ms"], y["ms"], x["std"], y["std"])


def recompute_facts(passes: dict, binaries: dict) -> dict | None:
    """What the deterministic backward's recomputation costs: at the rate its kernels execute,
    the needed units alone would take `predicted_ms` (prediction); the atomic-dQ variant,
    which executes only those, measured `atomic_ms`."""
    ours = passes.get((OURS, "backward"))
    if ours is None or not ours["executed_units"]:
        return None
    predicted = ours["ms"] * ours["needed_units"] / ours["executed_units"]
    reference = passes.get((REFERENCE, "backward"))
    atomic = passes.get((ATOMIC, "backward"))
    return {"extra_units": ours["executed_units"] - ours["needed_units"],
            "executed_units": ours["executed_units"], "needed_units": ours["needed_units"],
            "ours_ms": ours["ms"], "predicted_ms": predicted,
            "predicted_vs_reference": facts.speedup(predicted,
                                                    reference["ms"]) if reference else None,
            "atomic_ms": atomic["ms"] if atomic else None,
            "atomic_vs_ours": _compare(passes, ATOMIC, OURS, "backward"),
            "atomic_over_predicted": atomic["ms"] / predicted if atomic else None,
            "key_kernel": binaries.get(KEY_TILE_KERNEL),
            "atomic_key_kernel": binaries.get(KEY_TILE_KERNEL + "[atomic dQ]")}


def backward_gap(backward: dict | None, rates: dict | None) -> str | None:
    """Why ours's backward is slower than cuDNN's, where it is (beyond the spread): `work`
    when its kernels execute matmuls at least as fast as cuDNN does the needed ones (so the
    extra units are the gap), `rate` when they execute them more slowly too; None where ours is
    not slower or the comparison is missing."""
    if backward is None or rates is None or backward["word"] != "slower" \
            or backward["within_spread"]:
        return None
    return "work" if rates["ratio"] >= 1 else "rate"


def gluon_facts(passes: dict, binaries: dict) -> dict | None:
    """The Gluon kernels against cuDNN, pass by pass: the time (`speedup`, ratio = cuDNN / ours),
    the matmul units they execute and at what rate, against the rate at which cuDNN does the
    units the pass needs (`rate_ratio` = ours / cuDNN), each rate's share of the job's matmul
    ceiling (None without one), and what each kernel's binary asks of a multiprocessor; None
    where the Gluon kernels did not run."""
    out = {}
    for pass_name in PASSES:
        ours, reference = passes.get((GLUON, pass_name)), passes.get((REFERENCE, pass_name))
        if ours is None or reference is None or not ours["executed_tflops"]:
            continue
        out[pass_name] = {
            "versus": _compare(passes, GLUON, REFERENCE, pass_name),
            "executed_units": ours["executed_units"], "needed_units": ours["needed_units"],
            "executed_tflops": ours["executed_tflops"],
            "reference_tflops": reference["needed_tflops"],
            "rate_ratio": ours["executed_tflops"] / reference["needed_tflops"],
            "ceiling_share": ours["ceiling_share"],
            "reference_ceiling_share": reference["ceiling_share"],
            "kernels": [{"name": name, **binaries[name]} for name in GLUON_KERNELS[pass_name]
                        if name in binaries]}
    return out or None


def _clock_versus(ours: dict, reference: dict) -> dict:
    """One sustained run against another's: the time (`speedup`, ratio = reference / ours),
    the clock (ours / reference) and the cycles a step (ms x MHz, ours / reference), which
    split the time's ratio into work and clock."""
    clock = ours["sm_clock_mhz_median"] / reference["sm_clock_mhz_median"]
    return {"time": facts.speedup(ours["ms"], reference["ms"]), "clock_ratio": clock,
            "clock_word": "lower" if clock < 1 else "higher" if clock > 1 else "the same",
            "cycles_ratio": ours["ms"] * ours["sm_clock_mhz_median"] / (
                reference["ms"] * reference["sm_clock_mhz_median"])}


def _back_to_back(ours: dict, reference: dict) -> dict:
    """`_clock_versus`'s three ratios, each as ours / reference: time, clock, cycles."""
    versus = _clock_versus(ours, reference)
    return {"time": ours["ms"] / reference["ms"], "clock": versus["clock_ratio"],
            "cycles": versus["cycles_ratio"]}


def sustained_runs(record: dict) -> dict[tuple[str, str], dict]:
    """(variant, pass) -> its sustained run (`kernel_timings.sustained`) where the GPU was
    sampled; a record from before the forward alone ran that way has forward+backward ones."""
    return {(r["variant"], r.get("pass", SUSTAINED_PASSES[0])): r
            for r in record["metrics"].get("sustained", [])
            if r.get("sm_clock_mhz_median") is not None}


def sustained_facts(record: dict) -> dict | None:
    """The variants' steps run back to back (`kernel_timings.sustained`), where the GPU was
    sampled: the table (pass by pass, ms a step, SM clock and power, medians, and the share of
    samples whose clock the power limit held back); and for each pass whether every variant ran
    power-capped (most samples), and ours and the Gluon kernels against cuDNN
    (`_clock_versus`)."""
    runs = sustained_runs(record)
    if not runs:
        return None
    table = pd.DataFrame([{
        "implementation": variant_label(variant), "pass": pass_name,
        "ms a step": fmt(r["ms"], 3),
        "SM clock, MHz": fmt(r["sm_clock_mhz_median"], 0),
        "power, W": fmt(r["power_w_median"], 0),
        "samples power-capped, %": fmt(100 * r["power_capped_share"], 0)}
        for (variant, pass_name), r in runs.items()])
    passes = []
    for pass_name in SUSTAINED_PASSES:
        group = [r for (_, p), r in runs.items() if p == pass_name]
        if not group:
            continue
        reference = runs.get((REFERENCE, pass_name))
        passes.append({
            "pass": pass_name, "variants": len(group),
            "power_capped": sum(r["power_capped_share"] > 0.5 for r in group),
            "versus": [{"label": variant_label(variant),
                        **_clock_versus(runs[variant, pass_name], reference)}
                       for variant in (GLUON, OURS)
                       if reference is not None and (variant, pass_name) in runs]})
    return {"table": tables.to_markdown(table), "seconds": record["config"].get("sustain_s"),
            "power_limit_w": max(r["power_limit_w"] for r in runs.values()),
            "clock_max_mhz": max(r["sm_clock_mhz_max"] for r in runs.values()),
            "passes": passes}


def shape_facts(record: dict) -> dict:
    base = _base(record)
    if record["status"] != "ok":
        return {**base, "status": record["status"], "reason": facts.reason(record.get("message"))}
    passes = pass_rows(record)
    ours_bwd, ref_bwd = passes.get((OURS, "backward")), passes.get((REFERENCE, "backward"))
    rates = None
    if ours_bwd and ref_bwd and ours_bwd["executed_tflops"]:
        # the rate ours executes its backward's matmuls at, against the rate cuDNN does the
        # work the pass needs (ratio = ours / cuDNN; above 1, ours runs its tensor cores faster)
        ratio = ours_bwd["executed_tflops"] / ref_bwd["needed_tflops"]
        rates = {"ours": ours_bwd["executed_tflops"], "reference": ref_bwd["needed_tflops"],
                 "ratio": ratio, "word": "higher" if ratio > 1 else "lower"}
    backward = _compare(passes, OURS, REFERENCE, "backward")
    forward = _compare(passes, OURS, REFERENCE, "forward")
    ours_fwd, ref_fwd = passes.get((OURS, "forward")), passes.get((REFERENCE, "forward"))
    return {**base, "status": "ok",
            "table": tables.to_markdown(passes_display(passes)),
            "ceiling_tflops": record["metrics"].get("matmul_tflops"),
            "forward": forward,
            # both do the work the forward needs: ours at this rate against cuDNN's
            "forward_rates": {"ours": ours_fwd["needed_tflops"],
                              "reference": ref_fwd["needed_tflops"],
                              "kernel": record["metrics"]["binaries"].get("flash_fwd_kernel")}
            if ours_fwd and ref_fwd else None,
            "backward": backward, "gap": backward_gap(backward, rates),
            # ours against FlashAttention-4, pass by pass, where it ran
            "peer": {p: _compare(passes, OURS, PEER, p) for p in ("forward", "backward")}
            if (PEER, "forward") in passes else None,
            "rates": rates, "recompute": recompute_facts(passes, record["metrics"]["binaries"]),
            "gluon": gluon_facts(passes, record["metrics"]["binaries"]),
            "sustained": sustained_facts(record),
            "steps": len(record["metrics"]["kernels"][0]["step_ms"])
            if record["metrics"]["kernels"] else 0,
            "skipped": [{"label": variant_label(v["variant"]),
                         "reason": facts.reason(v.get("message"))}
                        for v in record["metrics"]["variants"] if v["status"] != "ok"]}


def kernel_facts(record_paths: list[str], csv: str) -> dict:
    records = [read_record(p) for p in record_paths]
    return {"shapes": [shape_facts(r) for r in records], "csv": csv,
            "ours_label": variant_label(OURS), "atomic_label": variant_label(ATOMIC),
            "reference_label": variant_label(REFERENCE), "peer_label": variant_label(PEER),
            "gluon_label": variant_label(GLUON),
            "needed": NEEDED}


# the speed targets' metrics that time a forward alone (eager, and replayed from a CUDA graph)
FORWARD_METRICS = ("forward_ms", GRAPH_METRICS["forward_ms"])


def clock_bounds(speed: pd.DataFrame, record_paths: list[str]) -> list[dict]:
    """What a missed target (not a stretch one) of a forward alone misses by, where the kernel
    profile ran both its implementations at the target's shape from the target's row's commit
    (the same code): one entry per (shape, target's bound), with the missed rows (`missed`:
    title and ratio) and, against the reference, the forward's device time in the profiled
    steps (`burst`, ours / reference) and its run back to back (`time`, `clock`, `cycles`,
    `_clock_versus`'s ratios as ours / reference). `held_by`: `clock` where
    the cycles a step meet the bound and the time back to back does not (the clock the power
    limit held is what misses), `cycles` where the cycles miss it too (the kernels' work), `met`
    where the run back to back meets it (the speed table's rounds differ from it). `peer`:
    FlashAttention-4's forward back to back against the same reference, where it ran."""
    records = {_shape(r): r for r in map(read_record, record_paths) if r["status"] == "ok"}
    missed = speed[(speed["status"] == "ok") & (speed["meets_target"] == False)]  # noqa: E712
    by_key = {t.key: t for t in TARGETS}
    found: dict[tuple, dict] = {}
    for _, row in missed.iterrows():
        target = by_key[row["target"]]
        ours, reference = target.ours, target.reference
        record = records.get(row["shape"])
        if (GROUPS[target.group].metric not in FORWARD_METRICS or reference is None
                or target.stretch or ours.compiled or reference.compiled or record is None
                or record["env"].get("git") != row["commit"]):
            continue
        passes, runs = pass_rows(record), sustained_runs(record)
        keys = [(v, "forward") for v in (ours.name, reference.name)]
        if not all(k in passes and k in runs for k in keys):
            continue
        back = _back_to_back(runs[keys[0]], runs[keys[1]])
        held_by = ("met" if target.meets(back["time"]) else
                   "clock" if target.meets(back["cycles"]) else "cycles")
        peer = runs.get((PEER, "forward"))
        if peer is not None and PEER not in (ours.name, reference.name):
            # FlashAttention-4's forward run the same way
            peer = {"label": variant_label(PEER), **_back_to_back(peer, runs[keys[1]])}
            peer["meets"] = target.meets(peer["time"])
        else:
            peer = None
        entry = found.setdefault((row["shape"], row["target_text"]), {
            "shape": row["shape"], "target": row["target_text"], "missed": [],
            "reference": reference.label, "bound": target.bound,
            "burst": passes[keys[0]]["ms"] / passes[keys[1]]["ms"], **back,
            "held_by": held_by, "seconds": record["config"].get("sustain_s"), "peer": peer})
        entry["missed"].append({"title": row["title"], "ratio": row["compared"],
                                "shown": f"{row['title']} ({fmt_ratio(row['compared'])})"})
    return list(found.values())
