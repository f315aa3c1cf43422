"""Analysing parallelism strategies (§7, 2026): formulas, the device counts they give, checks.

`build(records, options, outputs)` reads three record groups: `checks` (the checks job's one
record: simulated collectives, counted FLOPs, the tensor-parallel backward against autograd),
`allreduce` (the NCCL all-reduce records, for W) and `benchmark` (the benchmark's 16-bit
records, for C). Every formula in the facts is printed from the sympy expressions of
`cs336_systems.analysis.parallelism`; every number is one of them evaluated at C, W, the configured
batch B and each model size's d_model and d_ff.

W is the bus bandwidth of the NCCL all-reduce at its largest size and largest world size (the
per-device link rate a ring achieves: a ring all-reduce of S bytes takes 2 (n-1)/n S / busbw);
C the best model FLOP rate of a 16-bit benchmark record (model FLOPs per step / step time). Both
come from GPU records only; without one, the configured nominal value stands in, and the facts
say so. options: sizes, batch_tokens (B), devices (the N of the time table) and nominal
({gpu, flop_per_s, egress_bytes_per_s, source}).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pandas as pd
import sympy as sp

from cs336_systems.analysis import parallelism as par
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.records import read_record
from cs336_systems.report import facts, figures, tables
from cs336_systems.report.render import fmt

HALF_PRECISIONS = ("bf16", "fp16")   # tensor cores run both at the same rate
PASSES = ("forward", "backward")
# (strategy, pass) of the time table and figure; data parallelism's forward does not talk
TALKING_PASSES = (("data parallel", "backward"), ("FSDP", "forward"), ("FSDP", "backward"),
                  ("tensor parallel", "forward"), ("tensor parallel", "backward"))


def strategies() -> dict[str, dict[str, par.Pass]]:
    return {"data parallel": par.data_parallel(), "FSDP": par.fsdp(),
            "tensor parallel": par.tensor_parallel()}


# --- C and W, from the records or the config ------------------------------------------------

def _gpu_rows(paths: list[str]) -> pd.DataFrame:
    """The records of `paths` that ran and ran on a GPU, with their paths."""
    if not paths:
        return pd.DataFrame()
    frame = tables.records_frame(paths).assign(record=paths)
    return frame[(frame["status"] == "ok") & (frame["env_device"] == "cuda")]


def measured_bandwidth(paths: list[str]) -> dict | None:
    """W from the NCCL all-reduce records: the bus bandwidth at the largest world size's largest
    tensor. None without an `ok` NCCL record on GPUs."""
    rows = _gpu_rows(paths)
    if rows.empty:
        return None
    rows = rows[rows["backend"] == "nccl"]
    if rows.empty:
        return None
    widest = rows[rows["world_size"] == rows["world_size"].max()]
    r = widest.loc[widest["size_bytes"].idxmax()]
    return {"value": float(r["busbw_gbps"]) * 1e9, "record": r["record"], "gpu": r["env_gpu"],
            "world_size": int(r["world_size"]), "size_mb": float(r["size_mb"]),
            "busbw_gbps": float(r["busbw_gbps"]), "median_ms": float(r["allreduce_ms_median"])}


def measured_flop_rate(paths: list[str]) -> dict | None:
    """C from the benchmark's 16-bit records: the best model FLOPs per step / mean step time.
    None without an `ok` record on a GPU."""
    rows = _gpu_rows(paths)
    if rows.empty:
        return None
    rows = rows[rows["precision"].isin(HALF_PRECISIONS)]
    if rows.empty:
        return None
    rate = rows["model_flops_per_step"] / (rows["step_ms_mean"] / 1e3)
    r, best = rows.loc[rate.idxmax()], float(rate.max())
    return {"value": best, "record": r["record"], "gpu": r["env_gpu"], "size": r["size"],
            "context_length": int(r["context_length"]), "batch_size": int(r["batch_size"]),
            "mode": r["mode"], "precision": r["precision"],
            "model_tflop_per_step": float(r["model_flops_per_step"]) / 1e12,
            "step_ms": float(r["step_ms_mean"]), "tflop_per_s": best / 1e12}


def hardware(records: dict[str, list[str]], nominal: dict) -> dict:
    """C and W with where each came from: `measured` (the record's facts) or the nominal value
    (`nominal`: true, with the reason)."""
    bandwidth = measured_bandwidth(records["allreduce"])
    rate = measured_flop_rate(records["benchmark"])
    c = rate or {"value": float(nominal["flop_per_s"]), "nominal": True,
                 "reason": "no 16-bit benchmark record from a GPU in this run"}
    w = bandwidth or {"value": float(nominal["egress_bytes_per_s"]), "nominal": True,
                      "reason": "no NCCL all-reduce record from GPUs in this run"}
    c.setdefault("nominal", False)
    w.setdefault("nominal", False)
    return {"C": {**c, "tflop_per_s": c["value"] / 1e12},
            "W": {**w, "gb_per_s": w["value"] / 1e9},
            "flop_per_byte": c["value"] / w["value"],
            "any_nominal": c["nominal"] or w["nominal"],
            "all_nominal": c["nominal"] and w["nominal"],
            "nominal": {**nominal, "tflop_per_s": float(nominal["flop_per_s"]) / 1e12,
                        "gb_per_s": float(nominal["egress_bytes_per_s"]) / 1e9,
                        "flop_per_byte": float(nominal["flop_per_s"])
                        / float(nominal["egress_bytes_per_s"])}}


# --- the formulas, printed from sympy -------------------------------------------------------

def _pass_formulas(p: par.Pass, n: sp.Symbol = par.N) -> dict:
    out = {"flops": par.formula(p.flops), "compute": par.formula(p.compute_time),
           "comm": par.formula(p.comm_time)}
    if p.comm_time != 0:
        out["largest_n"] = par.formula(par.break_even(p.comm_time, p.compute_time, n))
        out["comm_over_compute"] = par.formula(sp.simplify(p.comm_time / p.compute_time))
    return out


@functools.cache
def formulas() -> dict:
    """Every formula of the section, printed from sympy (the same for every run: cached)."""
    whole, sharded = par.ffn_equations(), par.ffn_equations(cols=par.F / par.N, suffix="_i")
    ring, alternate = par.all_reduce_time(par.S, par.N), par.alternate_all_reduce_time(par.S, par.N)
    grid = par.fsdp_tp()
    balanced = par.balanced_split(grid)
    same_as_dp = {name: {p: sp.simplify(passes[p].comm_time / passes[p].compute_time
                                        - ratio("data parallel", "backward")) == 0
                         for p in PASSES if passes[p].comm_time != 0}
                  for name, passes in strategies().items()}
    return {
        "collectives": {
            "all_gather": par.formula(par.all_gather_time(par.S, par.N)),
            "reduce_scatter": par.formula(par.reduce_scatter_time(par.S, par.N)),
            "all_reduce": par.formula(ring), "alternate": par.formula(alternate),
            "alternate_over_ring": par.formula(sp.simplify(alternate / ring)),
            "alternate_steps": par.formula(par.N - 1),
            "ring_steps": par.formula(2 * (par.N - 1)),
        },
        "ffn": {"forward": par.equation_lines(whole.forward),
                "backward": par.equation_lines(whole.backward),
                "forward_flops": par.formula(par.equations_flops(whole.forward)),
                "backward_flops": par.formula(par.equations_flops(whole.backward)),
                "weight_bytes": par.formula(par.weight_bytes()),
                "activation_bytes": par.formula(par.activation_bytes(par.B))},
        "tp_equations": {"forward": par.equation_lines(sharded.forward),
                         "backward": par.equation_lines(sharded.backward),
                         **par.tensor_parallel_collectives()},
        **{key: {p: _pass_formulas(passes[p]) for p in PASSES}
           for key, passes in zip(("dp", "fsdp", "tp"), strategies().values())},
        # bytes over a whole step (forward and backward), FSDP against data parallelism
        "fsdp_over_dp_bytes": par.formula(sp.simplify(
            sum(p.comm_time for p in par.fsdp().values())
            / par.data_parallel()["backward"].comm_time)),
        "tp_backward_over_forward_flops": par.formula(sp.simplify(
            par.tensor_parallel()["backward"].flops / par.tensor_parallel()["forward"].flops)),
        "same_bound_as_dp_backward": {"fsdp_forward": same_as_dp["FSDP"]["forward"],
                                      "fsdp_backward": same_as_dp["FSDP"]["backward"]},
        "grid": {
            "flops": par.formula(grid.flops), "compute": par.formula(grid.compute_time),
            "fsdp": par.formula(grid.fsdp_time), "tp": par.formula(grid.tp_time),
            "overlapped": par.formula(grid.overlapped_time),
            "sequential": par.formula(grid.sequential_time),
            "fsdp_axis_limit": par.formula(par.break_even(grid.fsdp_time, grid.compute_time,
                                                          par.N_FSDP)),
            "tp_axis_limit": par.formula(par.break_even(grid.tp_time, grid.compute_time,
                                                        par.N_TP)),
            "balanced_tp": par.formula(balanced),
            "balanced_tp_large_n": par.formula(par.leading_term(balanced)),
            "sequential_load": par.formula(par.sequential_load(grid)),
            "sequential_best_tp": par.formula(par.sequential_optimum(grid)),
            "sequential_boundary": par.formula(par.sequential_boundary(grid)),
            "overlapped_largest_n": par.formula(par.overlapped_largest(grid)),
            "sequential_largest_n": par.formula(par.sequential_largest(grid)),
        },
    }


@functools.cache
def ratio(strategy: str, pass_name: str) -> sp.Expr:
    """T_comm / T_compute of one strategy's pass."""
    p = strategies()[strategy][pass_name]
    return sp.simplify(p.comm_time / p.compute_time)


# --- evaluated per model size ---------------------------------------------------------------

def size_values(size: str, batch_tokens: int, hw: dict) -> dict[sp.Symbol, float]:
    s = MODEL_SIZES[size]
    return {par.B: batch_tokens, par.D: s.d_model, par.F: s.d_ff, par.C: hw["C"]["value"],
            par.W: hw["W"]["value"]}


def limits(size: str, batch_tokens: int, hw: dict) -> dict:
    """The largest whole device counts of every strategy and pass, and the 2D grid's splits."""
    values = size_values(size, batch_tokens, hw)
    out = {"size": size, "d_model": MODEL_SIZES[size].d_model, "d_ff": MODEL_SIZES[size].d_ff}
    for name, passes in strategies().items():
        for p in PASSES:
            if passes[p].comm_time != 0:
                bound = par.break_even(passes[p].comm_time, passes[p].compute_time, par.N)
                out[f"{name} {p}"] = par.largest_count(bound, values)
    grid = par.fsdp_tp()
    n_fsdp = par.largest_count(par.break_even(grid.fsdp_time, grid.compute_time, par.N_FSDP),
                               values)
    n_tp = par.largest_count(par.break_even(grid.tp_time, grid.compute_time, par.N_TP), values)
    seq_tp, seq_fsdp = par.best_sequential_grid(grid, values)
    out["overlapped"] = {"n_tp": n_tp, "n_fsdp": n_fsdp, "n": n_tp * n_fsdp}
    out["sequential"] = {"n_tp": seq_tp, "n_fsdp": seq_fsdp, "n": seq_tp * seq_fsdp,
                         "best_tp_real": par.value(par.sequential_optimum(grid), values)}
    out["sequential_over_overlapped"] = out["sequential"]["n"] / out["overlapped"]["n"]
    return out


def _limits_display(rows: list[dict]) -> pd.DataFrame:
    def grid(g):
        return f"{g['n_tp']} x {g['n_fsdp']} = {g['n']}"
    return pd.DataFrame([{
        "size": r["size"], "D": r["d_model"], "F": r["d_ff"],
        "N_DP (backward)": r["data parallel backward"],
        "N_FSDP (forward / backward)": f"{r['FSDP forward']} / {r['FSDP backward']}",
        "N_TP (forward / backward)": (f"{r['tensor parallel forward']} / "
                                      f"{r['tensor parallel backward']}"),
        "2D overlapped N_TP x N_FSDP": grid(r["overlapped"]),
        "2D not overlapped N_TP x N_FSDP": grid(r["sequential"])} for r in rows])


def times(size: str, batch_tokens: int, devices: int, hw: dict) -> dict:
    """Compute and communication time in ms of each talking pass at N = `devices`."""
    values = {**size_values(size, batch_tokens, hw), par.N: devices}
    out = {"size": size}
    for name, p in TALKING_PASSES:
        pass_ = strategies()[name][p]
        compute, comm = (1e3 * par.value(e, values) for e in (pass_.compute_time, pass_.comm_time))
        out[f"{name} {p}"] = {"compute_ms": compute, "comm_ms": comm, "ratio": comm / compute}
    return out


def _times_display(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"size": r["size"], **{
        f"{key} ms": f"{fmt(r[key]['compute_ms'], 2)} / {fmt(r[key]['comm_ms'], 2)}"
        for key in (f"{n} {p}" for n, p in TALKING_PASSES)}} for r in rows])


def _flat(rows: list[dict]) -> pd.DataFrame:
    """Nested facts as one CSV row each (keys joined with a dot)."""
    return pd.json_normalize(rows, sep=".")


# --- the checks record --------------------------------------------------------------------

def checks(path: str) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """The checks record's verdicts, and its collective and FLOP tables."""
    record = read_record(path)
    if record["status"] != "ok":
        failed = {"ran": False, "status": record["status"],
                  "reason": facts.reason(record.get("message"))}
        return failed, pd.DataFrame(), pd.DataFrame()
    m = record["metrics"]
    collectives = pd.DataFrame(m["collectives"])
    collectives["agrees"] = ((collectives["simulated_time_s_per_w"]
                              - collectives["formula_time_s_per_w"]).abs() < 1e-12)
    flops = pd.DataFrame(m["flops"])
    flops["agrees"] = flops["counted"] == flops["formula"]
    tp = m["tp_backward"]
    errors = [v for row in tp for k, v in row.items() if k.endswith("_max_abs_error")]
    alt = collectives[collectives["collective"] == "alternate all-reduce"]
    return {
        "ran": True,
        "devices": sorted(set(int(n) for n in collectives["devices"])),
        "collectives_agree": bool(collectives["agrees"].all()),
        "collectives_exact": bool((collectives["max_abs_error"] == 0).all()),
        "alternate_steps_are_n_minus_1": bool((alt["steps"] == alt["devices"] - 1).all()),
        "flops_agree": bool(flops["agrees"].all()), "flop_rows": len(flops),
        "ffn_shape": {k: record["config"][k] for k in ("batch", "d_model", "d_ff")},
        "tp_devices": [row["devices"] for row in tp],
        "tp_max_abs_error": max(errors), "tp_max_abs_value": max(r["max_abs_value"] for r in tp),
        "collectives_table": tables.to_markdown(pd.DataFrame({
            "collective": collectives["collective"], "N": collectives["devices"],
            "S bytes": collectives["bytes"], "steps": collectives["steps"],
            "bytes sent per device": collectives["bytes_sent_per_device"],
            "simulated time (S/W)": collectives["simulated_time_s_per_w"].map(lambda v: fmt(v, 3)),
            "formula (S/W)": collectives["formula_time_s_per_w"].map(lambda v: fmt(v, 3)),
            "sum exact": collectives["max_abs_error"].map(lambda v: "yes" if v == 0 else f"{v:g}"),
        })),
        "flops_table": tables.to_markdown(pd.DataFrame({
            "strategy": flops["strategy"], "N": flops["devices"], "pass": flops["pass"],
            "FlopCounterMode": flops["counted"], "formula": flops["formula"]})),
    }, collectives, flops


# --- the figure ---------------------------------------------------------------------------

def ratio_figure(sizes: list[str], batch_tokens: int, hw: dict, path: str | Path) -> None:
    """comm / compute against N: the batch-splitting passes (one curve where sympy finds their
    ratios equal) and tensor parallelism per model size."""
    fig, axes = figures.subplots(2)
    base = size_values(sizes[-1], batch_tokens, hw)

    def curve(ax, expr, values, counts, **style):
        ax.plot(counts, [par.value(expr, {**values, par.N: n}) for n in counts], **style)

    batch_counts, tp_counts = [2**k for k in range(1, 16)], [2**k for k in range(1, 10)]
    dp = ratio("data parallel", "backward")
    same = [f"{n} {p}" for n, p in TALKING_PASSES[1:3] if sp.simplify(ratio(n, p) - dp) == 0]
    curve(axes[0][0], dp, base, batch_counts, marker="o",
          label=" = ".join(["data parallel backward", *same]))
    for name, p in TALKING_PASSES[1:3]:
        if f"{name} {p}" not in same:
            curve(axes[0][0], ratio(name, p), base, batch_counts, marker="o", label=f"{name} {p}")
    for i, size in enumerate(sizes):
        for p, line in (("forward", "-"), ("backward", "--")):
            curve(axes[0][1], ratio("tensor parallel", p), size_values(size, batch_tokens, hw),
                  tp_counts, linestyle=line, color=f"C{i}", label=f"{size} {p}")
    for ax, title in zip(axes[0], (f"Batch split (B = {batch_tokens} tokens)",
                                   "Tensor parallel (any B)")):
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set(xscale="log", yscale="log", xlabel="devices N", ylabel="T_comm / T_compute",
               title=title)
        ax.legend(fontsize=7)
    figures.save(fig, path)


# --- the section -----------------------------------------------------------------------------

def _provenance_env(hw: dict) -> list[pd.DataFrame]:
    """The records C and W came from (their env columns), for the section's header."""
    paths = [hw[k]["record"] for k in ("C", "W") if not hw[k]["nominal"]]
    return [tables.records_frame(paths)] if paths else []


def coverage(checks_frame: pd.DataFrame, hw: dict) -> dict:
    nominal = [k for k in ("C", "W") if hw[k]["nominal"]]
    how = (f"evaluated with the config's nominal {' and '.join(nominal)} "
           f"({hw['nominal']['gpu']}): this run has no GPU record of "
           f"{'them' if len(nominal) > 1 else 'it'}" if nominal else "")
    return {"alternate_ring_all_reduce": facts.covered(checks_frame,
                                                 anchor="alternate_ring_all_reduce"),
            **{problem: facts.covered(checks_frame, anchor=problem, how=how)
               for problem in ("data_parallel_calcs", "fsdp_calcs", "tp_calcs",
                               "fsdp_tp_calcs")}}


def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    """Tables and the figure at `outputs`; returns the section's facts."""
    hw = hardware(records, options["nominal"])
    sizes = sorted(options["sizes"], key=list(MODEL_SIZES).index)      # smallest first
    batch_tokens, devices = options["batch_tokens"], options["devices"]
    limit_rows = [limits(s, batch_tokens, hw) for s in sizes]
    time_rows = [times(s, batch_tokens, devices, hw) for s in sizes]
    check_facts, collectives, flops = checks(records["checks"][0])
    tables.write_table(_flat(limit_rows), outputs["limits_table"])
    tables.write_table(_flat(time_rows), outputs["times_table"])
    tables.write_table(collectives, outputs["collectives_table"])
    tables.write_table(flops, outputs["flops_table"])
    ratio_figure(sizes, batch_tokens, hw, outputs["ratio_figure"])

    largest = limit_rows[-1]
    nominal_hw = {**hw, "C": {"value": hw["nominal"]["flop_per_s"]},
                  "W": {"value": hw["nominal"]["egress_bytes_per_s"]}}
    checks_frame = tables.records_frame(records["checks"]).drop(columns=["env_device", "env_gpu"],
                                                        errors="ignore")
    return {
        "env": tables.env_summary(checks_frame, *_provenance_env(hw)),
        "coverage": coverage(checks_frame, hw),
        "hardware": hw,
        "batch_tokens": batch_tokens,
        "devices": devices,
        "value_bytes": par.VALUE_BYTES,
        "formulas": copy.deepcopy(formulas()),
        "limits": limit_rows,
        "limits_table": tables.to_markdown(_limits_display(limit_rows)),
        "times_table": tables.to_markdown(_times_display(time_rows)),
        "largest_size": largest,
        # independent of the model size: the batch-splitting strategies' bound, and the batch
        # per device it leaves
        "batch_split_limit": largest["data parallel backward"],
        "tokens_per_device_at_limit": batch_tokens / largest["data parallel backward"],
        "tp_range": {"min": min(r["tensor parallel forward"] for r in limit_rows),
                     "max": max(r["tensor parallel forward"] for r in limit_rows),
                     "smallest": limit_rows[0]["size"], "largest": largest["size"]},
        "sequential_share": {"min": min(r["sequential_over_overlapped"] for r in limit_rows),
                             "max": max(r["sequential_over_overlapped"] for r in limit_rows)},
        "nominal_limits": limits(largest["size"], batch_tokens, nominal_hw)
        if not hw["all_nominal"] else None,
        "checks": check_facts,
        "figure": outputs["ratio_figure"],
    }
