"""Kernels against float64 references on fresh random inputs.

On a CPU machine the Triton kernels run under TRITON_INTERPRET=1 (conftest.py) at small shapes;
the interpreter cannot do bf16 `tl.dot` (triton-lang/triton#11584), so Triton bf16 runs on CUDA
only. On a GPU the same tests run on the device, plus the long-sequence checks at the end.
"""

import math

import pytest
import torch

from conftest import DEVICE
from cs336_systems.kernels import (FlashAttentionPytorch, FlashAttentionTriton,
                                   FlashAttentionTritonTorchBackward, weighted_sum)

ON_GPU = DEVICE == "cuda"
TRITON_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
# relative error of the whole tensor, ||out - ref|| / ||ref||
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "non-finite values in the output"
    return ((out.double() - ref).norm() / ref.norm()).item()


def reference_attention(q, k, v, is_causal):
    """o and logsumexp in float64."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def check_flash(fn, batch, n_queries, n_keys, d, dtype, is_causal, device=DEVICE):
    make = lambda n: torch.randn(batch, n, d, device=device, dtype=dtype, requires_grad=True)  # noqa: E731
    q, k, v = make(n_queries), make(n_keys), make(n_keys)
    o = fn.apply(q, k, v, is_causal)
    # the forward saves exactly one extra tensor, the logsumexp of shape (batch, n_queries)
    saved = o.grad_fn.saved_tensors
    lse = [t for t in saved if t.shape == (batch, n_queries)]
    assert len(lse) == 1 and len(saved) == 5
    grad_o = torch.randn_like(o)
    o.backward(grad_o)

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o64, lse64 = reference_attention(q64, k64, v64, is_causal)
    o64.backward(grad_o.double())

    tol = TOLERANCE[dtype]
    errors = {"o": relative_error(o, o64), "L": relative_error(lse[0], lse64),
              "dq": relative_error(q.grad, q64.grad), "dk": relative_error(k.grad, k64.grad),
              "dv": relative_error(v.grad, v64.grad)}
    assert all(e < tol for e in errors.values()), errors


SHAPES = [(2, 64, 64, 16), (1, 128, 128, 32), (3, 32, 128, 16), (1, 128, 32, 64)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_pytorch_against_float64(shape, is_causal, dtype):
    if is_causal and shape[1] != shape[2]:
        pytest.skip("causal attention is defined here for n_queries == n_keys")
    check_flash(FlashAttentionPytorch, *shape, dtype, is_causal)


TRITON_SHAPES = [(2, 64, 64, 16), (1, 128, 128, 32), (2, 16, 64, 16), (1, 32, 16, 64)]


@pytest.mark.parametrize("shape", TRITON_SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", TRITON_DTYPES)
def test_flash_triton_against_float64(shape, is_causal, dtype):
    if is_causal and shape[1] != shape[2]:
        pytest.skip("causal attention is defined here for n_queries == n_keys")
    check_flash(FlashAttentionTriton, *shape, dtype, is_causal)


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_triton_with_compiled_pytorch_backward(is_causal):
    check_flash(FlashAttentionTritonTorchBackward, 2, 64, 64, 16, torch.float32, is_causal)


def test_flash_default_is_not_causal():
    q, k, v = (torch.randn(1, 32, 16, device=DEVICE) for _ in range(3))
    expected, _ = reference_attention(q, k, v, is_causal=False)
    for fn in (FlashAttentionPytorch, FlashAttentionTriton):
        assert relative_error(fn.apply(q, k, v), expected) < 1e-5


@pytest.mark.parametrize("shape, dtype", [((4, 7, 33), torch.float32), ((130, 16), torch.float32),
                                          ((3, 5, 64), torch.float16)])
def test_weighted_sum_forward_and_backward(shape, dtype):
    x = torch.randn(*shape, device=DEVICE, dtype=dtype, requires_grad=True)
    w = torch.randn(shape[-1], device=DEVICE, dtype=dtype, requires_grad=True)
    out = weighted_sum(x, w)
    assert out.shape == shape[:-1]
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = (x64 * w64).sum(-1)
    ref.backward(grad_out.double())
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert relative_error(out, ref) < tol
    assert relative_error(x.grad, x64.grad) < tol
    assert relative_error(w.grad, w64.grad) < tol


@pytest.mark.parametrize("fn", [FlashAttentionPytorch, FlashAttentionTriton])
@pytest.mark.parametrize("shapes, message", [
    (((1, 48, 16), (1, 48, 16), (1, 48, 16)), "n_queries must be a power of two of at least 16"),
    (((1, 32, 8), (1, 32, 8), (1, 32, 8)), "d must be a power of two of at least 16"),
    (((1, 32, 16), (1, 64, 16), (1, 32, 16)), "must agree"),
    (((32, 16), (32, 16), (32, 16)), "must have shape (batch, seq, d)"),
])
def test_unsupported_shapes_raise_value_error(fn, shapes, message):
    q, k, v = (torch.randn(*s, device=DEVICE) for s in shapes)
    with pytest.raises(ValueError, match=re_escape(message)):
        fn.apply(q, k, v)


@pytest.mark.parametrize("fn", [FlashAttentionPytorch, FlashAttentionTriton])
def test_mismatched_or_unsupported_dtypes_raise(fn):
    q = torch.randn(1, 32, 16, device=DEVICE)
    with pytest.raises(ValueError, match="share one dtype"):
        fn.apply(q, q.half(), q)
    with pytest.raises(ValueError, match="share one dtype"):
        fn.apply(q.double(), q.double(), q.double())


def test_triton_on_cpu_without_interpreter_says_what_is_needed(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.randn(1, 32, 16)
    with pytest.raises(ValueError, match="need CUDA tensors .*TRITON_INTERPRET=1"):
        FlashAttentionTriton.apply(q, q, q)
    with pytest.raises(ValueError, match="need CUDA tensors"):
        weighted_sum(torch.randn(4, 16), torch.randn(16))


def test_model_with_flash_attention_matches_eager():
    from cs336_systems.model import VOCAB_SIZE, build_model

    torch.manual_seed(7)
    eager = build_model("tiny", context_length=32, device=DEVICE)
    for name in ("flash-triton", "flash-pytorch"):
        torch.manual_seed(7)
        flash = build_model("tiny", context_length=32, attention=name, device=DEVICE)
        ids = torch.randint(0, VOCAB_SIZE, (2, 32), device=DEVICE)
        with torch.no_grad():
            assert relative_error(flash(ids), eager(ids).double()) < 1e-5, name


def re_escape(text: str) -> str:
    import re
    return re.escape(text)


# --- long sequences, on a GPU only -------------------------------------------------------

@pytest.mark.skipif(not ON_GPU, reason="long sequences need a GPU")
@pytest.mark.parametrize("seq", [1024, 4096, 16384])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_triton_long_sequences_on_gpu(seq, is_causal, dtype):
    check_flash(FlashAttentionTriton, 1, seq, seq, 64, dtype, is_causal)
