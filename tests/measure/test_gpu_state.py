"""The GPU sampler: nvidia-smi's lines parsed into clock, power and the reasons the clock was
held back, and summarized; on a CPU it samples nothing and says why."""

import pytest
import torch

from cs336_systems.measure.gpu_state import GpuSampler, parse_samples, summarize

LINES = """\
1980, 1980, 124.33, 700.00, 0x0000000000000000
1530, 1980, 692.96, 700.00, 0x0000000000000004
1485, 1980, 689.01, 700.00, 0x0000000000000004
1425, 1980, 678.96, 700.00, 0x0000000000000020
[N/A], 1980, 600.00, 700.00, 0x0
1500, 1980, 69
"""


def test_lines_are_parsed_and_broken_ones_dropped():
    samples = parse_samples(LINES)
    assert [s["clock"] for s in samples] == [1980, 1530, 1485, 1425]
    assert samples[1]["reasons"] == 0x4 and samples[0]["limit"] == 700.0


def test_the_summary_counts_power_and_heat_apart():
    summary = summarize(parse_samples(LINES))
    assert summary["gpu_samples"] == 4
    assert summary["sm_clock_mhz_median"] == pytest.approx((1530 + 1485) / 2)
    assert summary["sm_clock_mhz_max"] == 1980
    assert summary["power_capped_share"] == pytest.approx(0.5)
    assert summary["thermal_capped_share"] == pytest.approx(0.25)
    assert summarize([]) == {}


def test_on_a_cpu_nothing_is_sampled_and_the_reason_is_said():
    with GpuSampler(torch.device("cpu")) as sampler:
        pass
    assert sampler.metrics() == {} and "no GPU" in sampler.reason
