"""Profiling: device time by kernel and range, read from traces; the profile experiment."""

import json
from pathlib import Path

import pytest
import torch

from cs336_systems.lm.attention import ATTENTION_PARTS, attention_part_flops
from cs336_systems.lm.step import STEP_RANGES
from cs336_systems.measure.profiling import (
    device_work,
    is_matmul,
    kernel_table,
    load_trace,
    profiled_steps,
    range_times,
)
from cs336_systems.sections.profile import profile_step as profile
from cs336_systems.sections.profile import step_profile

GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas"
SOFTMAX = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, ...)"


def _range(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "tid": tid}


def _launch(correlation, ts, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2,
            "tid": tid, "args": {"correlation": correlation}}


def _kernel(name, correlation, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": 7,
            "args": {"correlation": correlation}}


def test_a_kernel_belongs_to_the_range_open_when_it_was_launched_not_when_it_ran():
    events = [
        _range("forward", 0, 100), _range("attention.softmax", 20, 10),
        _range("backward", 100, 200),
        _launch(1, 5), _launch(2, 25), _launch(3, 150, tid=2),  # backward: autograd's thread
        _launch(4, 40),
        # the GPU runs behind the CPU: every kernel starts after the forward range has closed
        _kernel(GEMM, 1, 400, 30.0), _kernel(SOFTMAX, 2, 430, 12.5),
        _kernel(GEMM, 3, 450, 60.0), _kernel(GEMM, 4, 520, 30.0),
        _kernel("orphan_kernel", 99, 600, 1.0),  # its launch is not in the trace
    ]
    rows = {(r["kernel"], r["phase"], r["part"]): r
            for r in kernel_table(events, {"phase": STEP_RANGES, "part": ATTENTION_PARTS})}
    assert rows[(GEMM, "forward", "")]["calls"] == 2
    assert rows[(GEMM, "forward", "")]["us"] == pytest.approx(60.0)
    assert rows[(SOFTMAX, "forward", "attention.softmax")]["us"] == pytest.approx(12.5)
    assert rows[(GEMM, "backward", "")]["us"] == pytest.approx(60.0)
    assert rows[("orphan_kernel", "", "")]["calls"] == 1
    assert rows[(GEMM, "forward", "")]["matmul"] and not rows[(SOFTMAX, "forward",
                                                               "attention.softmax")]["matmul"]
    assert device_work(events)[0] == "cuda kernels"
    ranges = range_times(events, ("forward", "backward"))
    # forward: launches at 5, 25 and 40 ran 400-430, 430-442.5 and 520-550
    assert ranges["forward"] == {"calls": 1, "cpu_us": 100, "device_us": 150.0}
    assert ranges["backward"]["device_us"] == 60.0  # launched from another thread


def test_on_a_cpu_trace_ops_count_their_self_time():
    ops = [{"ph": "X", "cat": "cpu_op", "name": n, "ts": ts, "dur": d, "tid": tid}
           for n, ts, d, tid in [("aten::linear", 0, 100, 1), ("aten::mm", 10, 30, 1),
                                 ("aten::resolve_conj", 15, 5, 1), ("aten::add", 200, 7, 1),
                                 ("aten::mul", 20, 50, 2)]]  # another thread, overlapping
    kind, work = device_work(ops)
    assert kind == "cpu ops"
    assert {w["name"]: w["us"] for w in work} == {
        "aten::linear": 70, "aten::mm": 25, "aten::resolve_conj": 5, "aten::add": 7,
        "aten::mul": 50}


@pytest.mark.parametrize("name, matmul", [
    (GEMM, True), ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", True),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(...)", True),
    ("ampere_sgemm_128x64_tn", True), ("aten::mm", True), ("aten::bmm", True),
    (SOFTMAX, False), ("aten::matmul", False),  # dispatches to mm/bmm, which count themselves
    ("void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)", False),
])
def test_which_kernels_are_matrix_multiplies(name, matmul):
    assert is_matmul(name) is matmul


def test_attention_flops_of_each_part():
    flops = attention_part_flops(batch_heads=6, seq=10, d_head=8)
    assert flops == {"attention.scores": 2 * 6 * 100 * 8, "attention.softmax": 5 * 6 * 100,
                     "attention.output": 2 * 6 * 100 * 8}


@pytest.fixture(scope="module")
def train_step(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "tiny_train.json"
    record = profile.main(["--size", "tiny", "--context-length", "32", "--mode", "train-step",
                           "--batch-size", "2", "--warmup-steps", "1", "--measure-steps", "2",
                           "--device", "cpu", "--output", str(out)])
    return out, record


def test_profile_records_measured_steps_only_with_every_range(train_step):
    path, record = train_step
    assert record["status"] == "ok", record.get("message")
    m = record["metrics"]
    events = load_trace(path.parent / m["trace_file"])
    # the schedule's own warm-up step is dropped: two steps traced, each range twice
    assert m["profiled_steps"] == profiled_steps(events) == 2
    assert {r: m["ranges"][r]["calls"] for r in STEP_RANGES} == dict.fromkeys(STEP_RANGES, 2)
    layers = 2  # the tiny model
    assert {r: m["ranges"][r]["calls"] for r in ATTENTION_PARTS} == dict.fromkeys(
        ATTENTION_PARTS, 2 * layers)
    phases = {k["phase"] for k in m["kernels"]}
    assert set(STEP_RANGES) <= phases
    mm = [k for k in m["kernels"] if k["kernel"] == "aten::mm"]
    assert {k["phase"] for k in mm} >= {"forward", "backward"} and all(k["matmul"] for k in mm)
    # time credited to a range fits in it (self times of the ops run inside it)
    for phase in STEP_RANGES:
        inside = sum(k["us"] for k in m["kernels"] if k["phase"] == phase)
        assert 0 < inside <= m["ranges"][phase]["cpu_us"] * 1.001
    parts = {k["part"] for k in m["kernels"] if k["phase"] == "forward"}
    assert set(ATTENTION_PARTS) <= parts
    assert m["step_ms_mean"] > 0 and m["profiled_step_ms_mean"] > 0
    assert m["attention_flops"]["attention.scores"] == layers * 2 * (2 * 4) * 32 * 32 * 16
    assert json.loads(path.read_text())["config"]["trace"].endswith(".trace.json.gz")


def test_range_times_of_a_trace(train_step):
    path, record = train_step
    events = load_trace(path.parent / record["metrics"]["trace_file"])
    ranges = range_times(events, ("forward", "no-such-range"))
    assert set(ranges) == {"forward"}
    assert 0 < ranges["forward"]["device_us"] <= ranges["forward"]["cpu_us"]


def test_nsys_records_skipped_with_the_reason_where_it_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys here
    record = profile.main(["--size", "tiny", "--context-length", "16", "--mode", "forward",
                           "--tool", "nsys", "--device", "cpu", "--output",
                           str(tmp_path / "n.json")])
    assert record["status"] == "skipped"
    assert "CUDA" in record["message"] or "nsys" in record["message"]


def test_nsys_captures_the_measured_range_only():
    argv = ["--size", "tiny", "--context-length", "16", "--mode", "forward"]
    command = step_profile.nsys_command(Path("r/x"), argv)
    assert "--capture-range=nvtx" in command and f"--nvtx-capture={step_profile.MEASURED_RANGE}" in command
    assert command[-len(argv) - 1:] == [*argv, "--under-nsys"]


def test_nsys_kernel_summary_is_read_into_kernel_rows():
    text = ("Processing [r.sqlite] with [cuda_gpu_kern_sum.py]...\n"
            '"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)",'
            '"Max (ns)","StdDev (ns)","Name"\n'
            f'"70.0","7000","2","3500.0","3500.0","3000","4000","707.1","{GEMM}"\n'
            '"30.0","3000","6","500.0","500.0","400","600","89.4","void at::native::exp(float)"\n')
    rows = step_profile.read_kernel_summary(text)
    assert [(r["kernel"], r["calls"], r["us"], r["matmul"]) for r in rows] == [
        (GEMM, 2, 7.0, True), ("void at::native::exp(float)", 6, 3.0, False)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_profile_on_cuda_credits_kernels_to_ranges(tmp_path):
    record = profile.main(["--size", "tiny", "--context-length", "64", "--mode", "train-step",
                           "--device", "cuda", "--output", str(tmp_path / "r.json")])
    m = record["metrics"]
    assert m["device_work"] == "cuda kernels"
    assert {k["phase"] for k in m["kernels"]} >= set(STEP_RANGES)
    assert all(m["ranges"][r]["device_us"] > 0 for r in ("forward", "backward", "optimizer"))


def test_a_step_s_device_time_by_class_counts_overlap_once():
    from cs336_systems.measure.profiling import kernel_class, time_by_class
    assert kernel_class("triton_poi_fused__scaled_dot_product_cudnn_attention_backward_6") \
        == "elementwise"  # inductor's kernels are named after the ops they fused
    assert kernel_class("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16") \
        == "attention"
    assert kernel_class("flash_bwd_kernel") == "attention"
    from cs336_systems.sections.flash.kernel_variants import GLUON_KERNELS
    for name in (*GLUON_KERNELS["forward"], *GLUON_KERNELS["backward"], "attention_delta_kernel"):
        assert kernel_class(name) == "attention", name
    assert kernel_class("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN") == "matmul"
    assert kernel_class("_adamw_chunk") == "optimizer"
    assert kernel_class("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL") == "communication"
    assert kernel_class("triton_red_fused_mean_pow_rsqrt_4") == "elementwise"
    events = [_kernel("nvjet_sm90_tst", 1, 0, 100),
              _kernel("ncclDevKernel_AllGather", 2, 50, 100),   # overlaps the matmul by 50
              _kernel("cudnn_generated_sdpa_fprop", 3, 200, 40),  # 50 idle before it
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 240, "dur": 10}]
    split = time_by_class(events)
    assert split["matmul"] == pytest.approx(0.1) and split["communication"] == pytest.approx(0.1)
    assert split["attention"] == pytest.approx(0.04) and split["copies"] == pytest.approx(0.01)
    assert split["span"] == pytest.approx(0.25) and split["busy"] == pytest.approx(0.2)
    assert split["idle"] == pytest.approx(0.05)
    assert time_by_class([_range("forward", 0, 10)]) == {}
