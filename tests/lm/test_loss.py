"""The chunked LM-head cross-entropy against the plain one: the same loss and gradients, and no
(tokens, vocab) tensor kept for backward."""

import pytest
import torch

from cs336_systems.lm.loss import (
    MIN_FP32_CHUNK_TOKENS,
    cross_entropy,
    default_chunk,
    linear_cross_entropy,
)


def _case(tokens=(3, 11), d=24, vocab=101, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    hidden = torch.randn(*tokens, d, dtype=dtype, requires_grad=True)
    weight = torch.randn(vocab, d, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, vocab, tokens)
    return hidden, weight, targets


def _grads(loss_fn, hidden, weight, targets):
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    loss = loss_fn(h, w, targets)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def _plain(h, w, t):
    return cross_entropy(h @ w.T, t)


@pytest.mark.parametrize("chunk", [1, 7, 33, 4096, None])
def test_matches_plain_cross_entropy_in_fp32(chunk):
    """Chunks of 1 token, of sizes that do not divide the 33 tokens, and one chunk for all."""
    case = _case()
    expected = _grads(_plain, *case)
    got = _grads(lambda h, w, t: linear_cross_entropy(h, w, t, chunk=chunk), *case)
    for out, ref in zip(got, expected):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_scales_by_the_incoming_gradient():
    hidden, weight, targets = _case(seed=1)
    (3.0 * linear_cross_entropy(hidden, weight, targets, chunk=5)).backward()
    h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    (3.0 * _plain(h, w, targets)).backward()
    torch.testing.assert_close(hidden.grad, h.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weight.grad, w.grad, rtol=1e-5, atol=1e-6)


def test_under_autocast_matches_plain_within_bf16_rounding():
    """fp32 weights under bf16 autocast, as the training step runs: matmuls in bf16, softmax in
    fp32; gradients come back in the inputs' dtypes."""
    case = _case(tokens=(2, 64), d=64, vocab=300, seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = _grads(_plain, *case)
        got = _grads(lambda h, w, t: linear_cross_entropy(h, w, t, chunk=24), *case)
    assert got[1].dtype == got[2].dtype == torch.float32
    for out, ref in zip(got, expected):
        assert ((out.float() - ref.float()).norm() / ref.float().norm()) < 2e-2


def test_keeps_no_logits_for_backward():
    """Saved for backward: dL/dhidden and dL/dW, nothing of (tokens, vocab)."""
    hidden, weight, targets = _case(tokens=(4, 16), vocab=999)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t,
                                                  lambda t: t):
        linear_cross_entropy(hidden, weight, targets, chunk=8)
    assert saved and all(999 not in shape or shape == weight.shape for shape in saved), saved
    assert (64, 999) not in saved


def test_shapes_that_disagree_say_so():
    hidden, weight, targets = _case()
    with pytest.raises(ValueError, match="must agree"):
        linear_cross_entropy(hidden, weight[:, :5], targets)
    with pytest.raises(ValueError, match="must agree"):
        linear_cross_entropy(hidden, weight, targets[:, :3])
    with pytest.raises(ValueError, match="at least 1 token"):
        linear_cross_entropy(hidden, weight, targets, chunk=0)


def test_a_16_bit_weight_accumulates_its_gradient_in_its_dtype():
    """A bf16 head keeps no fp32 (vocab, d) buffer (Liger's memory); dW stays within bf16
    rounding of the float64 gradient, chunk after chunk."""
    hidden, weight, targets = _case(tokens=(4, 64), d=32, vocab=257, seed=3)
    expected = _grads(_plain, hidden.double(), weight.double(), targets)
    h16, w16 = (t.detach().bfloat16() for t in (hidden, weight))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        got = _grads(lambda h, w, t: linear_cross_entropy(h, w, t, chunk=16), h16, w16, targets)
    assert [t.dtype for t in saved] == [torch.bfloat16, torch.bfloat16], saved
    assert got[2].dtype == torch.bfloat16
    for out, ref in zip(got, expected):
        assert ((out.double() - ref).norm() / ref.norm()) < 1e-2


def test_backward_runs_once():
    hidden, weight, targets = _case(seed=4)
    loss = linear_cross_entropy(hidden, weight, targets)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once"):
        loss.backward()


@pytest.mark.parametrize("tokens,d,vocab,fp32,expected", [
    (32768, 4096, 151936, False, 1024),  # the 2026 leaderboard: 38 vocab rows a hidden row
    (32768, 4096, 151936, True, 4096),   # an fp32 dW accumulator: never fewer than 4096
    (65536, 4096, 8192, True, 32768),    # a small vocabulary: logits the hidden states' size
    (33, 24, 101, False, 8),
    (33, 24, 101, True, 33),             # fewer tokens than the fp32 floor: one chunk
    (1, 24, 101, False, 1),
    (64, 128, 100, False, 64),           # a vocabulary smaller than d: one chunk
])
def test_a_chunk_is_about_the_hidden_states_size_but_large_for_fp32_dw(tokens, d, vocab, fp32,
                                                                        expected):
    assert default_chunk(tokens, d, vocab, fp32_accumulator=fp32) == expected
    assert MIN_FP32_CHUNK_TOKENS == 4096


def test_every_chunks_logits_reuse_one_buffer():
    """The chunks' logits share one (chunk, vocab) buffer, so that no two chunks' logits are
    alive at once (a new tensor each chunk would be allocated before the last one is freed)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Storages(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.pointers = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket is torch.ops.aten.mm and out.shape[-1] == 999:
                self.pointers.append(out.untyped_storage().data_ptr())
            return out

    hidden, weight, targets = _case(tokens=(4, 16), vocab=999, seed=5)
    with Storages() as mode:
        linear_cross_entropy(hidden, weight, targets, chunk=8, kernel=False)
    assert len(mode.pointers) == 8 and len(set(mode.pointers)) == 1, mode.pointers
