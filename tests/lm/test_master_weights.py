"""Matmul weights held as bf16 copies of fp32 masters in the fused AdamW
(`lm.build.hold_master_weights`): the same training as fp32 weights under bf16 autocast, bit for
bit, loss and weights, over several steps on fresh random weights and tokens. On a CPU the
optimizer runs in Triton's interpreter."""

import pytest
import torch
from conftest import DEVICE

from cs336_systems.lm.build import build_lm_step, hold_master_weights, matmul_weights
from cs336_systems.lm.loss import cross_entropy
from cs336_systems.lm.model import build_model
from cs336_systems.lm.optimizer import build_optimizer
from cs336_systems.lm.precision import autocast_context
from cs336_systems.lm.step import random_batch

STEPS = 2  # two updates: the second starts from copies the kernel wrote
VOCAB = 512  # a small vocabulary: the interpreted optimizer's time goes to the embeddings


def _model(seed: int):
    torch.manual_seed(seed)
    return build_model("tiny", context_length=16, attention="sdpa", vocab_size=VOCAB,
                       device=DEVICE)


def _train(master_weights: bool, seed: int):
    model = _model(seed)
    optimizer = build_optimizer("adamw-fused", model.parameters(), lr=1e-2)
    if master_weights:
        hold_master_weights(optimizer, model, "bf16")
    token_ids, targets = random_batch(2, 16, torch.device(DEVICE), seed, vocab_size=VOCAB)
    losses = []
    for _ in range(STEPS):
        with autocast_context(DEVICE, "bf16"):
            loss = cross_entropy(model(token_ids), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    weights = {name: optimizer.state[p].get("master", p) for name, p in model.named_parameters()}
    return model, losses, weights


def test_bf16_copies_train_as_fp32_weights_under_autocast_bit_for_bit():
    seed = torch.randint(0, 2**16, ()).item()
    initial = dict(_model(seed).named_parameters())
    _, reference_losses, reference = _train(False, seed)
    model, losses, weights = _train(True, seed)
    copies = {id(p) for p in matmul_weights(model)}
    assert 0 < len(copies) < len(weights)  # the matmuls' weights, not the embedding or norms
    for name, p in model.named_parameters():
        assert p.dtype == (torch.bfloat16 if id(p) in copies else torch.float32), name
    assert all(torch.equal(a, b) for a, b in zip(losses, reference_losses)), \
        (losses, reference_losses)
    for name, w in weights.items():
        assert torch.equal(w, reference[name]), name
        assert not torch.equal(w, initial[name]), name  # every weight moved


def test_the_step_builder_takes_master_weights_and_refuses_what_cannot_hold_them():
    config = dict(size="tiny", context_length=16, attention="sdpa", batch_size=2,
                  mode="train-step", precision="bf16", seed=0, optimizer="adamw-fused",
                  master_weights=True)
    model, phases = build_lm_step(config, torch.device(DEVICE))
    assert {p.dtype for p in matmul_weights(model)} == {torch.bfloat16}
    for _, run in phases:
        run()
    with pytest.raises(ValueError, match="needs the fused AdamW"):
        build_lm_step({**config, "optimizer": "adamw"}, torch.device(DEVICE))
    with pytest.raises(ValueError, match="needs precision bf16 or fp16; got 'fp32'"):
        hold_master_weights(build_optimizer("adamw-fused", model.parameters()), model, "fp32")
