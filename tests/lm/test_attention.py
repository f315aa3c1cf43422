"""The attention registry's optional peer, FlashAttention-4: where it cannot run, it says why
instead of failing a job; where it can (a Hopper GPU with flash-attn-4), it agrees with SDPA."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE

from cs336_systems.lm.attention import (
    get_attention,
    package_unavailable_reason,
    unavailable_reason,
)

FA4_INSTALLED = importlib.util.find_spec("flash_attn") is not None


def test_fa4_says_why_it_cannot_run_here_instead_of_failing():
    q = torch.randn(2, 64, 64, device=DEVICE)  # fp32: never FlashAttention-4's
    reason = unavailable_reason("fa4", q, q, q, True)
    assert reason and "FlashAttention-4" in reason
    if not FA4_INSTALLED:
        assert "pip install flash-attn-4" in reason


def test_a_job_asks_before_any_input_exists():
    """From a config alone (head dimension, dtype, device): the optional package's kernel says
    why not, with the same reason as on inputs; every other implementation has nothing to say."""
    fa4 = package_unavailable_reason("fa4", 80, torch.float32, torch.device(DEVICE))
    assert fa4 and "FlashAttention-4" in fa4
    odd = package_unavailable_reason("fa4", 36, torch.bfloat16, torch.device(DEVICE))
    assert odd and ("multiples of 8" in odd if FA4_INSTALLED and DEVICE == "cuda" else odd == fa4)
    for name in ("sdpa", "flash-triton", "flash-gluon", "sdpa-cudnn"):
        assert package_unavailable_reason(name, 64, torch.bfloat16, torch.device(DEVICE)) is None


@pytest.mark.skipif(DEVICE != "cuda" or not FA4_INSTALLED,
                    reason="FlashAttention-4 runs on a Hopper or Blackwell GPU with flash-attn-4")
@pytest.mark.parametrize("is_causal", [False, True])
def test_fa4_agrees_with_sdpa_on_strided_heads(is_causal):
    fused = torch.randn(2, 256, 3, 4, 64, device=DEVICE, dtype=torch.bfloat16)
    q, k, v = (fused[:, :, i].transpose(1, 2).requires_grad_() for i in range(3))
    if reason := unavailable_reason("fa4", q, k, v, is_causal):
        pytest.skip(reason)
    out = get_attention("fa4")(q, k, v, is_causal)
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                               is_causal=is_causal)
    error = (out.float() - reference).norm() / reference.norm()
    assert out.shape == q.shape and error < 2e-2


@pytest.mark.skipif(DEVICE != "cuda" or not FA4_INSTALLED,
                    reason="FlashAttention-4 runs on a Hopper or Blackwell GPU with flash-attn-4")
def test_fa4_compiles_as_one_operator_each_way():
    """torch.compile sees `cs336::fa4_fwd` and `cs336::fa4_bwd` (no graph break), and the
    compiled step's gradients are eager's."""
    q = torch.randn(1, 4, 512, 128, device=DEVICE, dtype=torch.bfloat16)
    if reason := unavailable_reason("fa4", q, q, q, True):
        pytest.skip(reason)
    attend = get_attention("fa4")
    compiled = torch.compile(attend, fullgraph=True)
    grads = []
    for fn in (attend, compiled):
        torch.manual_seed(0)
        inputs = [torch.randn_like(q).requires_grad_() for _ in range(3)]
        fn(*inputs, True).float().square().sum().backward()
        grads.append([t.grad for t in inputs])
    for eager, fused in zip(*grads):
        assert torch.allclose(eager, fused)
