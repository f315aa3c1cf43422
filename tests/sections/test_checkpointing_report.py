"""The gradient_checkpointing section's report: the simulation's answers, and the block-size
table on synthetic records whose answers are known (an out-of-memory row among them)."""

from pathlib import Path

import pytest

from cs336_systems.pipeline.records import make_record
from cs336_systems.records import write_json_atomic
from cs336_systems.report.facts import jsonable
from cs336_systems.sections.checkpointing import report as section
from support.checkout import project_yaml
from support.sections import section_text

DEFAULTS = project_yaml()["defaults"]["checkpointing"]
SIMULATION = {"max_blocks": 16, "brute_force_max_blocks": 3, "activations": 1, "boundary": 1}
ENV = {"device": "cuda", "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.5", "git": "abc"}
CONFIG = {"size": "2.7b", "context_length": 2048, "batch_size": 4, "mode": "forward-backward",
          "precision": "fp32", "attention": "eager", "warmup_steps": 2, "measure_steps": 3,
          "seed": 0}


def _step(path, k, peak, ms, status="ok"):
    config = {**CONFIG, "checkpoint_block_size": k}
    metrics = {} if status != "ok" else {
        "peak_gib": peak, "start_gib": 27.0, "above_start_gib": peak - 27.0,
        "step_ms_mean": ms, "step_ms_std": 0.01 * ms, "peak_source": "cuda allocator",
        "num_layers": 32, "parameter_gradient_gib": 12.7, "device_gib": 139.8,
        "checkpoints": -(-32 // k) if k else 0}
    write_json_atomic(path, make_record("checkpointing", config, status, metrics, ENV,
                                        "CUDA out of memory" if status == "oom" else None))
    return str(path)


def _nested(path):
    s, a = 1024, 32 * 1024
    rows = [{"strategy": name, "blocks": n, "tree": "", "peak_bytes": peak + 8 * s,
             "block_calls": calls, "simulated_peak_bytes": peak, "simulated_compute": calls}
            for name in ("none", "left_nested", "optimal")
            for n, peak, calls in ((1, a + 3 * s, 1), (4, a + 4 * s if name != "none"
                                                       else 4 * (a + s) + 2 * s, 4))]
    write_json_atomic(path, make_record(
        "checkpointing", {"size": "tiny", "context_length": 64, "batch_size": 2,
                          "blocks": [1, 4], "attention": "eager", "seed": 0}, "ok",
        {"units": {"boundary": s, "activations": a}, "rows": rows,
         "peak_source": "live tensor bytes (CPU stand-in)"}, {**ENV, "device": "cpu"}))
    return str(path)


def _build(tmp_path, steps, nested=True):
    outputs = {name: str(tmp_path / f"{name}.{'png' if 'figure' in name else 'csv'}")
               for name in ("simulation_table", "simulation_figure", "nested_table",
                            "step_table", "step_figure")}
    records = {"records": steps, "nested": [_nested(tmp_path / "n.json")] if nested else []}
    facts = jsonable(section.build(records, {"simulation": SIMULATION, "assignment": DEFAULTS},
                                   outputs))
    for name, path in outputs.items():
        assert Path(path).is_file(), name
    return facts, section_text("checkpointing", facts, link_base=tmp_path)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Sizes 1, 2, 4, 8, 32 and none; none runs out of memory, 2 has the least peak."""
    out = tmp_path_factory.mktemp("ckpt")
    steps = [_step(out / f"b{k}.json", k, peak, ms) for k, peak, ms in
             ((1, 36.0, 1300.0), (2, 35.5, 1310.0), (4, 40.0, 1290.0), (8, 50.0, 1280.0),
              (32, 130.0, 1270.0))]
    steps.append(_step(out / "bnone.json", None, None, None, status="oom"))
    return out, steps, _build(out, steps)


def test_simulation_answers_part_a(run):
    _, _, (facts, text) = run
    sim = facts["simulation"]
    growth = sim["growth"]
    assert growth["none"]["peak"]["class"] == "N" and growth["none"]["compute"]["class"] == "N"
    assert growth["one_level_sqrt"]["peak"]["class"] == "√N"
    assert growth["bisection"]["peak"]["class"] == "log N"
    assert growth["left_nested"]["peak"]["class"] == "1"
    assert growth["optimal"]["peak"]["class"] == "1"
    assert growth["optimal"]["compute"]["class"] == "N²"
    assert growth["optimal"]["terms_text"] == "A + 4s"
    opt = sim["optimum"]
    assert opt["equals_left_nested"] == opt["count"] == 16 and opt["peak"] == 5
    assert opt["chain_then_plain"] == opt["chain_then_plain_of"] == 15
    assert sim["brute_force"]["agrees"] and sim["brute_force"]["trees"] == 48
    places = {p["strategy"]: p for p in sim["front"]["places"]}
    assert places["optimal"]["on_front"] and places["none"]["on_front"]
    assert not places["bisection"]["on_front"]
    assert "It is the same for every N from 2 to 16: O(1) memory." in text
    assert "| least peak (the programme) | 4 / 1 |" in text


def test_nested_measurement_beside_the_simulation(run):
    _, _, (facts, text) = run
    nested = facts["nested"]
    assert nested["measured"] and nested["calls_match"]
    assert nested["offset_min"] == nested["offset_max"] == 8.0
    assert "equal the simulated compute in every one of the" in text


def test_best_block_size_neighbours_and_the_oom_reference(run):
    _, _, (facts, text) = run
    st = facts["steps"]
    assert st["best"]["block_size"] == 2
    assert st["best"]["next_smaller"] == 1 and st["best"]["next_larger"] == 4
    assert st["best"]["minus_one_measured"] and not st["best"]["plus_one_measured"]
    assert st["best"]["add"] == [3]
    assert st["none_status"] == "oom" and not st["reference_is_none"]
    assert st["reference"] == "k=32"  # the fastest that ran
    assert st["time_ratio_min"] == pytest.approx(1280 / 1270)
    # 1% spreads: 1300 and 1310 ms are beyond 1270 ± 12.7, 1290 and 1280 ms inside
    assert st["slower"] == 2 and st["within"] == 2 and st["faster"] == 0
    assert facts["prediction"]["best"] == "1"
    assert not st["prediction_agrees"]
    assert "**The least peak is at k = 2**" in text and "add 3 to" in text
    assert "No checkpointing did not fit (oom, on a device of 139.8 GiB)" in text
    assert "block size none: oom (CUDA out of memory)" in text
    coverage = facts["coverage"]["gradient_checkpointing"]
    assert coverage["status"] == "partly answered"  # sizes 3, 6, 16 are not in the run
    assert "block sizes 3, 6, 16" in coverage["note"] and "1 of 7 configurations oom" in \
        coverage["note"]


def test_best_at_the_smallest_size_and_no_checkpointing_as_reference(tmp_path):
    steps = [_step(tmp_path / f"b{k}.json", k, peak, ms) for k, peak, ms in
             ((1, 35.0, 1300.0), (2, 38.0, 1250.0), (None, 90.0, 1000.0))]
    facts, text = _build(tmp_path, steps)
    st = facts["steps"]
    assert st["best"]["block_size"] == 1 and st["best"]["smallest_possible"]
    assert st["best"]["add"] == [] and st["reference_is_none"]
    assert st["saving"]["amount"] == pytest.approx(55.0)
    assert st["best"]["time"]["word"] == "slower"
    assert st["prediction_agrees"]
    assert "No smaller block size exists" in text and "lowers the peak by" in text


def test_a_run_with_every_step_skipped_still_answers_part_a(tmp_path):
    steps = [_step(tmp_path / f"b{k}.json", k, None, None, status="skipped") for k in (1, None)]
    facts, text = _build(tmp_path, steps, nested=False)
    assert not facts["steps"]["any_ok"] and not facts["nested"]["measured"]
    assert facts["coverage"]["gradient_checkpointing"]["status"] == "skipped"
    assert "_(no step of (b) ran in this preset)_" in text
    assert "What the simulator predicts" in text
