"""The CUDA caching allocator's history over measured steps, its sidecar files (the pickled
snapshot, memory_viz's page) and what the timeline says (the CLI: `record_memory`)."""

from __future__ import annotations

import gzip
import logging
import pickle
from pathlib import Path

import torch

from cs336_systems.lm.build import build_lm_step
from cs336_systems.lm.model import MODEL_SIZES, count_parameters
from cs336_systems.measure.memory import (
    GIB,
    allocated_gib,
    peak_gib,
    peak_reserved_gib,
    reset_peak,
    tensor_bytes,
)
from cs336_systems.measure.memory_timeline import Timeline, mark_phases, reduce_snapshot
from cs336_systems.measure.timing import synchronize, time_phases
from cs336_systems.paths import PACKAGE_DIR
from cs336_systems.pipeline.records import Skip

log = logging.getLogger("cs336_systems")

# The files beside a record, by what they hold.
SIDECARS = {"snapshot": ".snapshot.pickle.gz", "html": ".memory_viz.html",
            "timeline": ".timeline.json.gz"}


def sidecar(record: str | Path, kind: str) -> Path:
    record = Path(record)
    return record.with_name(record.name.removesuffix(".json") + SIDECARS[kind])


def residual_bytes(config: dict) -> int:
    """One residual-stream activation in fp32: batch x context x d_model x 4 bytes."""
    return config["batch_size"] * config["context_length"] * MODEL_SIZES[config["size"]].d_model * 4


def record_steps(config: dict, device: torch.device, phases) -> tuple[dict, list[dict], dict]:
    """The measured steps under the allocator's history: (harness metrics, phase marks,
    snapshot). Recording stops whatever happens (an out-of-memory included)."""
    marks: list[dict] = []
    torch.cuda.memory._record_memory_history(
        enabled="all", context="alloc", stacks="python", max_entries=config["max_entries"])
    try:
        times = time_phases(mark_phases(phases, marks), device, 0, config["measure_steps"])
        synchronize(device)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return times.metrics(), marks, snapshot


def write_sidecars(snapshot: dict, timeline: Timeline, output: str | Path) -> dict[str, str]:
    """The snapshot (gzipped pickle), torch's HTML viewer and the compact timeline, beside the
    record; returns their names."""
    from torch.cuda._memory_viz import trace_plot

    paths = {kind: sidecar(output, kind) for kind in SIDECARS}
    paths["snapshot"].parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(paths["snapshot"], "wb") as f:
        pickle.dump(snapshot, f)
    paths["html"].write_text(trace_plot(snapshot))
    timeline.save(paths["timeline"])
    return {f"{kind}_file": path.name for kind, path in paths.items()}


def timeline_metrics(timeline: Timeline, config: dict) -> dict:
    """What the record keeps of the timeline: its peak and where it falls, what is live then,
    the largest allocations, the residual-sized ones, and how complete the marks are."""
    peak = timeline.peak()
    residual = timeline.same_size(residual_bytes(config))
    return {
        "trace_peak_gib": peak["bytes"] / GIB,
        "trace_start_gib": timeline.initial_bytes / GIB,
        "peak_event": peak["event"],
        "peak_stage": peak.get("phase"),
        "peak_step": peak.get("step"),
        "live_at_peak": timeline.by_category(timeline.live_at(peak["event"])),
        "largest_allocations": timeline.largest(),
        "residual_bytes": residual["bytes"],
        "residual_block_bytes": residual["block_bytes"],
        "residual_allocations": residual["count"],
        "residual_lines": residual["lines"][:5],
        "events": timeline.events,
        "allocations": int(timeline.made_in_trace().sum()),
        "phases_marked": sum(m["event"] is not None for m in timeline.marks),
        "phase_marks": len(timeline.marks),
    }


def measure(config: dict, device: torch.device) -> dict:
    if device.type != "cuda":
        raise Skip("memory history needs CUDA (torch.cuda.memory._record_memory_history "
                   f"records the CUDA caching allocator); this job runs on the {device.type}")
    model, phases = build_lm_step(config, device)
    if config["warmup_steps"]:
        time_phases(phases, device, 0, config["warmup_steps"])
    synchronize(device)
    start_gib = allocated_gib(device)
    reset_peak(device)
    times, marks, snapshot = record_steps(config, device, phases)
    peak, reserved = peak_gib(device), peak_reserved_gib(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    trace_entries = len(snapshot["device_traces"][index])
    timeline = reduce_snapshot(snapshot, index, marks, PACKAGE_DIR)
    metrics = timeline_metrics(timeline, config)
    log.info("peak %.3f GiB allocated (%.3f GiB in the trace, in the %s), %.3f GiB reserved",
             peak, metrics["trace_peak_gib"], metrics["peak_stage"], reserved)
    return {
        "parameters": count_parameters(model),
        "weights_gib": tensor_bytes(model.parameters()) / GIB,
        "start_gib": start_gib,
        "peak_gib": peak,
        "peak_reserved_gib": reserved,
        **metrics,
        "trace_entries": trace_entries,
        "trace_full": trace_entries >= config["max_entries"],
        **times,
        **write_sidecars(snapshot, timeline, config["output"]),
    }
