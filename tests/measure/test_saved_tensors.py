"""The saved-tensor accounting (cs336_systems.measure.saved_tensors) against the analytic memory model and
hand counts, a compiled module on the CPU, the experiment CLI and the section's report."""

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch
from conftest import DEVICE
from torch import nn

from cs336_systems.analysis.memory_model import (
    block_gradient_bytes,
    block_residuals,
    head_residuals,
)
from cs336_systems.lm.attention import get_attention
from cs336_systems.lm.loss import cross_entropy
from cs336_systems.lm.model import (
    MODEL_SIZES,
    VOCAB_SIZE,
    Linear,
    ModelSize,
    RMSNorm,
    RotaryEmbedding,
    TransformerBlock,
    build_model,
)
from cs336_systems.measure.saved_tensors import (
    GRAPH_INPUT,
    WALK_METHOD,
    Account,
    SavedTensors,
    compile_keeping_graphs,
    gradient_bytes,
)
from cs336_systems.pipeline.records import make_record
from cs336_systems.records import write_json_atomic
from cs336_systems.report.facts import jsonable
from cs336_systems.sections.residuals import count_saved as experiment
from cs336_systems.sections.residuals import report as section
from cs336_systems.sections.residuals import saved
from support.checkout import project_yaml
from support.sections import section_text

DEFAULTS = project_yaml()["defaults"]
MIB = 2**20


def _random_shapes(count: int, seed: int) -> list[tuple[ModelSize, int, int]]:
    """Block shapes unlike any size of the table: d_model, heads (even head dims), d_ff, batch
    (2 or more: see the batch-1 test), sequence."""
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        heads = rng.choice([1, 2, 3, 4])
        d_head = rng.choice([2, 4, 6, 8, 10])
        d_model = heads * d_head
        spec = ModelSize(d_model=d_model, d_ff=rng.randint(d_model + 1, 4 * d_model),
                         num_layers=rng.randint(1, 3), num_heads=heads)
        shapes.append((spec, rng.randint(2, 3), rng.randint(2, 37)))
    return shapes


def _block(spec: ModelSize, seq: int) -> TransformerBlock:
    rope = RotaryEmbedding(spec.d_model // spec.num_heads, seq)
    return TransformerBlock(spec.d_model, spec.num_heads, spec.d_ff, rope,
                            get_attention("eager"))


def _saved(module: nn.Module, x: torch.Tensor, compiled: bool = False) -> Account:
    """What `module(x)` saves, eager or compiled (after a forward and backward that compile)."""
    # on a CPU the partitioned graphs run uncompiled: the same saves, no C++ compilation
    run, graphs = compile_keeping_graphs(module, codegen=DEVICE == "cuda") if compiled \
        else (module, [])
    if compiled:
        run(x).sum().backward()
        assert len(graphs) == 1
    with SavedTensors(module) as saved:
        y = run(x)
    return saved.account(y, graphs)


@pytest.mark.parametrize("spec, batch, seq", _random_shapes(4, seed=20260))
def test_one_block_saves_what_the_analytic_model_says(spec, batch, seq):
    torch.manual_seed(seq)
    block = _block(spec, seq)
    x = torch.randn(batch, seq, spec.d_model, requires_grad=True)
    account = _saved(block, x)
    model = block_residuals(spec, batch, seq)
    assert account.saved_bytes == sum(model.values())
    # entry by entry: the RoPE entry is four storages (cos and sin rows, for q and for k)
    rope = model.pop("RoPE cos and sin tables, q and k")
    expected = sorted([*model.values(), *[rope // 4] * 4])
    assert sorted(s.bytes for s in account.activations) == expected
    # every parameter that autograd saved is told apart, none counted as an activation
    parameters = {name for name, _ in block.named_parameters()}
    saved_parameters = {s.name for s in account.storages if s.kind == "parameter"}
    assert saved_parameters == parameters
    assert all(s.name == "" for s in account.activations)


def test_at_batch_1_v_stays_a_view_that_keeps_the_whole_qkv_output():
    """With one sequence, `probs @ v` needs no contiguous copy of v (the batch axis of size 1
    merges with the heads), so what it saves is a view of the qkv projection's output, and that
    whole storage (q, k and v) stays alive: two (B, T, d_model) tensors more than the analytic
    model's "v, made contiguous"."""
    spec, seq = _random_shapes(1, seed=5)[0][0], 19
    block = _block(spec, seq)
    account = _saved(block, torch.randn(1, seq, spec.d_model, requires_grad=True))
    token = seq * spec.d_model * 4
    assert account.saved_bytes == sum(block_residuals(spec, 1, seq).values()) + 2 * token
    v = next(s for s in account.activations if s.saved_by == ["BmmBackward0.mat2"]
             and "softmax" in s.site.code)
    assert v.bytes == 3 * token


def test_a_whole_model_saves_its_blocks_and_its_head():
    spec, batch, seq = MODEL_SIZES["tiny"], 2, 13
    torch.manual_seed(1)
    model = build_model("tiny", context_length=seq)
    ids, targets = (torch.randint(0, VOCAB_SIZE, (batch, seq)) for _ in range(2))
    with SavedTensors(model) as saved:
        loss = cross_entropy(model(ids), targets)
    block = sum(block_residuals(spec, batch, seq).values())
    head = sum(head_residuals(spec, batch, seq).values())
    assert saved.account(loss).saved_bytes == spec.num_layers * block + head


def test_views_of_one_storage_count_once_at_the_storage_size():
    a = torch.randn(8, 6, requires_grad=True)
    with SavedTensors() as saved:
        b = a * 3.0                          # saves nothing (a scalar factor)
        out = b[:4].sin().sum() + b.view(6, 8).cos().sum()   # two views of b's storage
    account = saved.account(out)
    assert account.saved_count == 1
    assert account.saved_bytes == 8 * 6 * 4       # the whole storage, not the views' sizes
    assert account.packs == 2
    (storage,) = account.activations
    assert storage.saved_by == ["SinBackward0.self", "CosBackward0.self"]


def test_a_tensor_saved_by_two_operations_counts_once_and_names_the_first():
    x = torch.randn(5, 7, requires_grad=True)
    with SavedTensors() as saved:
        y = x.exp()                          # saves its result y
        z = (y * x).sum()                    # saves y again (MulBackward0.self), and x
    account = saved.account(z)
    by_op = {s.op: s for s in account.activations}
    assert by_op["ExpBackward0"].saved_by == ["ExpBackward0.result", "MulBackward0.self"]
    assert by_op["ExpBackward0"].packs == 2
    assert account.saved_bytes == sum(s.bytes for s in account.activations) == 2 * 5 * 7 * 4


class _Scaled(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = Linear(width, width)
        self.register_buffer("scale", torch.rand(width) + 0.5)

    def forward(self, x):
        return self.proj(x) * self.scale


def test_parameters_and_buffers_are_not_activations():
    module = _Scaled(6)
    x = torch.randn(3, 6, requires_grad=True)
    account = _saved(module, x)
    kinds = {s.kind: s for s in account.storages}
    assert kinds["parameter"].name == "proj.weight" and kinds["buffer"].name == "scale"
    assert account.saved_count == 1 and account.saved_bytes == x.numel() * 4   # x only
    metrics = account.metrics()
    assert metrics["parameter_storages"] == 2
    assert metrics["parameter_bytes"] == (36 + 6) * 4


def test_sites_name_the_module_the_line_and_the_operation():
    spec, batch, seq = MODEL_SIZES["tiny"], 2, 9
    block = _block(spec, seq)
    x = torch.randn(batch, seq, spec.d_model, requires_grad=True)
    account = _saved(block, x)
    probabilities = max(account.activations, key=lambda s: s.bytes
                        if s.shape[-2:] == [seq, seq] else 0)
    assert probabilities.op == "SoftmaxBackward0"
    assert probabilities.site.module == "attn" and probabilities.site.file == "lm/attention.py"
    assert "softmax" in probabilities.site.code
    w2_input = next(s for s in account.activations if s.site.module == "ffn.w2")
    assert w2_input.op == "MmBackward0" and w2_input.site.function == "Linear.forward"
    ops = account.operations()
    assert sum(op["bytes"] for op in ops) == account.saved_bytes
    assert sum(op["share"] for op in ops) == pytest.approx(1.0)
    assert [op["bytes"] for op in ops] == sorted((op["bytes"] for op in ops), reverse=True)


def test_gradient_bytes_of_one_block_are_the_analytic_models():
    spec, batch, seq = _random_shapes(1, seed=7)[0]
    block = _block(spec, seq)
    x = torch.randn(batch, seq, spec.d_model, requires_grad=True)
    block(x).backward(torch.randn(batch, seq, spec.d_model))
    assert gradient_bytes(block, [x]) == block_gradient_bytes(spec, batch, seq)


def test_the_hooks_see_what_a_compiled_module_saves_and_the_graph_names_it():
    torch.manual_seed(3)
    d = 24
    module = nn.Sequential(RMSNorm(d), Linear(d, 2 * d))
    x = torch.randn(2, 5, d, requires_grad=True)
    eager, account = _saved(module, x), _saved(module, x, compiled=True)
    # eager keeps x, rms, x * rms and the norm's output; compiled x, rms and the norm's output
    assert eager.saved_count == 4 and account.saved_count == 3
    assert account.saved_bytes == eager.saved_bytes - x.numel() * 4
    ops = {s.op: s for s in account.activations}
    assert set(ops) == {GRAPH_INPUT, "aten.rsqrt", "aten.mul"}
    norm_output = ops["aten.mul"]          # saved as the matmul's 2-D view, named by its maker
    assert norm_output.shape == [10, d] and norm_output.site.module == "0"
    assert "x * rms" in norm_output.site.code
    assert all(s.saved_by[0].startswith("CompiledFunctionBackward") for s in account.storages)
    assert account.metrics()["unhooked_storages"] == 0
    assert {s.name for s in account.storages if s.kind == "parameter"} == {"0.weight",
                                                                           "1.weight"}


def test_a_compiled_block_saves_less_and_every_tensor_is_named():
    spec, batch, seq = ModelSize(d_model=16, d_ff=40, num_layers=1, num_heads=2), 2, 12
    torch.manual_seed(4)
    block = _block(spec, seq)
    x = torch.randn(batch, seq, spec.d_model, requires_grad=True)
    account = _saved(block, x, compiled=True)
    eager = sum(block_residuals(spec, batch, seq).values())
    assert 0 < account.saved_bytes < eager
    assert all(s.op.startswith("aten.") or s.op == GRAPH_INPUT for s in account.activations)
    probabilities = next(s for s in account.activations
                         if s.bytes == batch * spec.num_heads * seq * seq * 4)
    assert probabilities.site.module == "attn" and probabilities.site.file == "lm/attention.py"
    # the rotary tables are the RoPE module's buffers here: excluded, not activations
    assert {s.name for s in account.storages if s.kind == "buffer"} <= {"attn.rope.cos",
                                                                        "attn.rope.sin"}


# --- the CLI ---------------------------------------------------------------------------------

def _run(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    experiment.main([*args, "--device", "cpu", "--output", str(out)])
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def cpu_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("residuals")
    records = {"rmsnorm": _run(out, "rmsnorm", "--target", "rmsnorm", "--d-model", "32",
                               "--batch-size", "2", "--context-length", "8")}
    for heads in (4, 2):
        records[f"block_h{heads}"] = _run(out, f"block_h{heads}", "--target", "block", "--size",
                                          "tiny", "--num-heads", str(heads), "--batch-size", "2",
                                          "--context-length", "24")
    return out, records


def test_the_cli_records_the_accounting_and_the_analytic_model(cpu_records):
    _, records = cpu_records
    for record in records.values():
        assert record["status"] == "ok", record.get("message")
        m = record["metrics"]
        assert m["saved_agrees"] is True and m["forward_peak_gib"] is None
        assert m["saved_bytes"] == m["analytic_saved_bytes"] > 0
        assert sum(op["bytes"] for op in m["operations"]) == m["saved_bytes"]
    norm = records["rmsnorm"]["metrics"]
    assert norm["saved_count"] == 3 and set(norm["analytic_saved"]) == set(
        saved.RMSNORM_ENTRIES)
    block = records["block_h2"]
    assert block["config"]["num_heads"] == 2 and block["config"]["d_model"] == 64
    spec = dataclasses.replace(MODEL_SIZES["tiny"], num_heads=2)
    assert block["metrics"]["analytic_saved"] == block_residuals(spec, 2, 24)
    assert block["metrics"]["gradient_agrees"] is True
    assert block["metrics"]["gradient_bytes"] == sum(block_gradient_bytes(spec, 2, 24).values())


def test_a_compiled_module_that_refuses_the_hooks_is_counted_by_the_graph_walk(tmp_path,
                                                                              monkeypatch):
    real = saved.counted_forward

    def refuse(*args, hooks=True, **kwargs):
        if hooks:
            raise RuntimeError("hooks are not supported here")
        return real(*args, hooks=hooks, **kwargs)

    monkeypatch.setattr(saved, "counted_forward", refuse)
    record = _run(tmp_path, "walk", "--target", "rmsnorm", "--d-model", "16", "--batch-size", "2",
                  "--context-length", "8", "--variant", "compiled")
    assert record["status"] == "ok", record.get("message")
    m = record["metrics"]
    assert m["method"] == WALK_METHOD and m["hooks_error"] == "RuntimeError: hooks are not " \
        "supported here"
    assert m["saved_count"] == 2 and m["saved_bytes"] == 2 * 8 * 16 * 4 + 2 * 8 * 4  # x, rsqrt
    assert all(s["counted"] and not s["hooked"] for s in m["storages"])


def test_without_hooks_the_graph_walk_finds_the_same_storages():
    spec, batch, seq = _random_shapes(1, seed=11)[0]
    block = _block(spec, seq)
    x = torch.randn(batch, seq, spec.d_model, requires_grad=True)
    with SavedTensors(block, hooks=False) as saved:
        y = block(x)
    walked = saved.account(y)
    hooked = _saved(block, x)
    # the walk also finds the Python number `scores / sqrt(d)` wraps into a tensor (8 bytes)
    assert walked.saved_bytes == hooked.saved_bytes + 8
    assert walked.packs == hooked.packs + 1


@pytest.mark.parametrize("args, message", [
    (["--target", "block", "--context-length", "8"], "--target block needs --size"),
    (["--target", "block", "--size", "tiny", "--num-heads", "3", "--context-length", "8"],
     "--num-heads 3 does not divide size 'tiny'"),
    (["--target", "block", "--size", "tiny", "--context-length", "512"],
     "longer than size 'tiny' supports"),
    (["--target", "rmsnorm", "--context-length", "8"], "--target rmsnorm needs --d-model"),
])
def test_bad_options_fail_with_a_usage_message(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        experiment.main([*args, "--output", str(tmp_path / "r.json")])
    assert message in capsys.readouterr().err


def test_a_cuda_job_on_a_cpu_machine_records_skipped(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "cuda.json"
    experiment.main(["--target", "rmsnorm", "--d-model", "8", "--context-length", "4",
                     "--device", "cuda", "--output", str(out)])
    assert json.loads(out.read_text())["status"] == "skipped"


# --- the report ------------------------------------------------------------------------------

def _storage(kind_numel: int, op: str, module: str, kind: str = "activation",
             dtype: str = "float32") -> dict:
    return {"bytes": kind_numel * 4, "dtype": dtype, "shape": [kind_numel], "kind": kind,
            "name": "", "packs": 1, "hooked": True, "counted": True, "order": 0, "op": op,
            "saved_by": [op], "site": f"{module}: code", "site_module": module}


def _synthetic(path: Path, variant: str, heads: int, context: int, storages: list[dict],
               status: str = "ok") -> Path:
    """A block record of the 2.7b shape (measured on no machine: its answers are known)."""
    config = {"target": "block", "variant": variant, "size": "2.7b", "num_heads": heads,
              "d_model": 2560, "batch_size": 4, "context_length": context,
              "precision": "fp32", "seed": 0}
    spec = dataclasses.replace(MODEL_SIZES["2.7b"], num_heads=heads)
    analytic = block_residuals(spec, 4, context)
    grads = block_gradient_bytes(spec, 4, context)
    saved = sum(s["bytes"] for s in storages)
    ops = [{"operation": s["op"], "label": f"{s['site']} ({s['op']})", "module": s["site_module"],
            "function": "", "where": "lm/model.py:1", "code": "code", "bytes": s["bytes"],
            "storages": 1, "shapes": [s["shape"]], "dtypes": ["float32"], "order": i,
            "share": s["bytes"] / saved} for i, s in enumerate(storages)]
    ops.sort(key=lambda o: -o["bytes"])
    metrics = {"method": "synthetic", "hooks_error": None,
               "recompiled_under_hooks": False if variant == "compiled" else None,
               "saved_count": len(storages), "saved_bytes": saved,
               "saved_tensors": len(storages), "unhooked_storages": 0, "unhooked_bytes": 0,
               "parameter_storages": 0, "parameter_bytes": 0, "storages": storages,
               "operations": ops, "input_bytes": 4 * context * 2560 * 4,
               "input_numel": 4 * context * 2560, "output_bytes": 4 * context * 2560 * 4,
               "parameter_gradient_bytes": grads["parameter gradients"],
               "input_gradient_bytes": grads["input gradient"],
               "gradient_bytes": sum(grads.values()), "analytic_saved": analytic,
               "analytic_gradient": grads, "analytic_saved_bytes": sum(analytic.values()),
               "analytic_gradient_bytes": sum(grads.values()),
               "saved_agrees": saved == sum(analytic.values()) if variant == "eager" else None,
               "gradient_agrees": True, "forward_peak_gib": 9.0,
               "held_after_forward_bytes": saved + 4 * context * 2560 * 4}
    record = make_record("residuals", config, status, metrics if status == "ok" else {},
                         env={"device": "cuda", "gpu": "H100", "torch": "2.11", "git": "x"},
                         message="CUDA was requested but no CUDA device is available on this "
                                 "machine" if status != "ok" else None)
    out = path / f"{variant}_h{heads}_ctx{context}_{status}.json"
    write_json_atomic(out, record)
    return out


def _eager_block(heads: int, context: int) -> list[dict]:
    """What the analytic model says an eager block saves, as storages."""
    spec = dataclasses.replace(MODEL_SIZES["2.7b"], num_heads=heads)
    return [_storage(b // 4, "SomeBackward0", name.split(" ")[0])
            for name, b in block_residuals(spec, 4, context).items()]


def _compiled_block(heads: int, context: int) -> list[dict]:
    """A compiled block: 7 (B, T, d_model), 3 (B, T, d_ff), the probabilities, mask, rsqrts."""
    n = 4 * context
    return ([_storage(n * 2560, "aten.mul", "ln1") for _ in range(7)]
            + [_storage(n * 10240, "aten.mm", "ffn.w1") for _ in range(3)]
            + [_storage(4 * heads * context * context, "aten.div", "attn"),
               _storage(context * context // 4, "aten.bitwise_not", "attn"),
               _storage(n, "aten.rsqrt", "ln1"), _storage(n, "aten.rsqrt", "ln2")])


def _build(rmsnorm, block, tmp_path):
    outputs = {"table": str(tmp_path / "r.csv"), "operations_table": str(tmp_path / "o.csv"),
               "block_table": str(tmp_path / "f.csv"), "figure": str(tmp_path / "r.png")}
    facts = jsonable(section.build({"rmsnorm": [str(p) for p in rmsnorm],
                                    "block": [str(p) for p in block]},
                                   {"assignment": DEFAULTS["residuals"]}, outputs))
    json.dumps(facts, allow_nan=False)
    return facts, section_text("residuals", facts, link_base=tmp_path)


def test_the_report_on_cpu_records(cpu_records, tmp_path):
    out, _ = cpu_records
    facts, text = _build([out / "rmsnorm.json"], [out / "block_h4.json", out / "block_h2.json"],
                         tmp_path)
    assert facts["coverage"]["autograd_residuals"]["status"] == "partly answered"
    assert "not in this preset: block size xl" in facts["coverage"]["autograd_residuals"]["note"]
    f = facts["f"]["contexts"]
    assert [e["num_heads"] for e in f] == [4] and f[0]["agrees"] and f[0]["gradient_agrees"]
    assert len(f[0]["top"]) == 5 and 0 < f[0]["top_share"] < 1
    assert '<a id="memory_profiling_f"></a>' in text and "agree to the byte" in text
    assert not facts["handout"]["found"] and "no compiled fp32 block of that shape" in text
    assert facts["block"]["heads"][0]["variant"] == "eager"
    assert Path(tmp_path / "r.png").is_file()


def test_the_report_sets_a_compiled_block_beside_the_handout(tmp_path):
    context = 2048
    block = [_synthetic(tmp_path, "eager", h, context, _eager_block(h, context)) for h in (32, 16)]
    block += [_synthetic(tmp_path, "compiled", h, context, _compiled_block(h, context))
              for h in (32, 16)]
    block.append(_synthetic(tmp_path, "compiled", 32, 128, [], status="skipped"))
    facts, text = _build([], block, tmp_path)
    handout = facts["handout"]
    n = 4 * context
    ours = (7 * n * 2560 + 3 * n * 10240 + 4 * 16 * context**2 + context**2 // 4 + 2 * n) * 4
    assert handout["found"] and handout["ours_mib"] == pytest.approx(ours / MIB)
    assert handout["difference_mib"] == pytest.approx(3651 - ours / MIB)
    assert handout["token_mib"] == pytest.approx(n * 2560 * 4 / MIB)
    eager16 = sum(block_residuals(dataclasses.replace(MODEL_SIZES["2.7b"], num_heads=16), 4,
                                  context).values())
    assert handout["eager_mib"] == pytest.approx(eager16 / MIB)
    assert handout["between"] == (ours / MIB < 3651 < eager16 / MIB)
    # 32 heads against 16: the probabilities grow by B x 16 x T^2 x 4 bytes, nothing else
    compiled_heads = next(h for h in facts["block"]["heads"] if h["variant"] == "compiled")
    assert compiled_heads["probabilities_difference_mib"] == pytest.approx(
        4 * 16 * context**2 * 4 / MIB) == compiled_heads["formula_mib"]
    assert compiled_heads["rest_mib"] == pytest.approx(0)
    kinds = {k["kind"]: k for k in facts["block"]["fused"]["16"]["kinds"]}
    assert kinds["(B, T, d_ff)"]["left_count"] == 5 and kinds["(B, T, d_ff)"]["right_count"] == 3
    assert facts["f"]["contexts"][0]["agrees"] and facts["f"]["all_agree"]
    assert facts["failures"] == [{"target": "block", "size": "2.7b", "num_heads": 32,
                                  "context_length": 128, "variant": "compiled",
                                  "status": "skipped",
                                  "reason": "CUDA was requested but no CUDA device is "
                                            "available on this machine"}]
    assert facts["coverage"]["autograd_residuals"]["status"] == "partly answered"
    assert "3651 MiB" in text and f"{ours / MIB:.1f} MiB" in text
    assert "The hooks saw every tensor the compiled modules saved (2 run(s))" in " ".join(
        text.split())
    assert "Not measured: block xl, 32 heads, context 128, compiled: skipped" in text
    allocator = facts["allocator"]
    assert len(allocator["rows"]) == 4
    agree = [abs(r["held_mib"] - r["saved_mib"]) <= 0.2 * r["saved_mib"] for r in allocator["rows"]]
    assert allocator["agree"] == sum(agree)
    flat = " ".join(text.split())
    assert f"{sum(agree)} of 4 rows agree within 20%" in flat
    assert flat.count("not within 20%") == 4 - sum(agree)
    assert "The CUDA allocator agrees" not in flat


def test_the_allocator_rows_that_disagree_are_marked():
    """A forward that left half the counted bytes allocated does not agree; one within 20%
    does."""
    from cs336_systems.sections.residuals.report import allocator_facts

    def record(held_mib):
        return {"config": {"target": "rmsnorm", "variant": "eager", "context_length": 2048},
                "metrics": {"held_after_forward_bytes": (held_mib + 1) * MIB,
                            "output_bytes": MIB, "saved_bytes": 160 * MIB,
                            "forward_peak_gib": 0.23}}
    facts = allocator_facts([record(80.0), record(150.0)])
    assert [r["agrees"] for r in facts["rows"]] == [False, True] and facts["agree"] == 1
    assert facts["rows"][0]["held_mib"] == pytest.approx(80.0)


def test_the_report_with_nothing_measured(tmp_path):
    skipped = _synthetic(tmp_path, "eager", 32, 2048, [], status="skipped")
    facts, text = _build([], [skipped], tmp_path)
    assert facts["coverage"]["autograd_residuals"]["status"] == "skipped"
    assert "_(no residuals result in this run)_" in text
