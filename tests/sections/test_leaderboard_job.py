"""The leaderboard's job on a CPU: a variant this machine cannot run is `skipped` with the reason;
the model as written runs in-process; and the two-GPU path (torchrun, FSDP2 on every layer and
the root, our fused AdamW on the shards, the input/output check on each rank) runs on two CPU
ranks with gloo at the tiny shape, so that two GPUs need nothing but the command."""

import json

import pytest
import torch

from cs336_systems.lm.model import train_step_flops
from cs336_systems.lm.sizes import LEADERBOARD_SHAPES
from cs336_systems.sections.leaderboard import step_timing, time_leaderboard

TINY = ["--shape", "tiny-8b", "--context-length", "16", "--check-tokens", "8",
        "--precision", "fp32", "--warmup-steps", "1", "--measure-steps", "5", "--device", "cpu"]


def _run(tmp_path, variant, *extra):
    out = tmp_path / f"{variant}.json"
    time_leaderboard.main(["--variant", variant, *TINY, *extra, "--output", str(out)])
    return json.loads(out.read_text())


def test_a_part_this_machine_lacks_is_skipped_with_the_reason(tmp_path):
    record = _run(tmp_path, "stock", "--world-size", "1")
    assert record["status"] == "skipped"
    assert "needs CUDA" in record["message"]


def test_a_peers_loss_is_skipped_with_the_reason_where_it_cannot_run(tmp_path):
    record = _run(tmp_path, "ours-but-liger-loss", "--world-size", "1")
    assert record["status"] == "skipped" and "Liger fused linear CE" in record["message"]


def test_hugging_faces_stock_step_says_what_it_lacks(tmp_path, monkeypatch):
    """Without transformers (not a dependency) the stock-hf variant is skipped for that; with
    it, on a CPU, for the compiled layers and the fused optimizer that need CUDA."""
    from cs336_systems.lm import hf_llama
    monkeypatch.setattr(hf_llama.importlib.util, "find_spec", lambda name: None)
    record = _run(tmp_path, "stock-hf", "--world-size", "1")
    assert record["status"] == "skipped" and "transformers is not installed" in record["message"]
    monkeypatch.undo()
    if hf_llama.unavailable_reason() is None:
        record = _run(tmp_path, "stock-hf", "--world-size", "1")
        assert record["status"] == "skipped" and "needs CUDA" in record["message"]


def test_the_model_as_written_runs_in_process(tmp_path):
    record = _run(tmp_path, "plain", "--world-size", "1")
    assert record["status"] == "ok", record.get("message")
    metrics = record["metrics"]
    assert len(metrics["step_ms_samples"]) == 5
    assert metrics["layers"] == 4 and metrics["parameters"] > 0
    assert "check_loss" not in metrics  # nothing to check the plain model against


@pytest.mark.pipeline  # starts ranks of a process group: the full test command runs it
def test_two_ranks_shard_train_and_check_with_gloo(tmp_path):
    # one step: Triton's interpreter runs every kernel here (the arguments' last value wins)
    record = _run(tmp_path, "ours-but-eager", "--world-size", "2", "--warmup-steps", "0",
                  "--measure-steps", "1")
    assert record["status"] == "ok", record.get("message")
    metrics = record["metrics"]
    assert len(metrics["peak_gib_per_rank"]) == 2
    # FA2 (interpreted), selective recompute and the chunked loss against the plain model,
    # through FSDP2's gathers, in fp32
    assert metrics["check_grad_max_rel_diff"] < 1e-4
    assert metrics["check_loss_abs_diff"] < 1e-5
    # two sequences, one per rank: twice the FLOPs of one
    one = train_step_flops(LEADERBOARD_SHAPES["tiny-8b"], 1, 16)
    assert metrics["model_flops"] == 2 * one


def test_bad_arguments_fail_with_a_usage_message(tmp_path, capsys):
    with pytest.raises(SystemExit):
        time_leaderboard.main(["--variant", "ours", "--shape", "tiny-8b", "--context-length",
                               "4096", "--output", str(tmp_path / "r.json")])
    assert "exceeds shape 'tiny-8b'" in capsys.readouterr().err


def test_an_optimizer_stepping_in_backward_gets_a_group_per_layer_and_its_prefetch(tmp_path):
    from cs336_systems.lm.offloaded_adamw import OffloadedAdamW
    from cs336_systems.sections.leaderboard.runs import VARIANTS
    config = {"shape": "tiny-8b", "context_length": 16, "layers": None, "seed": 0,
              "precision": "fp32"}
    model, lm_loss = step_timing.build(VARIANTS["plain"], config, torch.device("cpu"), 1)
    optimizer = step_timing.build_step_optimizer("adamw-offloaded", model, lm_loss)
    assert isinstance(optimizer, OffloadedAdamW)
    assert len(optimizer.param_groups) == len(model.layers) + 1  # each layer, then the rest
    fetched = []
    optimizer.prefetch = lambda: fetched.append(True)
    lm_loss(*torch.randint(0, 64, (2, 1, 16)))  # the final norm's forward fetches
    assert fetched == [True]
    plain = step_timing.build_step_optimizer("adamw-fused", model, lm_loss)
    assert len(plain.param_groups) == 1


def test_a_profiled_step_on_a_cpu_adds_no_kernel_classes_and_no_gpu_state(tmp_path):
    record = _run(tmp_path, "plain", "--world-size", "1", "--profile")
    assert record["status"] == "ok", record.get("message")
    assert not any(k.startswith(("kernel_ms_", "sm_clock", "gpu_state"))
                   for k in record["metrics"])
