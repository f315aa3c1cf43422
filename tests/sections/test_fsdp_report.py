"""The fsdp section: the gather timing read from a synthetic CUDA trace whose answers are known,
the expected saving against the memory model, and the section's facts and prose on synthetic
records of the three variants."""

import pytest

from cs336_systems.analysis.memory_model import analytic_peak, step_memory
from cs336_systems.measure.collectives import gather_timing, summarize_gathers
from cs336_systems.measure.memory import GIB
from cs336_systems.pipeline.records import make_record
from cs336_systems.records import write_json_atomic
from cs336_systems.report.facts import jsonable
from cs336_systems.sections.fsdp import report as section
from support.cuda_traces import two_uses
from support.sections import section_text

ENV = {"device": "cuda", "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "git": "abc"}
SHAPE = {"size": "2.7b", "context_length": 512, "batch_size": 8, "world_size": 2}


def test_expected_peaks_scale_what_grows_with_the_parameters():
    expected = section.expected_peaks("2.7b", 8, 512, 2, sharded_bytes=3e9, replicated_bytes=1e9)
    parts = step_memory("2.7b", 4, 512, "train-step")
    assert expected["share"] == pytest.approx(2.5 / 4)
    scaled = {k: v * 2.5 / 4 if k in section.SHARDED_PARTS else v for k, v in parts.items()}
    assert expected["sharded_gib"] == pytest.approx(analytic_peak(scaled)["bytes"] / GIB)
    assert expected["unsharded_gib"] == pytest.approx(analytic_peak(parts)["bytes"] / GIB)
    assert expected["saving_gib"] > 0


def _record(path, variant, step_ms, peaks, extra=None, status="ok"):
    config = {**SHAPE, "variant": variant, "bucket_size_mb": 100.0 if variant == "bucketed"
              else None, "compute_dtype": None, "warmup_steps": 2, "measure_steps": 5,
              "seed": 0, "backend": "nccl", "trace": None}
    metrics = {} if status != "ok" else {
        **{f"{p}_ms_{s}": (step_ms / 5 if s == "mean" else 0.5)
           for p in ("forward", "backward", "communicate", "optimizer") for s in ("mean", "std")},
        "step_ms_mean": step_ms, "step_ms_std": 1.0, "peak_gib": peaks[0],
        "peak_gib_per_rank": peaks, "collective_busy_ms_per_step": 50.0,
        "sharded_bytes": 10 * GIB, "replicated_bytes": 0.001 * GIB, "sharded_weights": 226,
        "largest_sharded_bytes": 0.1 * GIB, **(extra or {})}
    write_json_atomic(path, make_record("fsdp", config, status, metrics, ENV,
                                        "CUDA out of memory" if status == "oom" else None))
    return str(path)


def _build(tmp_path, fsdp_status="ok"):
    rows = gather_timing(two_uses().events, {"a": ["a.weight"], "b": ["b.weight"]})
    timing = summarize_gathers(rows, steps=1)
    records = [_record(tmp_path / "fsdp.json", "fsdp", 500.0, [30.0, 30.5], timing, fsdp_status),
               _record(tmp_path / "fsdp2.json", "fsdp2", 400.0, [28.0, 28.0]),
               _record(tmp_path / "bucketed.json", "bucketed", 450.0, [60.0, 60.2])]
    outputs = {k: str(tmp_path / f"{k}.{'png' if 'figure' in k else 'csv'}")
               for k in ("table", "gather_table", "gather_figure")}
    facts = section.build({"records": records}, {"assignment": dict(SHAPE)}, outputs)
    return jsonable(facts), outputs


def test_section_compares_with_torch_and_accounts_for_the_saving(tmp_path):
    facts, outputs = _build(tmp_path)
    ref = facts["comparisons"]["fsdp2"]
    assert ref["step"]["word"] == "slower" and ref["step"]["factor"] == pytest.approx(1.25)
    assert ref["peak_ratio"] == pytest.approx(30.5 / 28.0)  # the larger rank's peak
    a = facts["accounting"]
    assert a["measured_saving_gib"] == pytest.approx(60.2 - 30.5)
    assert a["saving_ratio"] == pytest.approx(a["measured_saving_gib"]
                                              / a["expected"]["saving_gib"])
    t = facts["timing"]
    assert (t["hidden"], t["profiled"], t["all_hidden"]) == (1, 2, False)
    assert facts["coverage"]["fsdp"]["status"] == "answered"
    assert facts["coverage"]["fsdp_accounting"]["status"] == "answered"
    text = " ".join(section_text("fsdp", facts).split())
    assert "our step is 1.25x slower (400.0 ms for FSDP2)" in text
    assert "1 of 2 gathers finished before then" in text
    assert "waited 0.10 ms per step" in text
    for path in outputs.values():
        assert (tmp_path / path).exists()


def test_a_failed_fsdp_run_leaves_the_accounting_unanswered(tmp_path):
    facts, _ = _build(tmp_path, fsdp_status="oom")
    assert facts["accounting"] is None and facts["timing"] is None
    assert facts["coverage"]["fsdp_accounting"]["status"] == "partly answered"
    text = section_text("fsdp", facts)
    assert "Not measured: fsdp, oom" in " ".join(text.split())


def test_the_kept_step_is_timed_from_its_own_first_gather():
    rows = gather_timing(two_uses().events, {"a": ["a.weight"], "b": ["b.weight"]})
    shifted = [{**r, **{k: v + 1e6 for k, v in r.items() if k.endswith("_us") and k != "wait_us"}}
               for r in rows]
    kept = summarize_gathers(rows + shifted, steps=2)["gather_timing"]
    assert [r["issued_us"] for r in kept] == [0.0, 20.0]
    assert kept[1]["gather_end_us"] == 300 and kept[1]["wait_us"] == 100
