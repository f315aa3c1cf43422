"""fsdp and fsdp_accounting (§6.2, 2026): this project's FSDP beside torch's FSDP2 and DDP.

    python -m cs336_systems.experiments.fsdp --variant fsdp --size 2.7b --context-length 512 \
        --batch-size 8 --world-size 2 --output r.json [--trace r.trace.json.gz]

Times training steps of the LM (this project's AdamW, the batch split over the ranks) wrapped
in one of `FSDP_VARIANTS`: `fsdp` (cs336_systems.distributed.FSDP), `fsdp2` (torch's
`fully_shard` on each block and on the root: the reference) and `bucketed` (DDPBucketed, every
rank holding everything). Phases as in the DDP benchmark (`communicate` is the exposed wait in
finish_gradient_synchronization). The record has each rank's peak memory, the sharding
breakdown of the model (what FSDP shards and what it keeps whole, in bytes: fsdp_accounting
(a)), and for `fsdp` on CUDA, from a profiler trace of the last steps, each forward use's
all-gather against the moment its layer could have started (fsdp_accounting (b),
`gather_timing`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from cs336_systems.distributed import FSDP, DDPBucketed
from cs336_systems.distributed.fsdp import FORWARD_RANGE, GATHER_RANGE, is_sharded_layer
from cs336_systems.distributed.variants import FSDP_VARIANTS
from cs336_systems.experiments.ddp import (PROFILE_STEPS, add_training_arguments, is_collective,
                                           profile_steps, training_config, training_phases)
from cs336_systems.experiments.torchrun import launch_or_work
from cs336_systems.memory import peak_gib, reset_peak
from cs336_systems.model import build_model
from cs336_systems.profiling import device_work, load_trace
from cs336_systems.timing import PRECISIONS, time_phases

def sharding_breakdown(module: nn.Module) -> dict[str, int]:
    """What FSDP's rule shards of `module` and what it keeps whole: parameters and bytes of
    each (every distinct parameter once, at its own dtype), and the largest sharded weight."""
    sharded = {id(m.weight): m.weight for m in module.modules() if is_sharded_layer(m)}
    whole = [p for p in module.parameters() if id(p) not in sharded]
    return {"sharded_parameters": sum(p.numel() for p in sharded.values()),
            "sharded_bytes": sum(p.numel() * p.element_size() for p in sharded.values()),
            "sharded_weights": len(sharded),
            "replicated_parameters": sum(p.numel() for p in whole),
            "replicated_bytes": sum(p.numel() * p.element_size() for p in whole),
            "largest_sharded_bytes": max((p.numel() * p.element_size()
                                          for p in sharded.values()), default=0)}


def wrap(model: nn.Module, config: dict, device: torch.device) -> nn.Module:
    variant, compute_dtype = config["variant"], PRECISIONS.get(config["compute_dtype"])
    if variant == "fsdp":
        return FSDP(model, compute_dtype=compute_dtype)
    if variant == "bucketed":
        return DDPBucketed(model, config["bucket_size_mb"])
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


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


def work(config: dict, rank: int, world_size: int, device: torch.device) -> dict:
    torch.manual_seed(config["seed"])
    model = build_model(config["size"], config["context_length"], device=device)
    breakdown = sharding_breakdown(model)
    model = wrap(model, config, device)
    autocast = (torch.autocast(device.type, dtype=PRECISIONS[config["compute_dtype"]])
                if config["variant"] == "bucketed" and config["compute_dtype"] else None)
    finish = getattr(model, "finish_gradient_synchronization", lambda: None)
    phases = training_phases(model, config, rank, world_size, device, finish, autocast)
    reset_peak(device)
    times = time_phases(phases, device, config["warmup_steps"], config["measure_steps"])
    metrics = {k: v for k, v in times.metrics().items() if "warmup" not in k}
    peak = peak_gib(device)
    peaks = [None] * world_size
    dist.all_gather_object(peaks, peak)
    metrics.update({"peak_gib": peak, "peak_gib_per_rank": peaks, **breakdown})

    with tempfile.TemporaryDirectory() as tmp:  # rank 0 reads its trace back
        trace = config["trace"] or str(Path(tmp) / "rank0.trace.json.gz")
        metrics.update(profile_steps(phases, device, trace, rank))
        if not config["trace"]:
            metrics.pop("trace_file", None)
        if rank == 0 and config["variant"] == "fsdp":
            rows = gather_timing(load_trace(trace), model.sharded_weights())
            metrics.update(summarize_gathers(rows, PROFILE_STEPS))
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", required=True, choices=list(FSDP_VARIANTS))
    parser.add_argument("--compute-dtype", choices=[p for p in PRECISIONS if p != "fp32"],
                        default=None, help="gather and compute in this dtype (default: fp32)")
    add_training_arguments(parser, size="2.7b", context_length=512, batch_size=8,
                           warmup_steps=2, measure_steps=5)
    config, output, _ = training_config(parser, argv)
    launch_or_work("cs336_systems.experiments.fsdp", "fsdp", config, output, work,
                   config["world_size"], config["backend"],
                   sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
