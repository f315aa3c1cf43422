import pytest
import torch
import torch.nn.functional as F

from cs336_systems.lm.adamw import AdamW
from cs336_systems.lm.loss import cross_entropy
from cs336_systems.lm.model import build_model

VOCAB = 512  # a small vocabulary: the embeddings would be most of the work


def _train(optimizer_cls, steps=6, **kwargs):
    torch.manual_seed(1234)
    model = build_model("tiny", context_length=16, vocab_size=VOCAB, dtype=torch.float64)
    optimizer = optimizer_cls(model.parameters(), **kwargs)
    generator = torch.Generator().manual_seed(99)
    for _ in range(steps):
        token_ids = torch.randint(0, VOCAB, (2, 16), generator=generator)
        loss = cross_entropy(model(token_ids[:, :-1]), token_ids[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


@pytest.mark.parametrize("kwargs", [
    dict(lr=1e-3, weight_decay=0.01),
    dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
    dict(lr=1e-2, weight_decay=0.0),
])
def test_adamw_matches_torch(kwargs):
    ours, reference = _train(AdamW, **kwargs), _train(torch.optim.AdamW, **kwargs)
    for (name, p), q in zip(ours.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)


def test_adamw_skips_parameters_without_gradients_and_handles_late_groups():
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(3))
    a_ref, b_ref = (torch.nn.Parameter(t.detach().clone()) for t in (a, b))
    ours, ref = AdamW([a], lr=0.1), torch.optim.AdamW([a_ref], lr=0.1)
    for step in range(4):
        if step == 2:  # a group added mid-training has its own step count
            ours.add_param_group({"params": [b]})
            ref.add_param_group({"params": [b_ref]})
        for opt, params in ((ours, (a, b)), (ref, (a_ref, b_ref))):
            opt.zero_grad()
            (params[0].sin().sum() + (params[1] ** 2).sum()).backward()
            opt.step()
    torch.testing.assert_close(a, a_ref)
    torch.testing.assert_close(b, b_ref)


def test_adamw_rejects_bad_hyperparameters():
    with pytest.raises(ValueError, match="lr"):
        AdamW([torch.nn.Parameter(torch.randn(2))], lr=-1.0)
    with pytest.raises(ValueError, match="betas"):
        AdamW([torch.nn.Parameter(torch.randn(2))], betas=(0.9, 1.0))


def test_cross_entropy_matches_torch_on_large_logits():
    logits = torch.randn(4, 7, 50) * 30
    targets = torch.randint(0, 50, (4, 7))
    expected = F.cross_entropy(logits.reshape(-1, 50), targets.reshape(-1))
    torch.testing.assert_close(cross_entropy(logits, targets), expected)


def test_cross_entropy_is_fp32_for_bf16_logits():
    logits = torch.randn(3, 11).to(torch.bfloat16)
    targets = torch.randint(0, 11, (3,))
    loss = cross_entropy(logits, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, F.cross_entropy(logits.float(), targets))
