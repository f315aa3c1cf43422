"""The speed targets: the table of targets, the job's measurements on the CPU (its skip, its
interleaved rounds, an out-of-memory that ends one measurement only), the speed table and its
verdicts from synthetic records, and the flash table's TFLOP/s and commits."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

from cs336_systems.pipeline.config import merged_presets
from cs336_systems.report import tables
from cs336_systems.report.facts import read_facts, write_facts
from cs336_systems.sections.flash import report as flash
from cs336_systems.sections.flash import speed, time_targets
from cs336_systems.sections.flash import speed_table as speed_report
from cs336_systems.sections.flash.targets import (
    CLASS_BEST_MS,
    GROUPS,
    LONGEST_SEQ,
    TARGETS,
    AttentionRun,
    group_args,
    group_case,
    group_runs,
)
from support.checkout import ROOT, copy_checkout, project_yaml, stale_jobs
from support.sections import section_text

CONFIG = project_yaml()
PRESETS = merged_presets(CONFIG)
CPU = torch.device("cpu")


# --- the targets ---------------------------------------------------------------------------

def test_every_group_has_targets_and_every_target_a_group():
    assert {t.group for t in TARGETS} == set(GROUPS)
    assert len({t.key for t in TARGETS}) == len(TARGETS)


def test_the_leaderboard_group_times_ours_and_both_sdpa_backends_compiled():
    assert [i.key for i in group_runs("leaderboard")] == [
        "flash-triton+compile", "sdpa-flash+compile", "sdpa-cudnn+compile", "fa4+compile"]
    assert [i.key for i in group_runs("pytorch_sweep")] == [
        "flash-triton", "eager", "eager+compile"]


@pytest.mark.parametrize("preset", ["assignment", "quick", "smoke"])
def test_group_shapes_come_from_the_preset(preset):
    config = PRESETS[preset]["flash"]
    lb, sweep = config["leaderboard"], config["seq_lengths"]
    case = group_case("leaderboard", config)
    assert case.shapes == ((lb["batch_size"], lb["seq"], lb["d"]),) and case.causal
    assert group_case("cold_compile", config) == case
    forward = group_case("forward", config)
    assert [s[2] for s in forward.shapes] == [64, 128]
    assert {s[:2] for s in forward.shapes} == {(lb["batch_size"], lb["seq"])}
    for group, low in (("sdpa_flash_sweep", 4096), ("pytorch_sweep", 1024)):
        case = group_case(group, config)
        assert case.precision == "bf16" and case.causal == config["causal"]
        assert sorted(case.shapes) == sorted((config["batch_size"], s, d) for s in sweep
                                             if s >= low for d in config["d_heads"])
    assert group_case("longest", config).shapes == tuple(
        (config["batch_size"], LONGEST_SEQ, d) for d in config["d_heads"])


def test_quick_preset_shapes():
    config = PRESETS["quick"]["flash"]
    assert group_case("sdpa_flash_sweep", config).shapes == (
        (1, 4096, 64), (1, 4096, 128), (1, 16384, 64), (1, 16384, 128))
    assert len(group_case("pytorch_sweep", config).shapes) == 6
    assert group_case("pytorch_sweep", PRESETS["smoke"]["flash"]).shapes == ()


def _target(key):
    return next(t for t in TARGETS if t.key == key)


def test_targets_compare_as_the_issue_states():
    vs_flash = _target("leaderboard_vs_sdpa_flash")
    assert vs_flash.meets(0.75) and not vs_flash.meets(0.76)
    assert vs_flash.describe() == "≤ 0.75x SDPA flash, compiled"
    best = _target("leaderboard_vs_class_best")
    assert best.bound == CLASS_BEST_MS == 5.364 and best.describe() == "< 5.364 ms"
    assert not best.meets(5.364) and best.meets(5.3)  # "under": strict
    assert _target("sweep_vs_eager").meets(0.99) and not _target("sweep_vs_eager").meets(1.0)
    assert _target("sweep_vs_sdpa_flash").meets(1.25)
    no_oom = _target("no_oom")
    assert no_oom.meets(65536) and not no_oom.meets(32768) and no_oom.describe() == "≥ 65536"
    assert no_oom.off_by(32768) == 2.0
    assert _target("cold_compile").describe() == "≤ 600 s"
    assert _target("leaderboard_vs_sdpa_cudnn").stretch


# --- the job, on the CPU -------------------------------------------------------------------

def test_the_job_records_skipped_on_a_cpu(tmp_path):
    out = tmp_path / "r.json"
    record = time_targets.main(["--group", "leaderboard", "--shapes", "2x32x16", "--precision",
                               "fp32", "--device", "cpu", "--output", str(out)])
    assert record["status"] == "skipped" and "CPU" in record["message"]
    assert json.loads(out.read_text())["config"]["shapes"] == [[2, 32, 16]]


def test_a_group_without_shapes_records_skipped():
    config = {"group": "pytorch_sweep", "shapes": [], "precision": "bf16", "causal": True,
              "rounds": 2, "seed": 0}
    with pytest.raises(speed.Skip, match="no shape of this preset's flash sweep"):
        speed.measure(config, torch.device("cuda"))  # checked before any CUDA call


def test_bad_shapes_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        time_targets.main(["--group", "forward", "--shapes", "2x32", "--precision", "bf16",
                          "--output", str(tmp_path / "r.json")])


def test_a_backend_that_cannot_run_here_is_skipped_by_the_flash_job(tmp_path):
    from cs336_systems.sections.flash import time_flash as flash_cli

    record = flash_cli.main(["--attention", "sdpa-cudnn", "--seq", "32", "--d", "16", "--precision",
                             "fp32", "--device", "cpu", "--output", str(tmp_path / "r.json")])
    assert record["status"] == "skipped"  # cuDNN attention never runs on a CPU
    assert record["message"].startswith("SDPA cuDNN cannot run here: ")


def test_the_rule_arguments_are_what_the_cli_takes(tmp_path):
    """What the flash_speed rule passes (group_args, as jobs.to_argv writes it) parses back
    into the record's configuration."""
    from cs336_systems.pipeline.jobs import to_argv

    for preset in ("quick", "smoke"):
        flash_config = PRESETS[preset]["flash"]
        for group in GROUPS:
            args = group_args(group, flash_config)
            record = time_targets.main(to_argv({**args, "device": "cpu"})
                                      + ["--output", str(tmp_path / f"{group}.json")])
            assert record["status"] == "skipped"
            case = group_case(group, flash_config)
            assert record["config"]["shapes"] == [list(s) for s in case.shapes]
            assert record["config"]["rounds"] == flash_config["speed"]["rounds"]
            assert (record["config"]["precision"], record["config"]["causal"]) == (case.precision,
                                                                               case.causal)


class _Finished:
    returncode, stdout, stderr = 0, '{"first_step_s": 12.5}\n', "compiling\n"


def test_cold_compile_runs_a_fresh_process_with_empty_caches(monkeypatch):
    seen = {}

    def run(command, env, timeout, **kwargs):
        seen.update(command=command, env=env, timeout=timeout)
        for key in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
            folder = Path(env[key])
            assert not folder.exists() or not any(folder.iterdir())
        return _Finished()

    monkeypatch.setattr(speed.subprocess, "run", run)
    config = _config(group="cold_compile", shapes=[[16, 16384, 64]], dtype="bf16")
    (entry,) = speed.measure_cold_compile(config, CPU)
    assert entry["status"] == "ok" and entry["attention"] == "flash-triton+compile"
    assert entry["first_step_s"] == 12.5 and entry["value"] > 0
    assert seen["command"][1:3] == ["-m", "cs336_systems.sections.flash.cold_compile"]
    assert "16x16384x64" in seen["command"] and seen["timeout"] == 2 * 600
    assert seen["env"]["TRITON_CACHE_DIR"] != seen["env"]["TORCHINDUCTOR_CACHE_DIR"]
    assert str(ROOT / "src") in seen["env"]["PYTHONPATH"].split(":")


def test_cold_compile_past_its_patience_is_a_timeout(monkeypatch):
    def run(command, timeout, **kwargs):
        raise subprocess.TimeoutExpired(command, timeout)

    monkeypatch.setattr(speed.subprocess, "run", run)
    config = _config(group="cold_compile", shapes=[[16, 16384, 64]], dtype="bf16")
    (entry,) = speed.measure_cold_compile(config, CPU)
    assert entry["status"] == "timeout" and "1200 s" in entry["message"]


def _config(**overrides) -> dict:
    return {"group": "pytorch_sweep", "shapes": [[1, 32, 16]], "precision": "fp32", "causal": True,
            "rounds": 3, "seed": 0, **overrides}


def test_versus_times_each_implementation_in_interleaved_rounds(monkeypatch):
    calls = []
    real = speed.benchmark_ms

    def spy(fn, device, **kwargs):
        calls.append(fn)
        return real(fn, device, **kwargs)

    monkeypatch.setattr(speed, "benchmark_ms", spy)
    impls = [AttentionRun("eager"), AttentionRun("sdpa-flash"), AttentionRun("sdpa-cudnn")]
    entries = speed.time_versus((1, 32, 16), impls, "forward_backward_ms", _config(), CPU)
    assert [e["attention"] for e in entries] == ["eager", "sdpa-flash", "sdpa-cudnn"]
    eager, sdpa, cudnn = entries
    # a backend that cannot run here is skipped with SDPA's reason, not an error
    assert cudnn["status"] == "skipped" and "SDPA cuDNN cannot run here" in cudnn["message"]
    for entry in (eager, sdpa):
        assert entry["status"] == "ok" and len(entry["rounds"]) == 3
        assert entry["value"] == statistics.median(entry["rounds"])
        assert entry["std"] == pytest.approx(statistics.stdev(entry["rounds"]))
    assert len(calls) == 6 and calls[0] is not calls[1] and calls[0] is calls[2]  # in turn


def test_an_out_of_memory_ends_only_its_measurement(monkeypatch):
    real = speed.benchmark_ms
    eager_step = {}

    def fail_second(fn, device, **kwargs):
        eager_step.setdefault("fn", fn)  # the first implementation timed: eager
        if fn is not eager_step["fn"]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8 GiB")
        return real(fn, device, **kwargs)

    monkeypatch.setattr(speed, "benchmark_ms", fail_second)
    entries = speed.time_versus((1, 32, 16), [AttentionRun("eager"), AttentionRun("sdpa-flash")],
                                      "forward_ms", _config(), CPU)
    assert entries[0]["status"] == "ok" and len(entries[0]["rounds"]) == 3
    assert entries[1]["status"] == "oom" and "out of memory" in entries[1]["message"]


def test_longest_halves_the_length_after_an_out_of_memory(monkeypatch):
    real = speed.attention_inputs

    def inputs(shape, dtype, device):
        if shape[1] > 32:
            raise torch.OutOfMemoryError("CUDA out of memory.")
        return real(shape, dtype, device)

    monkeypatch.setattr(speed, "attention_inputs", inputs)
    monkeypatch.setattr(speed, "OURS", "eager")  # the Triton kernels need a GPU here
    entry = speed.longest_run((1, 128, 16), _config(group="longest"), CPU)
    assert entry["status"] == "ok" and entry["value"] == 32
    assert entry["tried"] == {128: "oom", 64: "oom", 32: "ok"}
    assert entry["forward_backward_ms"] > 0


# --- the speed table, from synthetic records -----------------------------------------------

ENV = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11", "triton": "3.6", "git": "abc"}


def _measured(impl: str, shape, value: float, std: float = 0.01, status: str = "ok",
              metric: str = "forward_backward_ms", **fields) -> dict:
    entry = {"attention": impl, "shape": list(shape), "metric": metric, "status": status, **fields}
    if status == "ok":
        entry.update(value=value, std=std)
        entry.setdefault("rounds", [value] * 3)
    return entry


def _record(tmp_path: Path, group: str, measurements: list[dict], shapes, status: str = "ok",
            message: str = "", git: str = "abc", dtype: str = "bf16") -> str:
    record = {"section": "flash_speed", "status": status, "env": {**ENV, "git": git},
              "metrics": {"measurements": measurements} if status == "ok" else {},
              "config": {"group": group, "shapes": [list(s) for s in shapes], "precision": dtype,
                         "causal": True, "rounds": 3, "seed": 0}}
    if message:
        record["message"] = message
    path = tmp_path / "flash_speed" / f"{group}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return str(path)


LB = (16, 16384, 64)


def _speed_records(tmp_path: Path) -> list[str]:
    ours, sdpa, cudnn = (f"{n}+compile" for n in ("flash-triton", "sdpa-flash", "sdpa-cudnn"))
    shapes = [(1, 1024, 64), (1, 4096, 64)]
    return [
        # 6.0 ms against SDPA flash's 9.0 (0.667 <= 0.75: met) and cuDNN's 5.0 (1.2: unmet)
        _record(tmp_path, "leaderboard", [_measured(ours, LB, 6.0), _measured(sdpa, LB, 9.0),
                                          _measured(cudnn, LB, 5.0)], [LB]),
        _record(tmp_path, "forward", [], [(16, 16384, 64), (16, 16384, 128)], status="skipped",
                message="SDPA flash cannot run here: sm75"),
        # plain PyTorch runs out of memory at 4096; compiled, it is faster than ours at 1024
        _record(tmp_path, "pytorch_sweep", [
            _measured("flash-triton", shapes[0], 1.0), _measured("eager", shapes[0], 2.0),
            _measured("eager+compile", shapes[0], 0.9),
            _measured("flash-triton", shapes[1], 3.0),
            _measured("eager", shapes[1], None, status="oom", message="CUDA out of memory."),
            _measured("eager+compile", shapes[1], 6.0)], shapes, git="def"),
        _record(tmp_path, "longest", [_measured("flash-triton", (1, 65536, 64), 32768, std=None,
                                                metric="longest_seq")], [(1, 65536, 64)]),
        _record(tmp_path, "cold_compile", [_measured("flash-triton+compile", LB, 75.0, std=None,
                                                     metric="cold_compile_s")], [LB]),
    ]


def _outputs(tmp_path: Path) -> dict[str, str]:
    return {"table": str(tmp_path / "tables/flash.csv"),
            "leaderboard_table": str(tmp_path / "tables/flash_leaderboard.csv"),
            "speed_table": str(tmp_path / "tables/flash_speed.csv"),
            "kernels_table": str(tmp_path / "tables/flash_kernels.csv"),
            "latency_figure": str(tmp_path / "figures/flash_latency_vs_seq.png"),
            "speedup_figure": str(tmp_path / "figures/flash_speedup.png")}


def _facts(tmp_path: Path, speed: list[str], records: list[str] = (), board=()) -> dict:
    assignment = CONFIG["defaults"]["flash"]
    facts = flash.build({"records": list(records), "leaderboard": list(board), "speed": speed,
                         "kernels": []},
                        {"assignment": assignment}, _outputs(tmp_path))
    write_facts(tmp_path / "flash.json", facts)
    return read_facts(tmp_path / "flash.json")


def _rows(tmp_path: Path) -> dict[tuple[str, str], dict]:
    rows = speed_report.speed_rows(_speed_records(tmp_path))
    return {(r["target"], r["shape"]): r for r in rows}


def test_speed_rows_and_their_verdicts(tmp_path):
    rows = _rows(tmp_path)
    lb = "16x16384x64"
    vs_flash = rows[("leaderboard_vs_sdpa_flash", lb)]
    assert vs_flash["ratio"] == pytest.approx(6.0 / 9.0) and vs_flash["meets_target"] is True
    assert vs_flash["reference_value"] == 9.0 and vs_flash["commit"] == "abc"
    best = rows[("leaderboard_vs_class_best", lb)]
    assert best["ratio"] is None and best["compared"] == 6.0 and best["meets_target"] is False
    assert best["off_by"] == pytest.approx(6.0 / 5.364)
    cudnn = rows[("leaderboard_vs_sdpa_cudnn", lb)]
    assert cudnn["ratio"] == pytest.approx(1.2) and cudnn["meets_target"] is False
    assert cudnn["within_spread"] is False  # 6.0 ± 0.01 against 5.0 ± 0.01
    # a skipped group: every row of it skipped, with the reason and no verdict
    for d in (64, 128):
        row = rows[("forward_vs_sdpa_flash", f"16x16384x{d}")]
        assert row["status"] == "skipped" and row["meets_target"] is None
        assert row["reason"] == "SDPA flash cannot run here: sm75"
    # the reference out of memory: no verdict, the status and whose measurement it was
    oom = rows[("sweep_vs_eager", "1x4096x64")]
    assert oom["status"] == "oom" and oom["meets_target"] is None
    assert oom["reason"] == "plain PyTorch: CUDA out of memory."
    assert rows[("sweep_vs_eager", "1x1024x64")]["meets_target"] is True
    slower = rows[("sweep_vs_compiled", "1x1024x64")]
    assert slower["ratio"] == pytest.approx(1.0 / 0.9) and slower["meets_target"] is False
    assert rows[("sweep_vs_compiled", "1x4096x64")]["meets_target"] is True
    longest = rows[("no_oom", "1x65536x64")]
    assert longest["compared"] == 32768 and longest["meets_target"] is False
    assert longest["within_spread"] is None  # no spread to test against
    assert rows[("cold_compile", lb)]["meets_target"] is True
    # a group whose record is absent from the inputs has no rows
    assert not any(key[0] == "sweep_vs_sdpa_flash" for key in rows)


def test_within_spread_when_the_bound_lies_inside_the_noise(tmp_path):
    ours = "flash-triton+compile"
    path = _record(tmp_path, "leaderboard", [
        _measured(ours, LB, 5.40, std=0.1), _measured("sdpa-flash+compile", LB, 8.0, std=0.1),
        _measured("sdpa-cudnn+compile", LB, 5.35, std=0.1)], [LB])
    rows = {r["target"]: r for r in speed_report.speed_rows([path])}
    assert rows["leaderboard_vs_sdpa_cudnn"]["meets_target"] is False
    assert rows["leaderboard_vs_sdpa_cudnn"]["within_spread"] is True
    # 5.40 ± 0.1 against 5.364 (quoted, no spread)
    assert rows["leaderboard_vs_class_best"]["within_spread"] is True
    # 5.40 ± 0.1 against 0.75 x (8.0 ± 0.1) = 6.0 ± 0.075: met, beyond the spread
    assert rows["leaderboard_vs_sdpa_flash"]["meets_target"] is True
    assert rows["leaderboard_vs_sdpa_flash"]["within_spread"] is False
    shown = speed_report.speed_display(speed_report.speed_table([path]))
    assert list(shown["meets_target"]) == ["true", "false", "false", ""]  # fa4 not measured
    assert list(shown["bound within spread"]) == ["false", "true", "true", ""]
    assert list(shown["ratio"]) == ["0.68x", "", "1.01x", ""]


def test_speed_facts_table_and_sentences(tmp_path):
    speed = _speed_records(tmp_path)
    facts = _facts(tmp_path, speed)
    sp = facts["speed"]
    rows = speed_report.speed_rows(speed)
    # the leaderboard's and the forward group's targets against FlashAttention-4, which these
    # records lack; the forward group's three at its two shapes
    assert sp["rows"] == len(rows) == 4 + 3 * 2 + 2 * 2 + 1 + 1
    assert sp["measured"] == len(rows) - 8 and sp["met"] == 4 and sp["all_met"] is False
    assert sp["rounds"] == 3
    unmet = {u["title"]: u for u in sp["unmet"]}
    assert len(sp["unmet"]) == 4
    cudnn = unmet["leaderboard forward+backward (stretch)"]
    assert cudnn["shown"] == "1.20x" and cudnn["side"] == "above" and cudnn["stretch"]
    assert cudnn["off_by"] == pytest.approx(1.2 / 1.0)
    longest = unmet["longest sequence forward+backward runs"]
    assert longest["shown"] == "32768" and longest["side"] == "below" and longest["off_by"] == 2.0
    # the CSV holds every row, with its commit
    table = pd.read_csv(_outputs(tmp_path)["speed_table"])
    assert len(table) == len(rows) and set(table["commit"]) == {"abc", "def"}
    assert facts["commits"]["speed"] == {"commits": ["abc", "def"], "mixed": True}

    text = " ".join(section_text("flash", facts, link_base=tmp_path).split())
    assert "Of 16 rows, 4 meet their target, 4 miss it and 8 were not measured." in text
    assert ("Unmet: leaderboard forward+backward (stretch) at 16x16384x64: 1.20x "
            "against ≤ 1x SDPA cuDNN, compiled, 1.20x above the bound.") in text
    assert ("Unmet: longest sequence forward+backward runs at 1x65536x64: 32768 against "
            "≥ 65536, 2.00x below the bound.") in text
    assert ("Not measured, oom (plain PyTorch: CUDA out of memory.): forward+backward, "
            "seq ≥ 1024 at 1x4096x64.") in text
    assert ("Not measured, skipped (SDPA flash cannot run here: sm75): forward alone at "
            "16x16384x64; forward alone at 16x16384x128; forward alone (stretch) at 16x16384x64; "
            "forward alone (stretch) at 16x16384x128.") in text
    assert ("The speed table mixes records from 2 commits (`abc`, `def`): its rows do not all "
            "come from the same code.") in text
    assert "| leaderboard forward+backward " in facts["speed"]["table"]
    assert "Every target is met." not in text


def test_every_target_met(tmp_path):
    ours = "flash-triton+compile"
    path = _record(tmp_path, "leaderboard", [
        _measured(ours, LB, 4.0), _measured("sdpa-flash+compile", LB, 6.0),
        _measured("sdpa-cudnn+compile", LB, 4.5), _measured("fa4+compile", LB, 4.2)], [LB])
    facts = _facts(tmp_path, [path])
    assert facts["speed"]["all_met"] is True and facts["speed"]["unmet"] == []
    text = " ".join(section_text("flash", facts, link_base=tmp_path).split())
    assert "Of 4 rows, 4 meet their target, 0 miss it and 0 were not measured." in text
    assert "Every target is met." in text
    assert "Every record of the speed table comes from commit `abc`." in text


def test_an_error_record_is_reported_not_hidden(tmp_path):
    path = _record(tmp_path, "longest", [], [(1, 65536, 64)], status="error",
                   message="Traceback (most recent call last):\n  ...\nValueError: bad")
    (row,) = speed_report.speed_rows([path])
    assert row["status"] == "error" and row["reason"] == "ValueError: bad"
    assert row["meets_target"] is None


# --- the flash table: TFLOP/s and commits --------------------------------------------------

def _flash_record(tmp_path: Path, impl: str, git: str, seq: int = 4096, d: int = 64,
                  fb_ms: float = 2.0) -> str:
    record = {"section": "flash", "status": "ok", "env": {**ENV, "git": git},
              "metrics": {"forward_ms": fb_ms / 4, "backward_ms": 3 * fb_ms / 4,
                          "forward_backward_ms": fb_ms},
              "config": {"attention": impl, "seq": seq, "d": d, "precision": "bf16", "batch_size": 2,
                         "causal": True, "compile": False, "seed": 0}}
    path = tmp_path / "flash" / f"{impl}_{git}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return str(path)


def test_tflops_by_hand(tmp_path):
    # batch 2, seq 4096, d 64, causal: forward = 2 matmuls x 2 x 2*4096*4096*64 / 2
    forward_flops = 2 * 2 * (2 * 4096 * 4096 * 64) / 2
    assert flash.pass_flops(2, 4096, 64, True, "forward") == forward_flops == 4_294_967_296
    assert flash.pass_flops(2, 4096, 64, False, "forward") == 2 * forward_flops
    assert flash.pass_flops(2, 4096, 64, True, "backward") == 2.5 * forward_flops
    table = flash.build_table([_flash_record(tmp_path, "flash-triton", "abc", fb_ms=2.0)])
    row = table.iloc[0]
    # forward+backward: 3.5 x 4.294967296e9 FLOPs in 2 ms = 7.516 TFLOP/s
    assert row["forward_backward_tflops"] == pytest.approx(3.5 * 4.294967296e9 / 2e-3 / 1e12)
    assert row["forward_tflops"] == pytest.approx(4.294967296e9 / 0.5e-3 / 1e12)
    assert row["backward_tflops"] == pytest.approx(2.5 * 4.294967296e9 / 1.5e-3 / 1e12)
    assert "| 7.5 " in tables.to_markdown(flash.display_table(table, flash.overhead_cells(table)))


def test_mixed_commits_are_said(tmp_path):
    records = [_flash_record(tmp_path, "flash-triton", "abc"),
               _flash_record(tmp_path, "eager", "def")]
    facts = _facts(tmp_path, [], records=records)
    assert facts["commits"]["flash"] == {"commits": ["abc", "def"], "mixed": True}
    assert facts["commits"]["leaderboard"] == {"commits": [], "mixed": False}
    text = " ".join(section_text("flash", facts, link_base=tmp_path).split())
    assert ("The flash_benchmarking table mixes records from 2 commits (`abc`, `def`)"
            in text)
    assert "no speed records in this preset" in text
    one = _facts(tmp_path, [], records=records[:1])
    text = " ".join(section_text("flash", one, link_base=tmp_path).split())
    assert "Every record of the flash_benchmarking table comes from commit `abc`." in text


# --- the pipeline plans the speed jobs -----------------------------------------------------

@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    return copy_checkout(tmp_path_factory.mktemp("speed") / "repo")


@pytest.mark.pipeline
@pytest.mark.parametrize("preset", ["smoke", "quick"])
def test_snakemake_plans_one_speed_job_per_group(checkout, preset):
    jobs = stale_jobs(checkout, "--config", f"preset={preset}")
    assert jobs["flash_speed"] == len(GROUPS) and jobs["flash_tables"] == 1


def test_a_record_from_before_a_target_says_what_is_missing(tmp_path):
    """A group's record measured before one of its targets existed (no cuDNN in the forward
    group): that target's row is `missing`, says which implementation and what to do, and the
    group's other target is judged as before."""
    shape = (16, 16384, 64)
    path = _record(tmp_path, "forward", [_measured("flash-triton", shape, 1.0, metric="forward_ms"),
                                         _measured("sdpa-flash", shape, 2.0, metric="forward_ms")],
                   [shape])
    rows = {r["target"]: r for r in speed_report.speed_rows([path])}
    assert rows["forward_vs_sdpa_flash"]["meets_target"] is True
    missing = rows["forward_vs_sdpa_cudnn"]
    assert missing["status"] == "missing" and missing["meets_target"] is None
    assert missing["reason"].startswith("SDPA cuDNN not in the group's record")
    assert "rerun the group's job" in missing["reason"]


def test_a_long_speed_table_is_summarised_one_row_per_target(tmp_path, monkeypatch):
    """Over MAX_SHOWN_ROWS rows, the text shows one row per target (how many meet it, the
    range, the farthest miss) and links the CSV that holds every row."""
    monkeypatch.setattr(tables, "MAX_SHOWN_ROWS", 5)
    speed = _speed_records(tmp_path)
    facts = _facts(tmp_path, speed)
    sp = facts["speed"]
    assert sp["whole"] is False and sp["rows"] == 16
    summary = speed_report.speed_summary(speed_report.speed_table(speed))
    assert len(summary) == len(summary.drop_duplicates(["target", "bound"])) < 15
    stretch = summary[(summary["target"] == "leaderboard forward+backward (stretch)")
                      & summary["bound"].str.contains("cuDNN")].iloc[0]
    assert stretch["met"] == "0 of 1" and stretch["farthest miss"].startswith("1.20x at")
    text = " ".join(section_text("flash", facts, link_base=tmp_path).split())
    assert "the speed table's CSV" in text and "Unmet:" not in text
    assert "| leaderboard forward+backward (stretch) " in sp["table"]


def test_a_graph_step_returns_the_gradients_and_leaves_grad_alone():
    """A CUDA graph keeps the addresses it captured, so the graph groups' step returns the
    gradients (torch.autograd.grad) instead of accumulating into .grad, which do_bench would
    reset between calls; the gradients are those of the accumulating step."""
    from cs336_systems.lm.attention import get_attention
    from cs336_systems.sections.flash.targets import GRAPH_METRIC
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 16, requires_grad=True) for _ in range(3))
    grad_o = torch.randn(2, 8, 16)
    attend = get_attention("eager")
    grads = speed.step_fn(attend, GRAPH_METRIC, (q, k, v, grad_o), True)()
    assert all(t.grad is None for t in (q, k, v))
    speed.step_fn(attend, "forward_backward_ms", (q, k, v, grad_o), True)()
    assert all(torch.allclose(g, t.grad) for g, t in zip(grads, (q, k, v)))


def test_a_bound_quoted_for_another_gpu_is_not_judged(tmp_path, monkeypatch):
    """The class's best 2025 entry is an H100's time: on an H200 ours is shown, not judged."""
    monkeypatch.setitem(ENV, "gpu", "NVIDIA H200")
    best = _rows(tmp_path)[("leaderboard_vs_class_best", "16x16384x64")]
    assert best["status"] == "not comparable" and best["meets_target"] is None
    assert best["reason"] == "the bound is an H100's; this ran on NVIDIA H200"


def test_each_graph_group_times_its_eager_twins_shapes_in_gpu_time():
    """A `<group>_graph` group is its eager group's shapes and step (a forward, or a
    forward+backward) replayed from CUDA graphs, which the host-bound check pairs row by row."""
    from cs336_systems.sections.flash.targets import TARGETS, graph_twin
    assert {name for name in GROUPS if name.endswith("_graph")} == {
        "long_graph", "model_shapes_graph", "batch_one_graph", "gluon_forward_graph"}
    for name, group in GROUPS.items():
        if name.endswith("_graph"):
            eager = GROUPS[name.removesuffix("_graph")]
            assert group.metric == {"forward_backward_ms": "forward_backward_graph_ms",
                                    "forward_ms": "forward_graph_ms"}[eager.metric], name
            assert group.case(CONFIG["defaults"]["flash"]) == eager.case(
                CONFIG["defaults"]["flash"]), name
    twins = {t.key: graph_twin(t) for t in TARGETS}
    assert twins["gluon_forward_vs_sdpa_cudnn"].key == "gluon_forward_graph_vs_sdpa_cudnn"
    assert twins["gluon_long_vs_sdpa_cudnn"].key == "gluon_long_graph_vs_sdpa_cudnn"
    assert twins["forward_vs_sdpa_flash"] is None      # no group "forward_graph"


def test_a_forward_graph_step_is_the_forward_alone():
    """The forward's graph twin replays the forward alone: its output, no gradient."""
    from cs336_systems.lm.attention import get_attention
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 16, requires_grad=True) for _ in range(3))
    attend = get_attention("eager")
    o = speed.step_fn(attend, "forward_graph_ms", (q, k, v, None), True)()
    assert torch.equal(o, attend(q, k, v, True)) and all(t.grad is None for t in (q, k, v))


def test_a_row_missed_eagerly_and_met_in_gpu_time_is_called_host_bound(tmp_path):
    """The long sequences' Gluon rows: at 4096 the eager step misses and the same steps
    replayed from CUDA graphs meet the bound (host time); at 16384 both miss (the kernels)."""
    short, long_ = (16, 4096, 64), (16, 16384, 128)
    graph = "forward_backward_graph_ms"
    eager = _record(tmp_path, "long", [
        _measured("flash-gluon", short, 0.79), _measured("sdpa-cudnn", short, 0.50),
        _measured("flash-gluon", long_, 8.4), _measured("sdpa-cudnn", long_, 7.2)],
        [short, long_])
    replayed = _record(tmp_path, "long_graph", [
        _measured("flash-gluon", short, 0.36, metric=graph),
        _measured("sdpa-cudnn", short, 0.40, metric=graph),
        _measured("flash-gluon", long_, 8.3, metric=graph),
        _measured("sdpa-cudnn", long_, 7.2, metric=graph)], [short, long_])
    facts = _facts(tmp_path, [eager, replayed])
    assert facts["speed"]["host_bound"] == [{
        "title": "Gluon forward+backward, long sequences", "shape": "16x4096x64",
        "target": "≤ 0.95x SDPA cuDNN", "eager": "1.58x", "graph": "0.90x",
        "graph_within_spread": False, "host": True, "eager_ms": "0.790 ms",
        "graph_ms": "0.360 ms"}]
    text = " ".join(section_text("flash", facts, link_base=tmp_path).split())
    assert ("Host-bound: Gluon forward+backward, long sequences at 16x4096x64 misses ≤ 0.95x "
            "SDPA cuDNN as an eager step (1.58x) and meets it in GPU time (0.90x, the same "
            "steps replayed from CUDA graphs). Our eager step took 0.790 ms and the replayed one "
            "0.360 ms: each eager round longer than every replayed one, so the host's time a "
            "step") in text
    assert "so another run could miss it" not in text
    # the GPU time's bound inside its spread: said
    noisy = _record(tmp_path, "long_graph", [
        _measured("flash-gluon", short, 0.379, std=0.01, metric=graph),
        _measured("sdpa-cudnn", short, 0.40, std=0.01, metric=graph)], [short])
    facts = _facts(tmp_path, [eager, noisy])
    assert facts["speed"]["host_bound"][0]["graph_within_spread"] is True
    text = " ".join(section_text("flash", facts, link_base=tmp_path).split())
    assert ("(0.95x, the same steps replayed from CUDA graphs; the bound within the measured "
            "spread of it, so another run could miss it)") in text
    # met eagerly too: nothing to explain
    met = _record(tmp_path, "long", [_measured("flash-gluon", short, 0.37),
                                     _measured("sdpa-cudnn", short, 0.40)], [short])
    assert _facts(tmp_path, [met, replayed])["speed"]["host_bound"] == []


def test_an_eager_miss_whose_step_took_no_longer_than_its_replay_is_not_host_bound(tmp_path):
    """A long step that misses eagerly by a hair and meets the bound replayed, an eager round
    no longer than a replayed one: the runs' spread, not the host."""
    shape, graph = (16, 16384, 128), "forward_backward_graph_ms"
    eager = _record(tmp_path, "long", [
        _measured("flash-gluon", shape, 6.84, std=0.24, rounds=[6.83, 6.84, 7.25]),
        _measured("sdpa-cudnn", shape, 7.17, std=0.57, rounds=[7.15, 8.14, 7.17])], [shape])
    replayed = _record(tmp_path, "long_graph", [
        _measured("flash-gluon", shape, 6.87, std=0.02, metric=graph, rounds=[6.88, 6.84, 6.87]),
        _measured("sdpa-cudnn", shape, 7.28, std=0.05, metric=graph)], [shape])
    facts = _facts(tmp_path, [eager, replayed])
    [note] = facts["speed"]["host_bound"]
    assert note["host"] is False and (note["eager"], note["graph"]) == ("0.95x", "0.94x")
    text = " ".join(section_text("flash", facts, link_base=tmp_path).split())
    assert "Host-bound" not in text
    assert ("Within the runs' spread: Gluon forward+backward, long sequences at 16x16384x128 "
            "misses ≤ 0.95x SDPA cuDNN as an eager step (0.95x)") in text
    assert ("Our eager step took 6.840 ms and the replayed one 6.870 ms: an eager round no "
            "longer than a replayed one, so the two runs differ by their spread") in text
    # a noisy eager step (one slow round) whose every round is still longer: the host's time
    slow = _record(tmp_path, "long", [
        _measured("flash-gluon", shape, 7.4, std=0.9, rounds=[8.9, 7.4, 6.9]),
        _measured("sdpa-cudnn", shape, 7.17, std=0.57)], [shape])
    assert _facts(tmp_path, [slow, replayed])["speed"]["host_bound"][0]["host"] is True


def test_the_counts_sentence_says_one_row_in_the_singular(tmp_path):
    """One row missed and one not measured: 'misses' and 'was', not 'miss' and 'were'."""
    ours = "flash-triton+compile"
    path = _record(tmp_path, "leaderboard", [
        _measured(ours, LB, 4.0), _measured("sdpa-flash+compile", LB, 6.0),
        _measured("sdpa-cudnn+compile", LB, 3.5),
        _measured("fa4+compile", LB, 0.0, status="skipped", message="no flash-attn-4")], [LB])
    text = " ".join(section_text("flash", _facts(tmp_path, [path]), link_base=tmp_path).split())
    assert "Of 4 rows, 2 meet their target, 1 misses it and 1 was not measured." in text
