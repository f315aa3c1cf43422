"""What the GPU's clock and power did while a job measured: sampled by `nvidia-smi` in the
background, so that a step slower than its FLOPs suggest can say whether the GPU held its clock
or was held back (by its power cap, or by heat).

    with GpuSampler(device) as sampler:
        time_phases(...)
    sampler.metrics()   # {"sm_clock_mhz_median": ..., "power_capped_share": ..., ...} or {}

The sampler reads the device by its UUID, so `CUDA_VISIBLE_DEVICES` renumbering does not matter.
Where nvidia-smi is missing (no NVIDIA driver, a CPU run) it records nothing, and says why.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess

import torch

# nvidia-smi's fields, in the order of its CSV lines
FIELDS = ("clocks.sm", "clocks.max.sm", "power.draw", "power.limit",
          "clocks_throttle_reasons.active")
# Bits of the active clock-event ("throttle") reasons, from NVML's nvmlClocksEventReasons:
# a power limit holds the clock down (software cap or hardware brake), or heat does.
POWER_REASONS = 0x4 | 0x80
THERMAL_REASONS = 0x20 | 0x40
INTERVAL_MS = 100


def parse_samples(text: str) -> list[dict]:
    """nvidia-smi's `--format=csv,noheader,nounits` lines of `FIELDS` as dicts; a line that is
    not whole (the process stopped mid-write) or holds "[N/A]" is dropped."""
    samples = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS):
            continue
        try:
            clock, max_clock, power, limit = (float(p) for p in parts[:4])
            reasons = int(parts[4], 16)
        except ValueError:
            continue
        samples.append({"clock": clock, "max_clock": max_clock, "power": power,
                        "limit": limit, "reasons": reasons})
    return samples


def summarize(samples: list[dict]) -> dict:
    """The samples' medians and the shares held back by power and by heat (empty: {})."""
    if not samples:
        return {}
    n = len(samples)
    return {
        "gpu_samples": n,
        "sm_clock_mhz_median": statistics.median(s["clock"] for s in samples),
        "sm_clock_mhz_max": max(s["max_clock"] for s in samples),
        "power_w_median": statistics.median(s["power"] for s in samples),
        "power_limit_w": max(s["limit"] for s in samples),
        "power_capped_share": sum(bool(s["reasons"] & POWER_REASONS) for s in samples) / n,
        "thermal_capped_share": sum(bool(s["reasons"] & THERMAL_REASONS) for s in samples) / n,
    }


class GpuSampler:
    """Samples `device`'s clock and power every `interval_ms` between `start()` and `stop()`
    (or over a `with` block)."""

    def __init__(self, device: torch.device | str, interval_ms: int = INTERVAL_MS):
        self.device = torch.device(device)
        self.interval_ms = interval_ms
        self.process: subprocess.Popen | None = None
        self.samples: list[dict] = []
        self.reason = self._unavailable_reason()

    def _unavailable_reason(self) -> str | None:
        if self.device.type != "cuda":
            return f"no GPU to sample on a {self.device.type} device"
        if shutil.which("nvidia-smi") is None:
            return "nvidia-smi is not on this machine's PATH"
        return None

    def start(self) -> None:
        if self.reason or self.process is not None:
            return
        props = torch.cuda.get_device_properties(self.device)
        self.process = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits",
             "-i", f"GPU-{props.uuid}", "-lms", str(self.interval_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        out, _ = self.process.communicate(timeout=10)
        self.process = None
        self.samples = parse_samples(out)
        if not self.samples:
            self.reason = "nvidia-smi returned no samples"

    def __enter__(self) -> GpuSampler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def metrics(self) -> dict:
        return summarize(self.samples)
