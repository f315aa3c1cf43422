"""Collectives in a profiler trace: how much of their time ran under compute, and whether each of
FSDP's all-gathers finished before its layer could start.

`profile_steps` runs a few training steps under the profiler, each phase in a range of its
name, and reads rank 0's trace back into `overlap_metrics`: the time during which a collective
kernel ran (overlapping calls counted once), the time any other device work ran, the time both
ran at once, and the last step's timeline. `gather_timing` reads FSDP's ranges
(`fsdp.all_gather <weight>`, `fsdp.forward <module>`) from a CUDA trace. The numbers are
computed where the trace is, so that a report needs only the record (traces stay out of git).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import torch

from cs336_systems.measure.intervals import intersection, length, union
from cs336_systems.measure.profiling import (
    capture,
    device_work,
    export_trace,
    load_trace,
)
from cs336_systems.measure.timing import time_phases

# Steps profiled after the timed ones: the collective busy time and rank 0's trace cover them.
PROFILE_STEPS = 2
# NCCL's kernels by the names its versions give them: ncclKernel_* (up to 2.18),
# ncclDevKernel_* (2.19 on: ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclDevKernel_Broadcast_...),
# ncclSymkDevKernel_* (2.27 on, symmetric-memory kernels). The name says little about the
# operation (one kernel may run several); that it is NCCL's is all this needs.
NCCL_KERNEL = re.compile(r"^nccl\w*kernel", re.IGNORECASE)
# Merging compute intervals closer than this (ms) keeps a step's timeline a few hundred
# intervals long; at 400 ms per step it is far below what a figure resolves.
TIMELINE_GAP_MS = 0.1
# The profiler ranges that `gather_timing` reads, each followed by a space and a weight's or a
# module's name: FSDP (`distributed.fsdp`) opens one around each weight's all-gather and one
# around each sharded module's forward.
GATHER_RANGE = "fsdp.all_gather"
FORWARD_RANGE = "fsdp.forward"

def is_collective(name: str) -> bool:
    """The events that do the communication: NCCL's kernels on GPUs (not the `nccl:all_reduce`
    annotations around their launch, which are not device time), gloo's operations on CPUs."""
    return bool(NCCL_KERNEL.match(name)) or name.startswith("gloo:")


def _annotated(name: str, fn):
    def run():
        with torch.profiler.record_function(name):
            fn()
    return run


def _ms(intervals, origin: float) -> list[list[float]]:
    return [[round((s - origin) / 1e3, 3), round((e - origin) / 1e3, 3)] for s, e in intervals]


def overlap_metrics(events: list[dict], steps: int, phases: list[str]) -> dict:
    """From a trace of `steps` steps whose phases ran inside ranges named `phases`: the
    collective, compute and overlapping time per step, and the last step's timeline."""
    _, work = device_work(events)
    collective = [(e["ts"], e["ts"] + e["dur"], e["ts"]) for e in events
                  if e.get("ph") == "X" and is_collective(e["name"])]
    if not collective:
        names = sorted({w["name"] for w in work})[:8]
        raise RuntimeError(f"the profile of {steps} steps has no collective: is_collective "
                           f"matches none of its events (device work such as {names})")
    compute = [(w["ts"], w["ts"] + w["us"], w["launched_at"] or w["ts"]) for w in work
               if not is_collective(w["name"])]
    c_spans, k_spans = [i[:2] for i in collective], [i[:2] for i in compute]
    busy, hidden = length(c_spans), length(intersection(c_spans, k_spans))
    metrics = {"collective_busy_ms_per_step": busy / 1e3 / steps,
               "compute_busy_ms_per_step": length(k_spans) / 1e3 / steps,
               "collective_hidden_ms_per_step": hidden / 1e3 / steps,
               "collective_hidden_fraction": hidden / busy if busy > 0 else None}

    # The last step: what was launched (or, for gloo's annotations, began) after its first
    # phase began on the host.
    ranges = [e for e in events if e.get("cat") == "user_annotation" and e["name"] in phases]
    begun = max((e["ts"] for e in ranges if e["name"] == phases[0]), default=None)
    if begun is None:
        return metrics
    last_c = [i[:2] for i in collective if i[2] >= begun]
    last_k = [i[:2] for i in compute if i[2] >= begun]
    origin = min(s for s, _ in last_c + last_k)
    spans = {}
    for e in ranges:
        if e["ts"] >= begun:
            inside = [i[:2] for i in collective + compute
                      if e["ts"] <= i[2] < e["ts"] + e["dur"]]
            if inside:
                spans[e["name"]] = _ms([(min(s for s, _ in inside), max(t for _, t in inside))],
                                       origin)[0]
    gap = TIMELINE_GAP_MS * 1e3
    metrics["timeline"] = {
        "step_ms": round((max(t for _, t in last_c + last_k) - origin) / 1e3, 3),
        "compute": _ms(union(last_k, gap), origin),
        "collective": _ms(union(last_c, gap), origin),
        "phases": spans}
    return metrics


def profile_steps(phases, device: torch.device, trace: str | None, rank: int) -> dict:
    """PROFILE_STEPS steps under the profiler; rank 0's trace (at `trace`, if given) read back
    into `overlap_metrics` (every rank runs the steps, only rank 0 reads)."""
    names = [name for name, _ in phases]
    with capture(device) as prof:
        time_phases([(name, _annotated(name, fn)) for name, fn in phases], device, 0,
                    PROFILE_STEPS)
    metrics = {"profile_steps": PROFILE_STEPS}
    if rank != 0:
        return metrics
    with tempfile.TemporaryDirectory() as tmp:
        path = export_trace(prof, trace or Path(tmp) / "rank0.trace.json.gz")
        metrics.update(overlap_metrics(load_trace(path), PROFILE_STEPS, names))
    if trace:
        metrics["trace_file"] = Path(trace).name
    return metrics


def gather_timing(events: list[dict], weights_of: dict[str, list[str]]) -> list[dict]:
    """For each forward use of a sharded layer in a CUDA trace, in order: when its all-gather
    ran and whether it finished before the layer could start.

    `weights_of` maps a module's name to the names of its sharded weights (FSDP's ranges
    `fsdp.forward <module>` and `fsdp.all_gather <weight>`). The layer could start (`ready`)
    when the compute stream finished the kernel before the layer's first one, or when that
    kernel was launched, whichever is later; the gather is hidden if its last kernel ended by
    then, and otherwise the stream waited `wait_us` for it. Times in microseconds from the
    trace's first gather. Empty on a trace without CUDA kernels.
    """
    kind, work = device_work(events)
    if kind != "cuda kernels":
        return []
    collectives = sorted((w for w in work if is_collective(w["name"])),
                         key=lambda w: w["ts"])
    compute = sorted((w for w in work if not is_collective(w["name"])
                      and w["launched_at"] is not None), key=lambda w: w["ts"])
    spans = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and e["name"].startswith((f"{GATHER_RANGE} ", f"{FORWARD_RANGE} "))),
                   key=lambda e: e["ts"])
    gathers: dict[str, dict] = {}  # weight -> its latest gather range so far
    rows = []
    for span in spans:
        label, _, name = span["name"].partition(" ")
        if label == GATHER_RANGE:
            gathers[name] = span
            continue
        issued = [gathers.get(weight) for weight in weights_of.get(name, [])]
        if not issued or None in issued:
            continue  # a unit without sharded weights, or its gather before the trace began
        inside = [w for w in compute
                  if span["ts"] <= w["launched_at"] <= span["ts"] + span["dur"]]
        launched = [w for g in issued for w in collectives if _launched_in(w, g)]
        if not inside or not launched:
            continue
        first = min(inside, key=lambda w: w["ts"])
        before = max((w["ts"] + w["us"] for w in compute if w["ts"] < first["ts"]),
                     default=first["launched_at"])
        ready = max(first["launched_at"], before)
        gather_end = max(w["ts"] + w["us"] for w in launched)
        rows.append({"layer": name, "issued": min(g["ts"] for g in issued),
                     "gather_start": min(w["ts"] for w in launched), "gather_end": gather_end,
                     "ready": ready, "forward_start": first["ts"],
                     "hidden": gather_end <= ready, "wait_us": max(0.0, gather_end - ready)})
    origin = rows[0]["issued"] if rows else 0.0
    for row in rows:
        for key in ("issued", "gather_start", "gather_end", "ready", "forward_start"):
            row[f"{key}_us"] = row.pop(key) - origin
    return rows


def _launched_in(kernel: dict, span: dict) -> bool:
    at = kernel["launched_at"]
    return at is not None and span["ts"] <= at <= span["ts"] + span["dur"]


def summarize_gathers(rows: list[dict], steps: int) -> dict:
    """The gather timing's summary: uses, how many were hidden, the exposed wait per step, and
    the rows of the last profiled step (the record keeps those)."""
    if not rows:
        return {}
    per_step = len(rows) // steps if len(rows) % steps == 0 else len(rows)
    last = rows[-per_step:]
    origin = last[0]["issued_us"]  # times from the last step's first gather
    last = [{k: v - origin if k.endswith("_us") and k != "wait_us" else v
             for k, v in row.items()} for row in last]
    return {"gather_uses_per_step": per_step,
            "gathers_hidden": sum(r["hidden"] for r in rows),
            "gathers_profiled": len(rows),
            "gather_wait_ms_per_step": sum(r["wait_us"] for r in rows) / 1e3 / steps,
            "gather_wait_ms_max": max(r["wait_us"] for r in rows) / 1e3,
            "gather_timing": last}
