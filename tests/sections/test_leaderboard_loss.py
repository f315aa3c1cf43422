"""The leaderboard's loss benchmark: the job on a CPU (ours and the whole logits measured and
agreeing with fp32, the stock fused losses skipped with the reason where not installed), and
its facts and prose on synthetic records: other numbers give other words."""

import json

import pytest

from cs336_systems.pipeline.records import make_record
from cs336_systems.records import write_json_atomic
from cs336_systems.sections.leaderboard import report as section
from cs336_systems.sections.leaderboard import time_loss
from support.sections import section_text

ENV = {"device": "cuda", "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "git": "abc"}
CONFIG = {"shape": "8b", "tokens": 32768, "losses": ["chunked", "whole-logits", "liger"],
          "precision": "bf16", "warmup_steps": 2, "measure_steps": 10, "seed": 0}


def test_the_job_on_a_cpu_measures_ours_and_says_why_the_stock_losses_did_not_run(tmp_path):
    out = tmp_path / "loss.json"
    record = time_loss.main(["--shape", "tiny-8b", "--tokens", "48", "--precision", "fp32",
                             "--warmup-steps", "0", "--measure-steps", "2", "--device", "cpu",
                             "--output", str(out)])
    assert record["status"] == "ok" and json.loads(out.read_text())["status"] == "ok"
    rows = {r["loss"]: r for r in record["metrics"]["losses"]}
    assert list(rows) == ["whole-logits", "chunked", "liger", "cut-cross-entropy"]
    for name in ("whole-logits", "chunked"):
        assert rows[name]["status"] == "ok" and rows[name]["step_ms_median"] > 0
        assert rows[name]["loss_abs_diff"] < 1e-5 and rows[name]["grad_weight_rel_diff"] < 1e-5
    for name in ("liger", "cut-cross-entropy"):  # not installed here, or no CUDA
        assert rows[name]["status"] == "skipped" and rows[name]["message"]


def _loss_record(tmp_path, rows: dict) -> str:
    losses = [{"loss": name, "label": name, "status": "ok", "step_ms_mean": ms,
               "step_ms_std": std, "step_ms_median": ms, "step_ms_min": ms - std,
               "step_ms_max": ms + std, "added_gib": gib, "loss_abs_diff": 1e-3,
               "grad_hidden_rel_diff": 1e-3, "grad_weight_rel_diff": 1e-3}
              for name, (ms, std, gib) in rows.items()]
    path = tmp_path / "leaderboard_loss.json"
    write_json_atomic(path, make_record("leaderboard_loss", CONFIG, "ok", {
        "losses": losses, "d_model": 4096, "vocab_size": 151936, "logits_gib": 18.5}, ENV))
    return str(path)


def _facts(tmp_path, loss_path):
    facts = section.build({"records": [], "loss": [loss_path]}, {"assignment": {}},
                          {"table": str(tmp_path / "t.csv"),
                           "loss_table": str(tmp_path / "loss.csv")})
    return facts["loss"], " ".join(section_text("leaderboard", facts, link_base=tmp_path).split())


@pytest.mark.parametrize("ours, word, meets", [
    ((90.0, 1.0, 1.0), "1.11x faster", "meets"),     # faster, less memory
    ((120.0, 1.0, 1.0), "1.20x slower", "misses"),   # slower beyond the spread
    ((100.5, 1.0, 3.0), "a tie", "misses"),          # a tie, but more memory
])
def test_ours_against_liger_gives_its_words_from_the_numbers(tmp_path, ours, word, meets):
    path = _loss_record(tmp_path, {"chunked": ours, "liger": (100.0, 1.0, 2.0),
                                   "whole-logits": (300.0, 2.0, 40.0)})
    facts, text = _facts(tmp_path, path)
    (liger,) = facts["stock"]
    assert liger["memory_ratio"] == pytest.approx(ours[2] / 2.0)
    assert f"against liger (100.0 ms, 2.00 GiB) it is {word}" in text
    assert f"so it {meets} the target of no slower at no more memory" in text
    assert "no more memory. The whole logits, as the model is written, take 300.0 ms" in text
    assert (tmp_path / "loss.csv").is_file()


def test_no_loss_record_says_nothing_in_the_writeup(tmp_path):
    facts = section.build({"records": []}, {"assignment": {}}, {"table": str(tmp_path / "t.csv")})
    assert facts["loss"] == {"measured": False}
    assert "LM head and its loss alone**" not in section_text("leaderboard", facts, tmp_path)


def test_the_target_is_said_against_liger_alone(tmp_path):
    """Cut Cross-Entropy is compared (time and memory), but the target names Liger's loss."""
    path = _loss_record(tmp_path, {"chunked": (100.0, 1.0, 2.0), "liger": (100.0, 1.0, 2.0),
                                   "cut-cross-entropy": (400.0, 1.0, 1.5)})
    facts, text = _facts(tmp_path, path)
    assert [s["is_target"] for s in facts["stock"]] == [True, False]
    assert "1.00x its memory, so it meets the target" in text
    assert "1.33x its memory, so it" not in text
    assert "against cut-cross-entropy (400.0 ms, 1.50 GiB) it is 4.00x faster at 1.33x its memory." \
        in text
