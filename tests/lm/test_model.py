import pytest
import torch

from cs336_systems.lm.attention import eager_attention, sdpa_attention
from cs336_systems.lm.model import MODEL_SIZES, VOCAB_SIZE, build_model, parameter_count


def test_logits_shape_and_dtype():
    model = build_model("tiny", context_length=32)
    token_ids = torch.randint(0, VOCAB_SIZE, (3, 20))
    logits = model(token_ids)
    assert logits.shape == (3, 20, VOCAB_SIZE)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_causality_future_tokens_do_not_change_past_logits():
    model = build_model("tiny", context_length=32).eval()
    token_ids = torch.randint(0, VOCAB_SIZE, (2, 24))
    t = 11
    changed = token_ids.clone()
    changed[:, t + 1:] = torch.randint(0, VOCAB_SIZE, (2, 24 - t - 1))
    with torch.no_grad():
        before, after = model(token_ids), model(changed)
    torch.testing.assert_close(before[:, : t + 1], after[:, : t + 1])
    assert not torch.allclose(before[:, t + 1:], after[:, t + 1:])


def test_causality_changing_token_t_changes_logits_at_t():
    model = build_model("tiny", context_length=16).eval()
    token_ids = torch.randint(0, VOCAB_SIZE, (1, 16))
    changed = token_ids.clone()
    changed[0, 5] = (changed[0, 5] + 1) % VOCAB_SIZE
    with torch.no_grad():
        before, after = model(token_ids), model(changed)
    torch.testing.assert_close(before[:, :5], after[:, :5])
    assert not torch.allclose(before[:, 5], after[:, 5])


@pytest.mark.parametrize("size, expected", [("small", 128.6e6), ("2.7b", 3.41e9)])
def test_parameter_counts_match_the_assignment(size, expected):
    assert parameter_count(size) == pytest.approx(expected, rel=2e-3)


def test_parameter_count_formula_for_every_size():
    for name, s in MODEL_SIZES.items():
        per_layer = 4 * s.d_model**2 + 3 * s.d_model * s.d_ff + 2 * s.d_model
        expected = s.num_layers * per_layer + 2 * VOCAB_SIZE * s.d_model + s.d_model
        assert parameter_count(name) == expected, name


def test_attention_is_pluggable_and_sdpa_matches_eager():
    torch.manual_seed(0)
    eager = build_model("tiny", context_length=16, attention="eager").eval()
    calls = []

    def spy(q, k, v, is_causal=False):
        calls.append(q.shape)
        return sdpa_attention(q, k, v, is_causal=is_causal)

    torch.manual_seed(0)
    spied = build_model("tiny", context_length=16, attention=spy).eval()
    token_ids = torch.randint(0, VOCAB_SIZE, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(eager(token_ids), spied(token_ids), rtol=1e-4, atol=1e-4)
    spec = MODEL_SIZES["tiny"]
    assert calls == [(2, spec.num_heads, 16, spec.d_model // spec.num_heads)] * spec.num_layers


def test_eager_attention_against_float64_reference():
    q, k, v = (torch.randn(2, 3, 8, 16, dtype=torch.float64) for _ in range(3))
    scores = (q @ k.transpose(-1, -2)) / 4.0
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v
    torch.testing.assert_close(eager_attention(q, k, v, is_causal=True), expected)


def test_bad_inputs_name_what_is_allowed():
    with pytest.raises(ValueError, match="unknown model size 'huge'.*small"):
        build_model("huge", context_length=16)
    with pytest.raises(ValueError, match=r"context length 2048 is longer than size 'small' "
                                         r"supports \(at most 1024\)"):
        build_model("small", context_length=2048, device="meta")
    with pytest.raises(ValueError, match="unknown attention 'fast'.*eager"):
        build_model("tiny", context_length=16, attention="fast")
    model = build_model("tiny", context_length=8)
    with pytest.raises(ValueError, match="exceeds the model's context length 8"):
        model(torch.randint(0, VOCAB_SIZE, (1, 9)))


def test_forward_flops_counts_every_matmul_of_the_model():
    """Count multiply-adds of the real forward pass with a hook on matmul and compare."""
    from torch.utils.flop_counter import FlopCounterMode

    from cs336_systems.lm.model import forward_flops

    model = build_model("tiny", context_length=32)
    token_ids = torch.randint(0, VOCAB_SIZE, (3, 32))
    with FlopCounterMode(display=False) as counter:
        model(token_ids)
    assert forward_flops("tiny", 3, 32) == counter.get_total_flops()


@pytest.mark.parametrize("block_size", [1, 2, 3])
def test_checkpointed_blocks_give_the_same_loss_and_gradients(block_size):
    """Recomputing activations in backward changes memory, not results: the same loss and
    gradients as keeping them, for block sizes that divide the layers, equal them and exceed
    them."""
    from cs336_systems.lm.loss import cross_entropy

    token_ids = torch.randint(0, VOCAB_SIZE, (2, 16))
    targets = torch.randint(0, VOCAB_SIZE, (2, 16))
    results = []
    for k in (None, block_size):
        torch.manual_seed(0)
        model = build_model("tiny", context_length=16, checkpoint_block_size=k,
                            dtype=torch.float64)
        loss = cross_entropy(model(token_ids), targets)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (loss, grads), (loss_k, grads_k) = results
    torch.testing.assert_close(loss_k, loss, rtol=0, atol=0)
    for g, g_k in zip(grads, grads_k):
        torch.testing.assert_close(g_k, g, rtol=1e-12, atol=1e-12)


def test_checkpointing_recomputes_each_block_once_in_backward():
    calls = []

    def spy(q, k, v, is_causal=False):
        calls.append(q.shape)
        return eager_attention(q, k, v, is_causal)

    token_ids = torch.randint(0, VOCAB_SIZE, (1, 8))
    for k, runs in ((None, 1), (1, 2), (2, 2)):
        calls.clear()
        model = build_model("tiny", context_length=8, attention=spy, checkpoint_block_size=k)
        model(token_ids).sum().backward()
        assert len(calls) == runs * len(model.layers), k
        calls.clear()
        with torch.no_grad():  # nothing to recompute for: checkpoints are off
            model(token_ids)
        assert len(calls) == len(model.layers)
    with pytest.raises(ValueError, match="checkpoint_block_size must be a positive"):
        build_model("tiny", context_length=8, checkpoint_block_size=0)


def _backward_ops(k, recompute, attention, token_ids, targets):
    """The loss, the gradients and the count of each aten op that the backward runs."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    from cs336_systems.lm.loss import cross_entropy

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = build_model("tiny", context_length=16, attention=attention, checkpoint_block_size=k,
                        recompute=recompute, dtype=torch.float64)
    loss = cross_entropy(model(token_ids), targets)
    with Count() as count:
        loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()], count.ops


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_selective_checkpointing_keeps_the_matmuls_and_recomputes_the_rest(attention):
    """recompute="elementwise": the same loss and gradients as keeping everything; its backward
    runs no more matmuls than that (their outputs were kept) but redoes elementwise work, while
    full checkpointing redoes the matmuls too."""
    token_ids = torch.randint(0, VOCAB_SIZE, (2, 16))
    targets = torch.randint(0, VOCAB_SIZE, (2, 16))
    kept = _backward_ops(None, "all", attention, token_ids, targets)
    full = _backward_ops(1, "all", attention, token_ids, targets)
    selective = _backward_ops(1, "elementwise", attention, token_ids, targets)
    for loss, grads, _ in (full, selective):
        torch.testing.assert_close(loss, kept[0], rtol=0, atol=0)
        for g, ref in zip(grads, kept[1]):
            torch.testing.assert_close(g, ref, rtol=1e-12, atol=1e-12)
    matmuls = {name: sum(ops[op] for op in ("mm", "bmm", "addmm"))
               for name, (_, _, ops) in (("kept", kept), ("full", full),
                                         ("selective", selective))}
    assert matmuls["selective"] == matmuls["kept"] < matmuls["full"], matmuls
    assert sum(selective[2].values()) > sum(kept[2].values())  # the elementwise work, redone


def test_all_but_attention_recomputes_the_matmuls_and_keeps_attention():
    """recompute="all-but-attention": the same gradients; its backward redoes the matmuls (as
    full checkpointing does) but not SDPA's attention kernel, whose outputs it kept."""
    token_ids = torch.randint(0, VOCAB_SIZE, (2, 16))
    targets = torch.randint(0, VOCAB_SIZE, (2, 16))
    kept = _backward_ops(None, "all", "sdpa", token_ids, targets)
    full = _backward_ops(1, "all", "sdpa", token_ids, targets)
    attention_kept = _backward_ops(1, "all-but-attention", "sdpa", token_ids, targets)
    for g, ref in zip(attention_kept[1], kept[1]):
        torch.testing.assert_close(g, ref, rtol=1e-12, atol=1e-12)

    def attention_calls(ops):
        return sum(n for op, n in ops.items() if op.startswith("_scaled_dot_product"))

    def matmuls(ops):
        return sum(ops[op] for op in ("mm", "bmm", "addmm"))

    assert attention_calls(full[2]) > attention_calls(kept[2])   # the count can tell them apart
    assert attention_calls(attention_kept[2]) == attention_calls(kept[2])
    assert matmuls(attention_kept[2]) == matmuls(full[2]) > matmuls(kept[2])


def test_unknown_recompute_names_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed: all, elementwise, all-but-attention"):
        build_model("tiny", context_length=16, checkpoint_block_size=1, recompute="some")


def test_selective_policies_keep_every_attention_operator():
    """The custom forward operators of our Triton kernel and of FlashAttention-4 (each
    registry entry's `forward_op`) are kept like SDPA's (one left out once had "elementwise"
    redo FlashAttention-4's forward in backward); the matmuls are kept by "elementwise" alone."""
    from torch.utils.checkpoint import CheckpointPolicy

    import cs336_systems.lm.fa4  # noqa: F401  registers cs336::fa4_fwd; the package loads on call
    from cs336_systems.kernels import flash_triton  # noqa: F401  registers cs336::flash_attn_fwd
    from cs336_systems.lm import model

    attention_ops = (torch.ops.cs336.fa4_fwd.default, torch.ops.cs336.flash_attn_fwd.default,
                     torch.ops.aten._scaled_dot_product_cudnn_attention.default)
    for op in attention_ops:
        assert model._save_matmuls(None, op) == CheckpointPolicy.MUST_SAVE, op
        assert model._save_attention(None, op) == CheckpointPolicy.MUST_SAVE, op
    mm = torch.ops.aten.mm.default
    assert model._save_matmuls(None, mm) == CheckpointPolicy.MUST_SAVE
    assert model._save_attention(None, mm) == CheckpointPolicy.PREFER_RECOMPUTE
    assert model._save_attention(None, torch.ops.cs336.fa4_bwd.default) \
        == CheckpointPolicy.PREFER_RECOMPUTE
