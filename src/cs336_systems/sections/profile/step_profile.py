"""Where one LM step's time goes, by kernel and by named range, under torch.profiler or Nsight
Systems (the CLI: `profile_step`)."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import schedule

from cs336_systems.lm.attention import ATTENTION_PARTS, attention_part_flops
from cs336_systems.lm.build import build_lm_step
from cs336_systems.lm.model import MODEL_SIZES, count_parameters, forward_flops
from cs336_systems.lm.step import STEP_RANGES
from cs336_systems.measure.memory import peak_gib, reset_peak
from cs336_systems.measure.profiling import (
    capture,
    device_work,
    export_trace,
    is_matmul,
    kernel_table,
    load_trace,
    profiled_steps,
    range_times,
)
from cs336_systems.measure.timing import time_phases
from cs336_systems.pipeline.records import Skip

TOOLS = ("torch", "nsys")
# The NVTX range around the measured steps, where an Nsight Systems capture starts and stops.
MEASURED_RANGE = "measured"
RANGES = STEP_RANGES + ATTENTION_PARTS


def attention_flops(config: dict) -> dict[str, int]:
    """FLOPs of each attention part in one forward pass, all layers."""
    spec = MODEL_SIZES[config["size"]]
    per_layer = attention_part_flops(config["batch_size"] * spec.num_heads,
                                     config["context_length"], spec.d_model // spec.num_heads)
    return {part: spec.num_layers * flops for part, flops in per_layer.items()}


def harness_metrics(times, prefix: str = "") -> dict:
    return {prefix + k: v for k, v in times.metrics().items() if "warmup" not in k}


def measure_torch(config: dict, device: torch.device) -> dict:
    model, phases = build_lm_step(config, device)
    reset_peak(device)
    times = time_phases(phases, device, config["warmup_steps"], config["measure_steps"])
    steps = config["measure_steps"]
    # The schedule's own warm-up step is traced and thrown away: what a profiler costs on its
    # first step stays out of the kernel table.
    with capture(device, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1)) as prof:
        profiled = time_phases(phases, device, 1, steps, after_step=prof.step)
    trace = export_trace(prof, config["trace"])
    events = load_trace(trace)
    kind, _ = device_work(events)
    return {
        "parameters": count_parameters(model),
        **harness_metrics(times),
        **harness_metrics(profiled, prefix="profiled_"),
        "peak_gib": peak_gib(device),
        "tool": "torch.profiler",
        "device_work": kind,
        "profiled_steps": profiled_steps(events),
        "kernels": kernel_table(events, {"phase": STEP_RANGES, "part": ATTENTION_PARTS}),
        "ranges": range_times(events, RANGES),
        "attention_flops": attention_flops(config),
        "model_flops_per_step": forward_flops(config["size"], config["batch_size"],
                                              config["context_length"])
        * (1 if config["mode"] == "forward" else 3),
        "trace_file": trace.name,
    }


def run_under_nsys(config: dict, device: torch.device) -> None:
    """The steps an Nsight Systems capture sees: warm-up outside, measured steps inside the NVTX
    range `measured`, every record_function range also an NVTX range."""
    _, phases = build_lm_step(config, device)
    if config["warmup_steps"]:
        time_phases(phases, device, 0, config["warmup_steps"])
    with torch.autograd.profiler.emit_nvtx(record_shapes=False):
        torch.cuda.nvtx.range_push(MEASURED_RANGE)
        time_phases(phases, device, 0, config["measure_steps"])
        torch.cuda.synchronize(device)
        torch.cuda.nvtx.range_pop()


def nsys_command(report: Path, argv: list[str]) -> list[str]:
    """`nsys profile` over this module run with `argv` and --under-nsys, captured from the start
    of the NVTX range `measured` to its end."""
    return ["nsys", "profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none",
            "--capture-range=nvtx", f"--nvtx-capture={MEASURED_RANGE}",
            "--capture-range-end=stop", "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0",
            "--force-overwrite=true", f"--output={report}",
            sys.executable, "-m", "cs336_systems.sections.profile.profile_step", *argv, "--under-nsys"]


def read_kernel_summary(text: str) -> list[dict]:
    """`nsys stats --report cuda_gpu_kern_sum --format csv` -> kernel rows like kernel_table's
    (no ranges: the summary has none), largest first."""
    start = text.find('"Time') if '"Time' in text else text.find("Time")
    if start < 0:
        raise ValueError("no kernel summary table in nsys stats output:\n" + text[:500])
    rows = [{"kernel": row["Name"], "phase": "", "part": "", "calls": int(row["Instances"]),
             "us": float(row["Total Time (ns)"]) / 1e3, "matmul": is_matmul(row["Name"])}
            for row in csv.DictReader(io.StringIO(text[start:]))]
    return sorted(rows, key=lambda r: -r["us"])


def measure_nsys(config: dict, device: torch.device, argv: list[str]) -> dict:
    if device.type != "cuda":
        raise Skip("Nsight Systems profiles CUDA work; this job runs on the CPU")
    if shutil.which("nsys") is None:
        raise Skip("nsys (Nsight Systems) is not on the PATH of this machine; the torch.profiler "
                   "records answer nsys_profile")
    report = Path(config["trace"])
    report.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(nsys_command(report.with_suffix(""), argv), check=True)  # nsys adds .nsys-rep
    with tempfile.TemporaryDirectory() as tmp:
        stats = subprocess.run(["nsys", "stats", "--report", "cuda_gpu_kern_sum", "--format",
                                "csv", "--force-export=true", "--output", "-", str(report)],
                               cwd=tmp, check=True, capture_output=True, text=True).stdout
    return {"tool": "nsys", "device_work": "cuda kernels",
            "profiled_steps": config["measure_steps"], "kernels": read_kernel_summary(stats),
            "attention_flops": attention_flops(config), "trace_file": report.name}
