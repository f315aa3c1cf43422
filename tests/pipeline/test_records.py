import json

import pytest
import torch

from cs336_systems import records
from cs336_systems.pipeline.records import make_record, run_and_record
from cs336_systems.records import write_json_atomic
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


# --- damaged records: each says which file, what is wrong, and how to measure it again ------

def _written(tmp_path, text: str) -> str:
    path = tmp_path / "results" / "quick" / "flash" / "eager_seq256_d64_bf16.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def _good_record() -> dict:
    return make_record("flash", {"seq": 256}, "ok", {"forward_ms_median": 1.0},
                               env={"git": "abc"})


def _damage_message(path: str) -> str:
    with pytest.raises(records.DamagedRecord) as caught:
        records.read_record(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert message.endswith(f"`snakemake --cores 1 --force {path} --config preset=quick`.")
    return message


def test_a_truncated_record_names_the_file_and_the_command(tmp_path):
    text = json.dumps(_good_record(), indent=1)
    message = _damage_message(_written(tmp_path, text[:100]))
    assert "not valid JSON" in message and "may be truncated" in message
    assert " at at " not in message


@pytest.mark.parametrize("key", records.RECORD_KEYS)
def test_a_record_without_a_key_says_which(tmp_path, key):
    record = _good_record()
    del record[key]
    message = _damage_message(_written(tmp_path, json.dumps(record)))
    assert f"missing '{key}'" in message


def test_a_record_with_an_unknown_status_names_the_known_ones(tmp_path):
    record = {**_good_record(), "status": "done"}
    message = _damage_message(_written(tmp_path, json.dumps(record)))
    assert "unknown status 'done'" in message and "ok, oom, skipped, error" in message


def test_a_json_list_is_not_a_record(tmp_path):
    assert "a record is a JSON object, this is a list" in _damage_message(
        _written(tmp_path, "[1, 2]"))


def test_a_good_record_reads_back_and_check_records_counts_them(tmp_path):
    path = _written(tmp_path, json.dumps(_good_record()))
    assert records.read_record(path) == json.loads(json.dumps(_good_record()))
    results = tmp_path / "results" / "quick"
    (results / "sections").mkdir()
    (results / "sections" / "flash.json").write_text("{}")  # facts, not a record
    assert records.check_records(results) == 1
    (results / "flash" / "broken.json").write_text('{"section": ')
    with pytest.raises(records.DamagedRecord, match="broken.json: not valid JSON"):
        records.check_records(results)


def test_a_folder_that_cannot_be_written_is_named_before_anything_is_measured(
        tmp_path, monkeypatch, caplog):
    """(Checked with os.access, which root passes: the test makes it refuse.)"""
    from cs336_systems.records import unwritable

    blocked = tmp_path / "results"
    blocked.mkdir()
    assert unwritable(blocked / "smoke" / "benchmark") is None
    (tmp_path / "file").write_text("x")
    assert unwritable(tmp_path / "file" / "logs") == (
        f"cannot write {tmp_path / 'file' / 'logs'}: {tmp_path / 'file'} is a file, not a folder")
    real_access = __import__("os").access
    monkeypatch.setattr("os.access", lambda path, mode: False if str(path) == str(blocked)
                        else real_access(path, mode))
    assert unwritable(blocked / "smoke") == (
        f"cannot write {blocked / 'smoke'}: {blocked} is not writable for this user")
    measured = []
    with pytest.raises(SystemExit):
        run_and_record("demo", {}, blocked / "smoke" / "r.json",
                       lambda device: measured.append(1) or {}, device="cpu")
    assert measured == [] and "is not writable for this user" in caplog.text
