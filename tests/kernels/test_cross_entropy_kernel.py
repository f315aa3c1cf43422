"""The fused softmax cross-entropy kernel (kernels/cross_entropy.py) against its readable
definition in PyTorch ops, and the chunked LM-head loss built on it against the plain loss, on
fresh random inputs. On a CPU it runs under Triton's interpreter (fp32 only there)."""

import pytest
import torch
from conftest import DEVICE

from cs336_systems.kernels.cross_entropy import softmax_cross_entropy_
from cs336_systems.lm.loss import (
    KERNEL_MODULE,
    _softmax_cross_entropy_torch,
    cross_entropy,
    linear_cross_entropy,
)

DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1000, 512, 37])  # a tail block, whole blocks, one short one
def test_kernel_matches_the_torch_definition(dtype, vocab):
    rows, scale = 13, 1 / 29
    logits = (4 * torch.randn(rows, vocab, device=DEVICE)).to(dtype)
    targets = torch.randint(0, vocab, (rows,), device=DEVICE)
    expected_losses, expected_grad = _softmax_cross_entropy_torch(logits.clone(), targets, scale)
    got = logits.clone()
    losses = softmax_cross_entropy_(got, targets, scale, block=256, num_warps=4)
    torch.testing.assert_close(losses, expected_losses, rtol=1e-5, atol=1e-5)
    tolerance = dict(rtol=1e-5, atol=1e-7) if dtype == torch.float32 else {}
    torch.testing.assert_close(got, expected_grad.to(dtype), **tolerance)


def test_kernel_rows_of_a_wider_buffer():
    """Rows with a stride beyond their length (a chunk's view) are read and written in place,
    and the columns beyond are left alone."""
    buffer = torch.randn(6, 300, device=DEVICE)
    logits, targets = buffer[:, :250], torch.randint(0, 250, (6,), device=DEVICE)
    expected_losses, expected_grad = _softmax_cross_entropy_torch(logits.clone(), targets, 0.5)
    beyond = buffer[:, 250:].clone()
    losses = softmax_cross_entropy_(logits, targets, 0.5, block=64, num_warps=2)
    torch.testing.assert_close(losses, expected_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, expected_grad, rtol=1e-5, atol=1e-7)
    assert torch.equal(buffer[:, 250:], beyond)


@pytest.mark.parametrize("chunk", [5, 64])
def test_chunked_loss_with_the_kernel_matches_the_plain_loss(chunk):
    hidden = torch.randn(3, 17, 32, device=DEVICE, requires_grad=True)
    weight = torch.randn(700, 32, device=DEVICE, requires_grad=True)
    targets = torch.randint(0, 700, (3, 17), device=DEVICE)
    loss = linear_cross_entropy(hidden, weight, targets, chunk=chunk, kernel=True)
    loss.backward()
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    expected = cross_entropy(h @ w.T, targets)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden.grad, h.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(weight.grad, w.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("logits, targets, message", [
    (torch.randn(4, 10), torch.zeros(3, dtype=torch.long), "must agree"),
    (torch.randn(10), torch.zeros(10, dtype=torch.long), "must agree"),
    (torch.randn(10, 4).T, torch.zeros(4, dtype=torch.long), "contiguous"),
    (torch.randn(4, 10).double(), torch.zeros(4, dtype=torch.long), "float32, bfloat16"),
])
def test_kernel_refuses_what_it_cannot_take(logits, targets, message):
    with pytest.raises(ValueError, match=message):
        softmax_cross_entropy_(logits.to(DEVICE), targets.to(DEVICE), 1.0)


def test_the_leaderboard_jobs_that_run_the_kernel_list_it_as_a_source():
    """The loss imports the kernel lazily, which the rules' source scan does not follow: a
    variant with the chunked loss names it, so that editing the kernel redoes its jobs."""
    from cs336_systems.sections.leaderboard.runs import VARIANTS
    assert softmax_cross_entropy_.__module__ == KERNEL_MODULE
    for name, variant in VARIANTS.items():
        assert (KERNEL_MODULE in variant.modules()) == variant.chunked_loss, name
