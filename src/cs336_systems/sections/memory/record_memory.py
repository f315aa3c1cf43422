"""memory_profiling (assignment §1.5): the CUDA caching allocator's history over measured steps of
one model configuration, and what it says: peaks, the stage of the peak, the largest allocations
and the lines of this project that made them, what is live at the peak.

    python -m cs336_systems.sections.memory.record_memory --size 2.7b --context-length 512 \
        --mode train-step --precision bf16 --output r.json

The job runs the warm-up steps first, outside the recording (the optimizer state exists from the
first step on), then records the allocator's history (`torch.cuda.memory._record_memory_history`,
Python stacks) over `--measure-steps` steps run through the timing harness with each phase's start
noted, takes the snapshot and stops recording. Beside the record, named after it:

    <record>.snapshot.pickle.gz   the snapshot (gunzip it for pytorch.org/memory_viz)   heavy
    <record>.memory_viz.html      torch's own viewer, the snapshot inside (it loads
                                  MemoryViz.js from cdn.jsdelivr.net: needs a network)   heavy
    <record>.timeline.json.gz     the compact timeline (`memory_timeline.Timeline`) that the
                                  section's figures and tables are drawn from            small

Memory history needs the CUDA caching allocator: on a CPU the record is `skipped`.
"""

from __future__ import annotations

import argparse
import gzip
import logging
import pickle
import sys
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
from cs336_systems.pipeline.cli import add_common_arguments, positive_int
from cs336_systems.pipeline.options import add_lm_step_arguments, check_context_length
from cs336_systems.pipeline.records import Skip, run_and_record

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


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_lm_step_arguments(parser, warmup_steps=2, measure_steps=2)
    parser.add_argument("--max-entries", type=positive_int, default=200_000,
                        help="the allocator history's ring buffer: events kept (the oldest "
                             "are dropped beyond it)")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    check_context_length(parser, args)
    config = {k: v for k, v in vars(args).items() if k != "device"}
    return run_and_record("memory", {k: v for k, v in config.items() if k != "output"},
                          args.output, lambda device: measure(config, device), args.device)


if __name__ == "__main__":
    main()
