"""Distributed data parallel (§5) and sharding (§6): tables, figures and the section's facts.

`build(records, options, outputs)` reads the all-reduce, DDP (and the DDP check against
single-process training), sharded-optimizer and communication-accounting records, writes their
tables (CSV) and three figures, and returns the facts that `template.md.j2` turns
into the section: every number, ratio and verdict of the prose is computed here. The DDP
overlap figure and numbers come from the records alone: the experiment reduced rank 0's trace
to them on the GPU machine (the traces stay out of git). `options["assignment"]` is the assignment's own matrix
(the config's `defaults.distributed`): what of it this preset leaves out goes into the coverage
notes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from cs336_systems.distributed.launch import backend_for
from cs336_systems.distributed.variants import DDP_VARIANTS
from cs336_systems.report import tables
from cs336_systems.report.facts import covered, jsonable
from cs336_systems.sections.distributed.allreduce_table import (
    allreduce_facts,
    allreduce_figure,
    allreduce_table,
)
from cs336_systems.sections.distributed.ddp_table import (
    ddp_facts,
    ddp_figure,
    ddp_table,
    edition_name,
    overhead_facts,
    overlap_figure,
    sizes_of,
    timelines,
)
from cs336_systems.sections.distributed.sharding_table import (
    accounting_facts,
    accounting_table,
    check_facts,
    memory_per_rank,
    sharded_facts,
    sharded_table,
)

# The assignment's DDP and sharding runs are on GPUs: the backend a CUDA device gets.
GPU_BACKEND = backend_for("cuda")


def _sizes(values) -> str:
    """[2, 4] -> '2 and 4'; [1, 10, 100] -> '1, 10 and 100'; names as they are."""
    items = [f"{v:g}" if isinstance(v, (int, float)) else str(v) for v in values]
    return " and ".join(items) if len(items) < 3 else ", ".join(items[:-1]) + " and " + items[-1]


def _setup_gap(rows: pd.DataFrame, assignment: dict) -> str:
    """How the runs' setup differs from the assignment's (`assignment`: its `ddp` matrix, the
    model `sizes`, or `sharded_optimizer` matrix, one `size`, on `world_size` GPUs), or ''."""
    ok = rows[rows["status"] == "ok"]
    if ok.empty:
        return ""
    first = ok.iloc[0]
    asked = assignment["sizes"] if "sizes" in assignment else [assignment["size"]]
    measured = sizes_of(ok)
    if (set(measured) <= set(asked) and int(first["world_size"]) == assignment["world_size"]
            and first["backend"] == GPU_BACKEND):
        return _missing_values([edition_name(a) for a in asked],
                               [edition_name(m) for m in measured], "no {} runs in this preset")
    return (f"measured with the {_sizes(measured)} model on {int(first['world_size'])} ranks "
            f"({first['backend']}), not {_sizes(asked)} on {assignment['world_size']} GPUs "
            f"({GPU_BACKEND})")


def _missing_values(asked, measured, sentence: str) -> str:
    """`sentence` (with {} for the values) naming what the assignment asks and no run
    measured, or ''."""
    absent = [v for v in asked if v not in set(measured)]
    return sentence.format(_sizes(absent)) if absent else ""


def _notes(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def coverage(allreduce: pd.DataFrame, ddp: pd.DataFrame, sharded: pd.DataFrame,
             accounting: pd.DataFrame, ddp_facts_: dict, overhead: dict,
             sharded_facts_: dict, check: pd.DataFrame, check_facts_: dict | None,
             assignment: dict) -> dict:
    """What this section answers of §5 and §6, by the assignment's problem keys; `assignment`
    is its matrix (the config's `defaults.distributed`)."""
    asked_allreduce, asked_ddp = assignment["allreduce"], assignment["ddp"]
    asked_sharded = assignment["sharded_optimizer"]
    ok_allreduce = allreduce[allreduce["status"] == "ok"]
    variant = {name: ddp[ddp["variant"] == name] for name in DDP_VARIANTS}
    naive_flat = ddp[ddp["variant"].isin(["naive", "flat"])]
    ok_bucketed = variant["bucketed"][variant["bucketed"]["status"] == "ok"]
    overlap_ok = variant["overlap"][variant["overlap"]["status"] == "ok"]
    busy = ddp_facts_["collective_busy_missing"]
    overlap_setup = ddp[ddp["variant"].isin(["naive", "flat", "overlap"])]
    return {
        "distributed_communication_single_node": covered(
            allreduce, anchor="distributed_communication_single_node", missing=_notes(
                _missing_values(asked_allreduce["backends"], ok_allreduce["backend"],
                                "no {} runs in this preset"),
                _missing_values(asked_allreduce["world_sizes"], ok_allreduce["world_size"],
                                "no runs with {} processes in this preset"),
                _missing_values(asked_allreduce["sizes_mb"], ok_allreduce["size_mb"],
                                "no {} MB tensors in this preset"))),
        "naive_ddp": covered(
            check if len(check) else None, anchor="naive_ddp",
            how="" if len(check) else "by the test-suite (tests/distributed/test_training.py)",
            missing="" if check_facts_ and check_facts_["all_close"] else
            "no ddp_check record in this run" if not len(check) else
            "its training does not match single-process training"),
        "naive_ddp_benchmarking": covered(variant["naive"], anchor="naive_ddp_benchmarking",
                                          missing=_setup_gap(variant["naive"], asked_ddp)),
        "minimal_ddp_flat_benchmarking": covered(naive_flat,
                                                 anchor="minimal_ddp_flat_benchmarking",
                                                 missing=_setup_gap(naive_flat, asked_ddp)),
        "ddp_overlap_individual_parameters": covered(
            variant["overlap"], anchor="ddp_overlap_individual_parameters"),
        "ddp_overlap_individual_parameters_benchmarking": covered(
            overlap_setup, anchor="ddp_overlap_individual_parameters_benchmarking",
            missing=_notes(
                _setup_gap(overlap_setup, asked_ddp),
                f"collective busy time is n/a for {len(busy)} of "
                f"{int((ddp['status'] == 'ok').sum())} runs (their records have no such metric)"
                if busy else "",
                "no profiler trace of the overlap variant"
                if len(overlap_ok) and overlap_ok["trace_file"].isna().all() else "")),
        "ddp_overlap_bucketed": covered(variant["bucketed"], anchor="ddp_overlap_bucketed"),
        "ddp_bucketed_benchmarking": covered(
            variant["bucketed"], anchor="ddp_bucketed_benchmarking", missing=_notes(
                _setup_gap(variant["bucketed"], asked_ddp),
                _missing_values(asked_ddp["bucket_sizes_mb"], ok_bucketed["bucket_size_mb"],
                                "no {} MiB buckets in this preset"),
                "" if overhead["available"]
                else f"the overhead model is not checked: it needs {overhead['needs']}")),
        "communication_accounting": covered(accounting, anchor="communication_accounting"),
        "optimizer_state_sharding": covered(sharded[sharded["sharded"] == True],  # noqa: E712
                                            anchor="optimizer_state_sharding"),
        "optimizer_state_sharding_accounting": covered(
            sharded, anchor="optimizer_state_sharding_accounting", missing=_notes(
                _setup_gap(sharded, asked_sharded),
                "" if sharded_facts_["available"]
                else "needs both the sharded and the replicated run to compare",
                f"no allocator peaks (init, up to the step, the step): "
                f"{sharded_facts_['no_readings_because']}; only the breakdown from the tensors"
                if sharded_facts_["available"] and not sharded_facts_["has_memory_readings"]
                else "")),
    }


def build(records: dict[str, list[str]], options: dict, outputs: dict[str, str]) -> dict:
    """Tables and figures at `outputs`; returns the section's facts. options: assignment, the
    assignment's matrix (the config's `defaults.distributed`)."""
    allreduce = allreduce_table(records["allreduce"])
    ddp = ddp_table(records["ddp"])
    sharded = sharded_table(records["sharded"])
    check = tables.records_frame(records.get("ddp_check", []))
    accounting = accounting_table(records["accounting"])
    tables.write_table(allreduce, outputs["allreduce_table"])
    tables.write_table(ddp, outputs["ddp_table"])
    tables.write_table(sharded, outputs["sharded_table"])
    tables.write_table(accounting, outputs["accounting_table"])
    allreduce_figure(allreduce, outputs["allreduce_figure"])
    ddp_figure(ddp, outputs["ddp_figure"])
    overlap_figure(ddp, timelines(records["ddp"]), outputs["overlap_figure"])

    ddp_f = ddp_facts(ddp)
    overhead = overhead_facts(ddp, allreduce)
    sharded_f = sharded_facts(sharded, memory_per_rank(records["sharded"]))
    check_f = check_facts(records.get("ddp_check", []))
    # The accounting is arithmetic on the CPU: its device would only blur the header.
    accounting_env = accounting.drop(columns=["env_device", "env_gpu"], errors="ignore")
    return jsonable({
        "env": tables.env_summary(allreduce, ddp, sharded, accounting_env),
        "coverage": coverage(allreduce, ddp, sharded, accounting, ddp_f, overhead, sharded_f,
                             check, check_f, options["assignment"]),
        "check": check_f,
        "allreduce": allreduce_facts(allreduce),
        "ddp": ddp_f,
        "overhead": overhead,
        "sharded": sharded_f,
        "accounting": accounting_facts(accounting),
        "figures": {"allreduce": outputs["allreduce_figure"], "ddp": outputs["ddp_figure"],
                    "overlap": outputs["overlap_figure"]},
        # rank 0's profiler traces lie beside the DDP records (one folder per model size)
        "trace_dir": os.path.commonpath([str(Path(r).parent) for r in records["ddp"]])
        if records["ddp"] else None,
    })
