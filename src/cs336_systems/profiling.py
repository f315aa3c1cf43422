"""Capturing torch.profiler traces: the one place jobs start the profiler and write a trace.

    with capture(device) as prof:
        time_phases(phases, device, 0, steps)
    export_trace(prof, "results/.../x.trace.json.gz")   # open in ui.perfetto.dev

CPU activity always; CUDA activity on a CUDA device. `record_function` ranges inside the
captured code appear in the trace (and as NVTX ranges under Nsight Systems).
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
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
