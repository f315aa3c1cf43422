"""lm/levers.py: each lever leaves the model's loss and gradients as they are, against the model
as written on the same weights and batch (float64 reference where it matters), and the switch
back to the plain model restores every lever."""

import pytest
import torch

from cs336_systems.lm.levers import (
    CheckpointedLayer,
    LanguageModelLoss,
    apply_layer_levers,
    plain,
    set_attention,
)
from cs336_systems.lm.model import TransformerLM

VOCAB, CONTEXT = 97, 24


def _model(attention="sdpa", dtype=torch.float32):
    torch.manual_seed(0)
    return TransformerLM(VOCAB, CONTEXT, d_model=32, num_layers=3, num_heads=4, d_ff=48,
                         attention=attention, dtype=dtype)


def _batch(seed=1):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (2, CONTEXT), generator=generator),
            torch.randint(0, VOCAB, (2, CONTEXT), generator=generator))


def _loss_and_grads(lm_loss, ids, targets):
    loss = lm_loss(ids, targets)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in lm_loss.named_parameters()}
    lm_loss.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize("recompute, chunked, attention", [
    ("elementwise", True, "sdpa"),
    ("all", True, "eager"),
    ("elementwise", False, "flash-triton"),   # Triton's interpreter on a CPU, fp32
    ("none", True, "flash-triton"),
    ("all-but-attention", True, "flash-triton"),
])
def test_levers_keep_the_loss_and_gradients(recompute, chunked, attention):
    model = _model(attention)
    apply_layer_levers(model, recompute=recompute)
    _assert_same_as_plain(model, LanguageModelLoss(model, chunked=chunked))


def _assert_same_as_plain(model, lm_loss):
    """The levers' loss and gradients against the same model with every lever off."""
    ids, targets = _batch()
    loss, grads = _loss_and_grads(lm_loss, ids, targets)
    with plain(model, lm_loss):
        reference_loss, reference = _loss_and_grads(lm_loss, ids, targets)
    torch.testing.assert_close(loss, reference_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == reference.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], reference[name], rtol=1e-4, atol=1e-6,
                                   msg=name)


def test_the_chunked_loss_is_the_float64_cross_entropy_of_the_models_logits():
    """Against float64 logits of the model as written (its sums run in fp32)."""
    model = _model("eager", torch.float64)
    lm_loss = LanguageModelLoss(model, chunked=True)
    ids, targets = _batch()
    logits = model(ids)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    torch.testing.assert_close(lm_loss(ids, targets).double(), expected, rtol=1e-6, atol=0)


def test_a_lever_that_changed_the_output_would_be_caught():
    """The comparison can fail: a model whose weights differ gives other gradients."""
    model = _model()
    lm_loss = LanguageModelLoss(model, chunked=True)
    ids, targets = _batch()
    _, grads = _loss_and_grads(lm_loss, ids, targets)
    with torch.no_grad():
        model.layers[1].ffn.w1.weight.mul_(1.01)
    _, other = _loss_and_grads(lm_loss, ids, targets)
    assert not torch.allclose(grads["model.layers.0.ffn.w1.weight"],
                              other["model.layers.0.ffn.w1.weight"], rtol=1e-4, atol=1e-6)


def test_plain_switches_every_lever_off_and_back_on():
    model = _model("flash-triton")
    apply_layer_levers(model, recompute="elementwise")
    lm_loss = LanguageModelLoss(model, chunked=True)
    layers = [m for m in model.modules() if isinstance(m, CheckpointedLayer)]
    assert len(layers) == 3
    kernel = model.layers[0].layer.attn.attention
    with plain(model, lm_loss):
        assert not any(layer.enabled for layer in layers) and not lm_loss.chunked
        assert model.layers[0].layer.attn.attention is not kernel
    assert all(layer.enabled for layer in layers) and lm_loss.chunked
    assert model.layers[0].layer.attn.attention is kernel


def test_bad_levers_say_what_is_allowed():
    with pytest.raises(ValueError, match="allowed: none, all, elementwise, all-but-attention"):
        apply_layer_levers(_model(), recompute="some")
    grouped = TransformerLM(VOCAB, CONTEXT, 32, 2, 4, 48, checkpoint_block_size=1)
    with pytest.raises(ValueError, match="checkpoint_block_size"):
        apply_layer_levers(grouped, recompute="all")
    with pytest.raises(ValueError, match="unknown attention"):
        set_attention(_model(), "fastest")


def test_a_selective_share_keeps_the_matmuls_of_the_last_layers_only():
    model = TransformerLM(VOCAB, CONTEXT, d_model=32, num_layers=4, num_heads=4, d_ff=48,
                          attention="sdpa")
    apply_layer_levers(model, recompute="elementwise", selective_share=0.5)
    kept = ["context_fn" in layer.options for layer in model.layers]
    assert kept == [False, False, True, True]
    _assert_same_as_plain(model, LanguageModelLoss(model, chunked=True))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        apply_layer_levers(_model(), recompute="elementwise", selective_share=1.5)


def test_the_layers_outside_the_selective_share_recompute_as_others_says():
    model = TransformerLM(VOCAB, CONTEXT, d_model=32, num_layers=4, num_heads=4, d_ff=48,
                          attention="sdpa")
    apply_layer_levers(model, recompute="elementwise", selective_share=0.25,
                       others="all-but-attention")
    policies = [layer.options["context_fn"].args[0].__name__ for layer in model.layers]
    assert policies == ["_save_attention"] * 3 + ["_save_matmuls"], policies
    _assert_same_as_plain(model, LanguageModelLoss(model, chunked=True))
    with pytest.raises(ValueError, match="unknown others 'some'"):
        apply_layer_levers(_model(), recompute="elementwise", others="some")


def test_layers_outside_the_share_may_keep_every_activation():
    """others="none" (the leaderboard's ...-selective-others-kept variants): the first layers
    are not checkpointed at all, the last keep their matmuls' outputs."""
    model = TransformerLM(VOCAB, CONTEXT, d_model=32, num_layers=4, num_heads=4, d_ff=48,
                          attention="sdpa")
    apply_layer_levers(model, recompute="elementwise", selective_share=0.5, others="none")
    wrapped = [isinstance(layer, CheckpointedLayer) for layer in model.layers]
    assert wrapped == [False, False, True, True]
    _assert_same_as_plain(model, LanguageModelLoss(model, chunked=True))
