"""Collectives in a profiler trace: which events are collectives, how much of their time ran
under compute, and whether FSDP's all-gathers finished before their layers could start; on
synthetic traces whose answers are known."""

import pytest

from cs336_systems.measure.collectives import (
    FORWARD_RANGE,
    GATHER_RANGE,
    gather_timing,
    is_collective,
    overlap_metrics,
    summarize_gathers,
)
from cs336_systems.measure.intervals import intersection, length, union
from support.cuda_traces import Trace, two_uses

# --- reading the trace -----------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",  # NCCL 2.19+
    "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",  # up to NCCL 2.18
    "ncclSymkDevKernel_AllReduce_AGxLL_R_sum_f32(ncclSymkDevWorkArgs4K)",  # 2.27+ symmetric
    "gloo:all_reduce"])
def test_collectives_by_every_nccl_naming_and_gloo(name):
    assert is_collective(name)


@pytest.mark.parametrize("name", ["nccl:all_reduce", "record_param_comms",
                                  "ampere_sgemm_128x64_tn", "aten::mm", "cudaLaunchKernel"])
def test_annotations_and_compute_are_not_collectives(name):
    assert not is_collective(name)


def test_interval_union_and_intersection():
    assert union([(5, 6), (0, 2), (1, 3)]) == [(0, 3), (5, 6)]
    assert union([(0, 1), (1.5, 2)], gap=0.6) == [(0, 2)]
    assert length([(0, 2), (1, 3), (10, 11)]) == 4
    assert intersection([(0, 4), (6, 8)], [(3, 7)]) == [(3, 4), (6, 7)]
    assert intersection([(0, 1)], [(1, 2)]) == []


def _kernel(name, ts, dur, correlation):
    return [{"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
             "args": {"correlation": correlation}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts - 1,
             "dur": 1, "args": {"correlation": correlation}}]


def test_overlap_metrics_of_a_synthetic_step():
    """Two steps of 100 us: compute 0-60 and 70-100, an all-reduce 40-80 (20 of its 40 us
    under compute); the second step's timeline is in ms from its first kernel."""
    events = []
    for step, origin in enumerate((1000, 2000)):
        events += [{"ph": "X", "cat": "user_annotation", "name": "forward", "ts": origin - 5,
                    "dur": 30},
                   {"ph": "X", "cat": "user_annotation", "name": "backward", "ts": origin + 25,
                    "dur": 30}]
        events += _kernel("sm90_xmma_gemm", origin, 60, 10 * step + 1)
        events += _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", origin + 40, 40,
                          10 * step + 2)
        events += _kernel("elementwise_kernel", origin + 70, 30, 10 * step + 3)
    m = overlap_metrics(events, steps=2, phases=["forward", "backward"])
    assert m["collective_busy_ms_per_step"] == pytest.approx(0.040)
    assert m["compute_busy_ms_per_step"] == pytest.approx(0.090)
    assert m["collective_hidden_ms_per_step"] == pytest.approx(0.030)  # 40-60 and 70-80
    assert m["collective_hidden_fraction"] == pytest.approx(0.75)
    t = m["timeline"]
    assert t["step_ms"] == pytest.approx(0.1)
    assert t["collective"] == [[0.04, 0.08]]
    assert t["compute"] == [[0.0, 0.1]]  # 60-70 is under the merging gap
    assert set(t["phases"]) == {"forward", "backward"}


def test_a_profile_without_collectives_is_an_error_not_a_missing_number():
    events = _kernel("ncclFutureKernelName_AllReduce", 0, 10, 1)
    events[0]["name"] = "some_new_comm_kernel"
    with pytest.raises(RuntimeError, match="no collective"):
        overlap_metrics(events, steps=1, phases=["forward"])


def test_gather_timing_says_which_gathers_the_layers_waited_for():
    rows = gather_timing(two_uses().events, {"a": ["a.weight"], "b": ["b.weight"]})
    assert [r["layer"] for r in rows] == ["a", "b"]
    a, b = rows
    assert a["hidden"] and a["wait_us"] == 0 and a["ready_us"] == 101  # launched at 101
    assert not b["hidden"] and b["ready_us"] == 200 and b["wait_us"] == 100
    assert b["gather_start_us"] == 120 and b["gather_end_us"] == 300
    assert b["forward_start_us"] == 300
    summary = summarize_gathers(rows, steps=1)
    assert summary["gathers_hidden"] == 1 and summary["gather_wait_ms_per_step"] == 0.1


def test_gather_timing_is_empty_without_cuda_kernels():
    t = Trace()
    t.span(f"{GATHER_RANGE} a.weight", 0, 5)
    t.span(f"{FORWARD_RANGE} a", 10, 5)
    assert gather_timing(t.events, {"a": ["a.weight"]}) == []
