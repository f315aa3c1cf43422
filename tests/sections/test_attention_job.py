"""pytorch_attention on the CPU: the record, the memory model against what autograd saves, and
an out-of-memory that keeps what was measured before it."""

import json

import pytest
import torch

from cs336_systems.analysis.attention_memory import eager_attention_bytes
from cs336_systems.lm.attention import eager_attention
from cs336_systems.sections.attention import time_attention as experiment
from cs336_systems.sections.attention.report import loglog_slope


def test_saved_for_backward_is_what_autograd_saves():
    batch, seq, d = 2, 48, 16
    q, k, v = (torch.randn(batch, seq, d, requires_grad=True) for _ in range(3))
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        eager_attention(q, k, v)
    assert sum(storages.values()) == eager_attention_bytes(batch, seq, d)["saved_for_backward"]


def test_memory_model_grows_with_the_square_of_the_sequence():
    sizes = [eager_attention_bytes(8, seq, 64)["before_backward"] for seq in (4096, 8192, 16384)]
    assert 1.9 < loglog_slope([4096, 8192, 16384], sizes) < 2.0  # the linear terms pull it under 2
    assert loglog_slope([1, 2, 4], [3, 6, 12]) == pytest.approx(1.0)


def _run(tmp_path, *args):
    out = tmp_path / "r.json"
    experiment.main(["--d", "16", "--seq", "32", "--batch-size", "2", "--warmup-steps", "1",
                     "--measure-steps", "3", "--device", "cpu", "--output", str(out), *args])
    return json.loads(out.read_text())


def test_a_cpu_run_records_both_passes(tmp_path):
    record = _run(tmp_path)
    assert record["status"] == "ok", record.get("message")
    m = record["metrics"]
    assert len(m["forward_ms_samples"]) == len(m["backward_ms_samples"]) == 3
    assert m["forward_ms_mean"] > 0 and m["backward_ms_mean"] > 0 and m["first_forward_ms"] > 0
    assert m["memory_before_backward_gib"] is None  # no allocator to read on a CPU


def test_a_memory_cap_needs_a_gpu(tmp_path):
    record = _run(tmp_path, "--memory-cap-gib", "24")
    assert record["status"] == "skipped"
    assert record["message"] == "a memory cap of 24 GiB needs a CUDA device; this job runs on cpu"


def test_an_out_of_memory_in_backward_keeps_the_forward_timings(tmp_path, monkeypatch):
    real = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setattr(torch.Tensor, "backward", backward)
    record = _run(tmp_path)
    monkeypatch.setattr(torch.Tensor, "backward", real)
    assert record["status"] == "oom"
    assert record["metrics"]["oom_pass"] == "backward"
    assert len(record["metrics"]["forward_ms_samples"]) == 3
    assert record["message"] == ("out of memory in the backward pass: CUDA out of memory. "
                                 "Tried to allocate 8.00 GiB")


def test_compiling_without_warmup_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        experiment.main(["--d", "16", "--seq", "32", "--compile", "--warmup-steps", "0",
                         "--output", str(tmp_path / "r.json")])
    assert "--compile needs --warmup-steps of at least 1" in capsys.readouterr().err
