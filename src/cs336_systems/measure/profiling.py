"""Capturing torch.profiler traces: the one place jobs start the profiler and write a trace.

    with capture(device) as prof:
        time_phases(phases, device, 0, steps)
    export_trace(prof, "results/.../x.trace.json.gz")   # open in ui.perfetto.dev

CPU activity always; CUDA activity on a CUDA device. `record_function` ranges inside the
captured code appear in the trace (and as NVTX ranges under Nsight Systems).

    events = load_trace("x.trace.json.gz")
    kernel_table(events, {"phase": STEP_RANGES})   # device time by kernel and range
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


def activities(device: torch.device | str) -> list[ProfilerActivity]:
    cuda = [ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else []
    return [ProfilerActivity.CPU, *cuda]


@contextmanager
def capture(device: torch.device | str, **options):
    """A torch.profiler session over the block; `options` go to `torch.profiler.profile`."""
    with profile(activities=activities(device), **options) as prof:
        yield prof


def export_trace(prof, path: str | Path) -> Path:
    """The Chrome/Perfetto trace of `prof`, gzipped, at `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
    return path


# --- Reading a trace: where device time went, by kernel and by named range -------------------

# cuBLAS/cuBLASLt (gemm, gemv, Hopper's nvjet and xmma), CUTLASS, and on a CPU trace the ATen
# matmul ops: what counts as a matrix multiply in the kernel tables.
MATMUL = re.compile(r"gemm|gemv|nvjet|xmma|cutlass|cublas|^aten::(mm|bmm|addmm|baddbmm|_mm)$",
                    re.IGNORECASE)
# Trace categories of device work: on CUDA kernels, copies and fills; a CPU trace has none.
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def is_matmul(kernel: str) -> bool:
    return bool(MATMUL.search(kernel))


def trace_events(prof) -> list[dict]:
    """The events of a finished profiler session, for a job that reads its trace and keeps no
    file (written to a temporary folder and read back: the Chrome trace is the one form in
    which kernels carry their launches' correlation ids)."""
    with tempfile.TemporaryDirectory() as tmp:
        return load_trace(export_trace(prof, Path(tmp) / "trace.json.gz"))


def load_trace(path: str | Path) -> list[dict]:
    """The events of a trace written by `export_trace` (or an uncompressed one)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _cpu_self_times(events: list[dict]) -> list[dict]:
    """CPU ops with their self time (their duration less their child ops'): on a CPU-only
    trace, the analogue of kernels, as an op like aten::mm does its work itself."""
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and "dur" in e),
                 key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    items, stack = [], []  # stack: the open ops of the current thread, innermost last
    for op in ops:
        while stack and (stack[-1][0]["tid"] != op["tid"]
                         or op["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]):
            stack.pop()
        item = {"name": op["name"], "ts": op["ts"], "us": op["dur"], "launched_at": op["ts"]}
        if stack:
            stack[-1][1]["us"] -= op["dur"]
        stack.append((op, item))
        items.append(item)
    return items


def device_work(events: list[dict]) -> tuple[str, list[dict]]:
    """What took device time, each as {"name", "ts", "us", "launched_at"}: CUDA kernels, copies
    and fills with the CPU time of their launch (joined on the runtime call's correlation id),
    or on a trace without any, the CPU ops' self times at their own start. The first item says
    which."""
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES and "dur" in e]
    if not device:
        return "cpu ops", _cpu_self_times(events)
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}
    return "cuda kernels", [{"name": e["name"], "ts": e["ts"], "us": e["dur"],
                             "launched_at": launches.get(e.get("args", {}).get("correlation"))}
                            for e in device]


class _Ranges:
    """The intervals of a set of (non-overlapping) range names, for "which one holds time t"."""

    def __init__(self, events: list[dict], names: Sequence[str]):
        spans = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                       if e.get("cat") == "user_annotation" and e["name"] in names)
        self.starts = [s for s, _, _ in spans]
        self.spans = spans

    def at(self, t: float | None) -> str:
        if t is None:
            return ""
        i = bisect.bisect_right(self.starts, t) - 1
        return self.spans[i][2] if i >= 0 and t < self.spans[i][1] else ""


def kernel_table(events: list[dict], levels: dict[str, Sequence[str]]) -> list[dict]:
    """Device time by (kernel, range at each level): rows {"kernel", <level>: range name or "",
    "calls", "us", "matmul"}, totals over the whole trace, largest first. `levels` maps a level
    name to its range names, e.g. {"phase": STEP_RANGES, "part": ATTENTION_PARTS}; a kernel
    belongs to the range that was open when it was launched."""
    _, work = device_work(events)
    ranges = {level: _Ranges(events, names) for level, names in levels.items()}
    totals: dict[tuple, list[float]] = {}
    for item in work:
        key = (item["name"], *(r.at(item["launched_at"]) for r in ranges.values()))
        calls_us = totals.setdefault(key, [0, 0.0])
        calls_us[0] += 1
        calls_us[1] += item["us"]
    rows = [{"kernel": key[0], **dict(zip(levels, key[1:])), "calls": calls, "us": us,
             "matmul": is_matmul(key[0])} for key, (calls, us) in totals.items()]
    return sorted(rows, key=lambda r: -r["us"])


def range_times(events: list[dict], names: Sequence[str]) -> dict[str, dict]:
    """Per range name, totals over the trace: how often it ran, its CPU wall time (`cpu_us`),
    and its device span (`device_us`): for each run of the range, from the start of the first
    kernel launched inside it to the end of the last, whichever thread launched them (backward
    runs on autograd's own thread). On a CPU trace the span is that of its ops."""
    _, work = device_work(events)
    work = sorted((w for w in work if w["launched_at"] is not None),
                  key=lambda w: w["launched_at"])
    launches = [w["launched_at"] for w in work]
    out = {}
    for name in names:
        runs = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == name]
        if not runs:
            continue
        span = 0.0
        for run in runs:
            inside = work[bisect.bisect_left(launches, run["ts"]):
                          bisect.bisect_left(launches, run["ts"] + run["dur"])]
            if inside:
                span += (max(w["ts"] + w["us"] for w in inside)
                         - min(w["ts"] for w in inside))
        out[name] = {"calls": len(runs), "cpu_us": sum(e["dur"] for e in runs),
                     "device_us": span}
    return out


def profiled_steps(events: list[dict]) -> int:
    """Steps the profiler's schedule recorded (its ProfilerStep#N ranges)."""
    return sum(1 for e in events if e.get("cat") == "user_annotation"
               and e["name"].startswith("ProfilerStep#"))


# --- A step's device time by class of kernel ---------------------------------------------------

# The classes, first match wins. Inductor's generated pointwise and reduction kernels go to
# "elementwise" before anything else: their names list the ops they fused (a RoPE kernel beside
# attention is called "..._scaled_dot_product_cudnn_attention_..."). Attention: cuDNN's fused
# attention and its helpers, SDPA's flash and memory-efficient kernels, our FlashAttention (the
# Triton FA2's flash_* kernels, the Gluon ones' attention_*).
KERNEL_CLASSES: tuple[tuple[str, re.Pattern], ...] = (
    ("elementwise", re.compile(r"^triton_(poi|red|per)_")),
    ("attention", re.compile(r"sdpa|fmha|flash|cudnn|scaled_dot_product|^attention_(fwd|dq|dkdv"
                             r"|delta)_", re.IGNORECASE)),
    ("matmul", MATMUL),
    ("optimizer", re.compile(r"adam", re.IGNORECASE)),
    ("communication", re.compile(r"nccl", re.IGNORECASE)),
)
COPY_CLASS = "copies"       # memcpy and memset on the device
OTHER_CLASS = "elementwise"  # whatever matches no class: elementwise and reduction kernels


def kernel_class(name: str) -> str:
    for label, pattern in KERNEL_CLASSES:
        if pattern.search(name):
            return label
    return OTHER_CLASS


def time_by_class(events: list[dict]) -> dict[str, float]:
    """Device time of a CUDA trace in ms: each kernel class's summed kernel time
    (`KERNEL_CLASSES`, copies apart), "busy" (the union of every kernel's interval: kernels of
    several streams that overlap count once) and "span" (first kernel's start to last one's
    end); "idle" is span minus busy. Empty for a trace without device work."""
    device = sorted((e for e in events if e.get("cat") in DEVICE_CATEGORIES and "dur" in e),
                    key=lambda e: e["ts"])
    if not device:
        return {}
    out: dict[str, float] = {}
    busy, covered_to = 0.0, device[0]["ts"]
    for e in device:
        label = kernel_class(e["name"]) if e["cat"] == "kernel" else COPY_CLASS
        out[label] = out.get(label, 0.0) + e["dur"] / 1e3
        start, end = max(e["ts"], covered_to), e["ts"] + e["dur"]
        if end > start:
            busy += end - start
        covered_to = max(covered_to, end)
    span = (covered_to - device[0]["ts"]) / 1e3
    out.update(busy=busy / 1e3, span=span, idle=span - busy / 1e3)
    return out
