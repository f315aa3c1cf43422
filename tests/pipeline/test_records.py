import json

import pytest
import torch

from cs336_systems.pipeline.records import run_and_record, write_json_atomic
from cs336_systems.sections.benchmark import time_step as benchmark


def _read(path):
    return json.loads(path.read_text())


def test_ok_record_has_the_contract_fields(tmp_path):
    out = tmp_path / "r.json"
    run_and_record("demo", {"x": 1}, out, lambda device: {"value_ms": 1.5}, device="cpu")
    record = _read(out)
    assert record["section"] == "demo" and record["status"] == "ok"
    assert record["config"] == {"x": 1} and record["metrics"] == {"value_ms": 1.5}
    assert {"device", "gpu", "torch", "triton", "git", "time"} <= set(record["env"])


def test_out_of_memory_becomes_an_oom_record(tmp_path):
    def measure(device):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    out = tmp_path / "r.json"
    run_and_record("demo", {}, out, measure, device="cpu")
    record = _read(out)
    assert record["status"] == "oom" and "Tried to allocate" in record["message"]


def test_other_failures_become_error_records_with_traceback(tmp_path):
    out = tmp_path / "r.json"
    run_and_record("demo", {}, out, lambda device: 1 / 0, device="cpu")
    record = _read(out)
    assert record["status"] == "error" and "ZeroDivisionError" in record["message"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_gpu_job_on_cpu_machine_is_skipped_with_reason(tmp_path):
    out = tmp_path / "r.json"
    run_and_record("demo", {}, out, lambda device: {}, device="cuda")
    record = _read(out)
    assert record["status"] == "skipped" and "no CUDA device" in record["message"]


def test_atomic_write_leaves_no_temp_files(tmp_path):
    write_json_atomic(tmp_path / "a" / "r.json", {"k": [1, 2]})
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["r.json"]


def test_benchmark_cli_writes_a_measured_record(tmp_path):
    out = tmp_path / "bench.json"
    benchmark.main(["--size", "tiny", "--context-length", "8", "--mode", "train-step",
                    "--precision", "bf16", "--warmup-steps", "1", "--measure-steps", "2",
                    "--batch-size", "2", "--device", "cpu", "--output", str(out)])
    record = _read(out)
    assert record["status"] == "ok", record.get("message")
    metrics = record["metrics"]
    for phase in ("forward", "backward", "optimizer", "step"):
        assert metrics[f"{phase}_ms_mean"] > 0 and len(metrics[f"{phase}_ms_samples"]) == 2
    assert metrics["parameters"] > 1e6


@pytest.mark.parametrize("argv, message", [
    (["--size", "huge"], "invalid choice: 'huge'"),
    (["--measure-steps", "0"], "must be a positive integer"),
    (["--warmup-steps", "-2"], "must be a non-negative integer"),
    (["--context-length", "4096"], "longer than size 'tiny' supports (at most 256)"),
])
def test_benchmark_cli_rejects_bad_arguments(tmp_path, capsys, argv, message):
    base = {"--size": "tiny", "--context-length": "8", "--mode": "forward",
            "--output": str(tmp_path / "x.json")}
    base.update(dict(zip(argv[::2], argv[1::2])))
    with pytest.raises(SystemExit) as info:
        benchmark.main([item for pair in base.items() for item in pair])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
