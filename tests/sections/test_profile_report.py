"""The profile section's report: its answers (a)-(e) from records, on CPU runs and on
synthetic CUDA records whose answers are known."""

import json
from pathlib import Path

import pytest

from cs336_systems.measure.profiling import is_matmul
from cs336_systems.pipeline.records import make_record
from cs336_systems.records import write_json_atomic
from cs336_systems.report.facts import jsonable
from cs336_systems.sections.profile import profile_step as profile
from cs336_systems.sections.profile import report as section
from support.checkout import project_yaml
from support.sections import section_text

DEFAULTS = project_yaml()["defaults"]
GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas"
EXP = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
       "exp_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::"
       "{lambda(float)#1}, std::array<char*, 2ul> >(int, ..., std::array<char*, 2ul>)")
ADAM = "void at::native::multi_tensor_apply_kernel<...>(...)"
SOFTMAX = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, ...)"


def _build(paths, tmp_path, nsys=()):
    outputs = {"summary_table": str(tmp_path / "p.csv"), "kernel_table": str(tmp_path / "k.csv"),
               "figure": str(tmp_path / "p.png")}
    facts = jsonable(section.build({"records": [str(p) for p in paths],
                                    "nsys_records": [str(p) for p in nsys]},
                                   {"assignment": DEFAULTS["profile"]}, outputs))
    return facts, section_text("profile", facts, link_base=tmp_path)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile_cpu")
    paths = []
    for context in (16, 32):
        for mode in ("forward", "forward-backward", "train-step"):
            path = out / f"tiny_ctx{context}_{mode}.json"
            profile.main(["--size", "tiny", "--context-length", str(context), "--mode", mode,
                          "--batch-size", "2", "--warmup-steps", "1", "--measure-steps", "2",
                          "--device", "cpu", "--output", str(path)])
            paths.append(path)
    nsys = out / "nsys.json"
    profile.main(["--size", "tiny", "--context-length", "16", "--mode", "forward", "--tool",
                  "nsys", "--device", "cpu", "--output", str(nsys)])
    return out, paths, nsys


def test_a_cpu_run_answers_every_part_and_says_it_is_a_cpu(cpu_run):
    out, paths, nsys = cpu_run
    facts, text = _build(paths, out, [nsys])
    assert not facts["on_cuda"] and "differs in kind from a GPU profile" in text
    assert facts["coverage"]["nsys_profile"]["status"] == "partly answered"  # tiny, not 2.7b
    # the coverage note names every gap the section shows: Nsight Systems did not run here
    assert "Nsight Systems ran for 0 of 1 configurations" in facts["coverage"]["nsys_profile"][
        "note"]
    assert facts["focus"] == [{"size": "tiny", "context_length": 32}]
    assert facts["forward_time"]["count"] == 2
    assert [e["kernel"] for e in facts["top"]["leaders"]] == ["aten::mm", "aten::mm"]
    assert len(facts["attention_parts"]["configs"]) == 2
    assert facts["nsys"]["ran"] == 0 and "CPU" in facts["nsys"]["reasons"][0]
    assert len(facts["traces"]) == 6
    for t in facts["traces"]:
        assert Path(t["trace"]).is_file()
    assert "Not run: Nsight Systems profiles CUDA work" in text


def _record(path, mode, kernels, context=256, **ranges):
    """A profile record; `ranges` map a name to its (CPU, device span) milliseconds per step."""
    metrics = {"tool": "torch.profiler", "device_work": "cuda kernels", "profiled_steps": 2,
               "forward_ms_mean": 10.0, "forward_ms_std": 0.5, "step_ms_mean": 10.0,
               "step_ms_std": 0.5, "profiled_forward_ms_mean": 10.4,
               "kernels": [{"kernel": k, "phase": ph, "part": part, "calls": c, "us": us,
                            "matmul": is_matmul(k)}
                           for k, ph, part, c, us in kernels],
               "ranges": {name: {"calls": 2, "cpu_us": 2e3 * cpu, "device_us": 2e3 * span}
                          for name, (cpu, span) in ranges.items()},
               "attention_flops": {"attention.scores": 4e9, "attention.softmax": 1e8,
                                   "attention.output": 4e9},
               "trace_file": path.with_suffix(".trace.json.gz").name}
    config = {"size": "small", "context_length": context, "mode": mode, "precision": "fp32",
              "batch_size": 4, "warmup_steps": 3, "measure_steps": 2, "attention": "annotated",
              "tool": "torch", "seed": 0, "trace": str(path.with_suffix(".trace.json.gz"))}
    write_json_atomic(path, make_record("profile", config, "ok", metrics,
                                        env={"device": "cuda", "gpu": "H100"}))
    return path


@pytest.fixture
def cuda_records(tmp_path):
    # microseconds over 2 profiled steps
    forward = [(GEMM, "forward", "", 40, 16000.0), (GEMM, "forward", "attention.scores", 4, 800.0),
               (GEMM, "forward", "attention.output", 4, 800.0),
               (SOFTMAX, "forward", "attention.softmax", 4, 400.0),
               (EXP, "forward", "", 10, 2000.0)]
    backward = [(GEMM, "backward", "", 80, 36000.0), (EXP, "backward", "", 10, 2000.0)]
    optimizer = [(ADAM, "optimizer", "", 8, 12000.0)]
    return [_record(tmp_path / "fwd.json", "forward", forward, forward=(9.0, 9.8)),
            _record(tmp_path / "fb.json", "forward-backward", forward + backward,
                    forward=(9.0, 9.8)),
            _record(tmp_path / "train.json", "train-step", forward + backward + optimizer,
                    forward=(9.0, 9.8))]


def test_known_answers_from_cuda_records(cuda_records, tmp_path):
    facts, text = _build(cuda_records, tmp_path)
    assert facts["on_cuda"] and "differs in kind" not in text
    (lead,) = facts["top"]["leaders"]
    total_fwd = 16000 + 800 + 800 + 400 + 2000
    assert lead["share"] == pytest.approx((16000 + 1600) / total_fwd)
    assert lead["calls"] == pytest.approx(24)  # 48 launches over 2 steps
    assert lead["leads_forward_backward"]
    # (a): device span of the forward range, 9.8 ms, against the harness's 10.0 +- 0.5
    (config,) = facts["forward_time"]["configs"]
    assert config["span_over_harness"] == pytest.approx(0.98) and config["within_spread"]
    assert config["span_over_profiled"] == pytest.approx(9.8 / 10.4)
    assert config["busy_over_harness"] == pytest.approx(20.0 / 2 / 10.0)
    # (d): the optimizer's kernel dilutes the matmul share of the training step
    (m,) = facts["matmul"]["configs"]
    assert m["forward"] == pytest.approx(17600 / total_fwd)
    assert m["train_step"] == pytest.approx((17600 + 36000) / (total_fwd + 38000 + 12000))
    assert m["word"] == "falls"
    assert "multi_tensor_apply_kernel" in facts["matmul"]["growth_table"].split("\n")[2]
    # (e): softmax 200 us per forward against 800 us of matmuls, 1e8 FLOPs against 8e9
    (e,) = facts["attention_parts"]["configs"]
    assert e["softmax_over_matmul_time"] == pytest.approx(0.25)
    assert e["softmax_over_matmul_flops"] == pytest.approx(1 / 80)
    assert e["per_flop"] == pytest.approx(20) and e["per_flop_word"] == "slower"
    assert "per FLOP it is 20.0x\n  slower" in text or "per FLOP it is 20.0x slower" in text
    # (c): the elementwise exp is named by its functor and is above 1%
    assert "vectorized_elementwise_kernel<exp_kernel_cuda>" in facts["non_matmul"]["table"]["markdown"]
    # the answers open the section, from the same facts
    flat = " ".join(text.split())
    answers = flat[flat.index("**Answers.**"):flat.index("`python -m")]
    assert "**(a)** The profiled forward's span is 0.98x the harness's time without " \
        "the profiler (1 of 1 configurations inside its spread)" in answers
    assert "A matrix multiply leads the forward's kernels in 1 of 1 configurations" in answers
    assert "lower than in the forward in 1 of 1 configurations." in answers
    assert "per FLOP 20.0x slower." in answers


@pytest.mark.parametrize("name, short", [
    (EXP, "vectorized_elementwise_kernel<exp_kernel_cuda>"),
    (SOFTMAX, "cunn_SoftMaxForward"), ("aten::mm", "aten::mm"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4"
     "_alignc4_execute_split_k_kernel__5x_cublas",
     "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_split_k"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(cutlass_80_simt_sgemm_"
     "256x128_8x4_nn_align1::Params)", "Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
     "namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::TernaryOpScalarFunctor"
     "<float, 2, 2, 0>, at::native::LerpFunctor<float>, float>(at::native::TensorListMetadata<2>&)",
     "multi_tensor_apply_kernel<LerpFunctor>"),
    ("x" * 80, "x" * 63 + "…"),
])
def test_kernel_names_are_shortened_for_tables(name, short):
    assert section.short_kernel(name) == short


def test_a_failed_configuration_is_listed(tmp_path, cuda_records):
    oom = tmp_path / "oom.json"
    write_json_atomic(oom, make_record("profile", {"size": "2.7b", "context_length": 1024,
                                                   "mode": "train-step", "precision": "fp32"},
                                       "oom", message="CUDA out of memory. Tried to allocate"))
    facts, text = _build([*cuda_records, oom], tmp_path)
    assert facts["failures"][0]["status"] == "oom"
    assert "Not profiled: xl ctx 1024 train-step: oom" in text
    assert json.dumps(facts)  # plain JSON
