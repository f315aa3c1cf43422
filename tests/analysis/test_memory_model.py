"""The analytic memory model against the model it describes (the saved-tensor accounting
against it is in tests/test_residuals.py)."""

import pytest
import torch

from cs336_systems.analysis.memory_model import (
    FP32,
    analytic_peak,
    block_gradient_bytes,
    block_parameters,
    step_memory,
)
from cs336_systems.lm.model import MODEL_SIZES, VOCAB_SIZE, build_model, parameter_count


@pytest.mark.parametrize("size", ["tiny", "small", "2.7b"])
def test_block_parameters_are_a_real_blocks(size):
    block = build_model(size, context_length=8, device="meta").layers[0]
    assert block_parameters(MODEL_SIZES[size]) == sum(p.numel() for p in block.parameters())


def test_one_blocks_backward_produces_the_gradients_the_model_says():
    torch.manual_seed(0)
    batch, seq = 3, 11
    block = build_model("tiny", context_length=seq).layers[0]
    x = torch.randn(batch, seq, MODEL_SIZES["tiny"].d_model, requires_grad=True)
    block(x).square().sum().backward()
    measured = {"parameter gradients": sum(p.grad.numel() * p.grad.element_size()
                                           for p in block.parameters()),
                "input gradient": x.grad.numel() * x.grad.element_size()}
    assert block_gradient_bytes(MODEL_SIZES["tiny"], batch, seq) == measured


def test_step_parts_follow_the_mode():
    weights = parameter_count("small") * FP32
    forward = step_memory("small", 4, 128, "forward")
    assert forward == {"weights": weights, "logits": 4 * 128 * VOCAB_SIZE * FP32}
    backward = step_memory("small", 4, 128, "forward-backward")
    assert backward["gradients"] == weights and "optimizer state" not in backward
    train = step_memory("small", 4, 128, "train-step")
    assert train["optimizer state"] == 2 * weights and train["optimizer temporary"] == weights
    assert train["saved activations"] == backward["saved activations"] > 0
    with pytest.raises(ValueError, match="unknown mode 'inference'.*forward"):
        step_memory("small", 4, 128, "inference")


def test_the_peak_is_the_larger_stage():
    short = step_memory("2.7b", 4, 128, "train-step")  # activations small: the optimizer step
    peak = analytic_peak(short)
    assert peak["stage"] == "optimizer step"
    assert peak["bytes"] == (short["weights"] + short["optimizer state"] + short["gradients"]
                             + short["optimizer temporary"])
    long = step_memory("2.7b", 4, 2048, "forward-backward")  # activations dominate
    assert analytic_peak(long)["stage"] == "end of forward"
    assert analytic_peak(step_memory("tiny", 2, 8, "forward"))["stage"] == "forward"
