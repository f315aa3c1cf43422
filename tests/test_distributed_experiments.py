"""The distributed experiments on CPUs (gloo, two ranks, the tiny model): the records they
write carry what the distributed section reads, and the trace reading they rely on."""

import json

import pytest

from cs336_systems.experiments import ddp, ddp_check, sharded_optimizer
from cs336_systems.intervals import intersection, length, union

TINY = ["--size", "tiny", "--context-length", "16", "--batch-size", "4", "--world-size", "2",
        "--warmup-steps", "1", "--measure-steps", "2", "--device", "cpu"]


# --- reading the trace -----------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",  # NCCL 2.19+
    "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",  # up to NCCL 2.18
    "ncclSymkDevKernel_AllReduce_AGxLL_R_sum_f32(ncclSymkDevWorkArgs4K)",  # 2.27+ symmetric
    "gloo:all_reduce"])
def test_collectives_by_every_nccl_naming_and_gloo(name):
    assert ddp.is_collective(name)


@pytest.mark.parametrize("name", ["nccl:all_reduce", "record_param_comms",
                                  "ampere_sgemm_128x64_tn", "aten::mm", "cudaLaunchKernel"])
def test_annotations_and_compute_are_not_collectives(name):
    assert not ddp.is_collective(name)


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
    m = ddp.overlap_metrics(events, steps=2, phases=["forward", "backward"])
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
        ddp.overlap_metrics(events, steps=1, phases=["forward"])


# --- the experiments, end to end on gloo ------------------------------------------------------

def _record(path):
    record = json.loads(path.read_text())
    assert record["status"] == "ok", record.get("message")
    return record["metrics"]


def test_ddp_records_its_collective_time_and_timeline(tmp_path):
    out = tmp_path / "overlap.json"
    ddp.main(["--variant", "overlap", *TINY, "--output", str(out),
              "--trace", str(tmp_path / "overlap.trace.json.gz")])
    m = _record(out)
    assert m["collective_busy_ms_per_step"] > 0
    assert 0 <= m["collective_hidden_fraction"] <= 1
    assert m["profile_steps"] == ddp.PROFILE_STEPS
    assert m["trace_file"] == "overlap.trace.json.gz"
    assert m["timeline"]["collective"] and m["timeline"]["compute"]
    assert {"forward", "backward", "optimizer"} <= set(m["timeline"]["phases"])


def test_sharded_optimizer_records_every_rank(tmp_path):
    out = tmp_path / "sharded.json"
    sharded_optimizer.main(["--sharded", *TINY, "--output", str(out)])
    m = _record(out)
    assert len(m["memory_per_rank"]) == 2
    for key in ("peak_gib_init", "peak_gib_before_step", "peak_gib_step"):
        assert key in m and all(key in r for r in m["memory_per_rank"])  # None on a CPU
    states = [r["optimizer_state_gib"] for r in m["memory_per_rank"]]
    assert sum(states) == pytest.approx(2 * m["parameter_gib"], rel=1e-3)  # AdamW's m and v


def test_ddp_check_matches_single_process_training(tmp_path):
    out = tmp_path / "check.json"
    ddp_check.main(["--output", str(out)])
    m = _record(out)
    assert [c["variant"] for c in m["checks"]] == list(ddp_check.DDP_CHECK_VARIANTS)
    for c in m["checks"]:
        assert c["allclose"], c
        assert c["replicas_max_abs_diff"] == 0.0
        assert c["moved_max_abs"] > 100 * c["max_abs_diff"]
