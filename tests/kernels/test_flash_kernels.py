"""Kernels against float64 references on fresh random inputs.

On a CPU machine the Triton kernels run under TRITON_INTERPRET=1 (conftest.py) at small shapes;
the interpreter cannot do bf16 `tl.dot` (triton-lang/triton#11584), so Triton bf16 runs on CUDA
only, and torch.compile cannot trace interpreted kernels, so compiling checks Dynamo alone
there (backend "eager"). On a GPU the same tests run on the device, plus the long-sequence and
Inductor checks at the end.
"""

import math
import re
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE

from cs336_systems.kernels import (
    FlashAttentionPytorch,
    FlashAttentionTriton,
    FlashAttentionTritonTorchBackward,
    weighted_sum,
)

ON_GPU = DEVICE == "cuda"
TRITON_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
# relative error of the whole tensor, ||out - ref|| / ||ref||
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


class Flash(NamedTuple):
    """Our Triton kernels at chosen settings, called as the assignment's autograd.Function is
    (`apply(q, k, v, is_causal)`). The fp32 checks here hold them to 1e-5, so their dots run in
    full fp32 ("ieee"); `test_fp32_precisions` checks the default and the others at their own
    tolerances."""
    precision: str = "ieee"
    atomic_dq: bool = False
    function: type = FlashAttentionTriton

    def apply(self, q, k, v, is_causal=False):
        return self.function.apply(q, k, v, is_causal, self.precision, self.atomic_dq)


IEEE = Flash()


def relative_error(out: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None = None
                   ) -> float:
    """||out - ref|| / ||ref||, or / scale where the reference is zero."""
    assert torch.isfinite(out).all(), "non-finite values in the output"
    ref = ref.double()
    return ((out.double() - ref).norm() / (ref.norm() if scale is None else scale)).item()


def reference_attention(q, k, v, is_causal):
    """o and logsumexp in float64; the causal mask is SDPA's (top-left aligned lower triangle)."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def check_attention(attend, batch, n_queries, n_keys, d, dtype, is_causal, device=DEVICE):
    """attend(q, k, v, is_causal) -> (o, logsumexp or None) against float64: o, the logsumexp,
    dq, dk, dv."""
    make = lambda n: torch.randn(batch, n, d, device=device, dtype=dtype, requires_grad=True)  # noqa: E731
    q, k, v = make(n_queries), make(n_keys), make(n_keys)
    o, lse = attend(q, k, v, is_causal)
    grad_o = torch.randn_like(o)
    o.backward(grad_o)

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o64, lse64 = reference_attention(q64, k64, v64, is_causal)
    o64.backward(grad_o.double())

    # where every query sees one key (one key, or one query under the causal mask) the softmax
    # is constant and the reference dq, dk are zero: measure those against the incoming gradient
    one_key_each = n_keys == 1 or (is_causal and n_queries == 1)
    scale = grad_o.double().norm() if one_key_each else None
    errors = {"o": relative_error(o, o64), "dq": relative_error(q.grad, q64.grad, scale),
              "dk": relative_error(k.grad, k64.grad, scale), "dv": relative_error(v.grad, v64.grad)}
    if lse is not None:  # a log: its absolute error is the relative error of exp(L)
        errors["L"] = (lse.double() - lse64).abs().max().item()
    assert all(e < TOLERANCE[dtype] for e in errors.values()), errors


def check_flash(fn, batch, n_queries, n_keys, d, dtype, is_causal, device=DEVICE):
    """`fn.apply` against float64, with the logsumexp its forward saves."""
    def attend(q, k, v, is_causal):
        o = fn.apply(q, k, v, is_causal)
        # the forward saves exactly one extra tensor, the logsumexp of shape (batch, n_queries)
        saved = o.grad_fn.saved_tensors
        lse = [t for t in saved if t.shape == (batch, n_queries)]
        assert len(lse) == 1 and len(saved) == 5
        return o, lse[0]
    check_attention(attend, batch, n_queries, n_keys, d, dtype, is_causal, device)


class FlashAttentionOp:
    """The `cs336::flash_attn_fwd` operator, differentiable through its registered backward."""

    @staticmethod
    def apply(q, k, v, is_causal):
        return torch.ops.cs336.flash_attn_fwd(q, k, v, is_causal, IEEE.precision)[0]


SHAPES = [(2, 64, 64, 16), (1, 128, 128, 32), (3, 32, 128, 16), (1, 128, 32, 64)]
# On a CPU Inductor compiles C++ for each new guard of the PyTorch FA2's compiled backward (a
# dtype, a mask, a length of 1: 5 to 25 s each, cold). There it is checked compiled in one case,
# the causal mask in fp32, and the other cases run the same function eagerly; on a GPU every
# case runs compiled.
COMPILED_ON_CPU = {(SHAPES[0], torch.float32, True)}


def backward_eagerly_on_a_cpu(monkeypatch):
    if not ON_GPU:
        from cs336_systems.kernels import flash_pytorch
        monkeypatch.setattr(flash_pytorch, "compiled_flash_backward", flash_pytorch.flash_backward)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_pytorch_against_float64(shape, is_causal, dtype, monkeypatch):
    if (shape, dtype, is_causal) not in COMPILED_ON_CPU:
        backward_eagerly_on_a_cpu(monkeypatch)
    check_flash(FlashAttentionPytorch, *shape, dtype, is_causal)


TRITON_SHAPES = [(2, 64, 64, 16), (1, 128, 128, 32), (2, 16, 64, 16), (1, 32, 16, 64)]


@pytest.mark.parametrize("shape", TRITON_SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", TRITON_DTYPES)
def test_flash_triton_against_float64(shape, is_causal, dtype):
    check_flash(IEEE, *shape, dtype, is_causal)


# (batch, n_queries, n_keys, d): lengths from 1, unequal both ways, heads that are not powers of
# two; several tiles with an overhanging last one at both the fp32 and the fp16 tile sizes
ANY_SHAPES = [(2, 7, 33, 24), (1, 33, 7, 80), (1, 1, 9, 96), (2, 9, 1, 16), (1, 1, 1, 8),
              (1, 40, 40, 96), (1, 100, 70, 80), (1, 70, 100, 24)]


@pytest.mark.parametrize("shape", ANY_SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", TRITON_DTYPES)
def test_flash_triton_any_shape_against_float64(shape, is_causal, dtype):
    check_flash(IEEE, *shape, dtype, is_causal)


@pytest.mark.skipif(not ON_GPU, reason="the interpreter launches through the JIT only")
@pytest.mark.parametrize("shape", [(2, 64, 64, 16), (1, 100, 70, 80)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_triton_direct_launches_against_float64(shape, dtype):
    """Eager calls after a shape's first launch its compiled kernels directly
    (`launch.direct`): they must agree with float64 as the first does, with new inputs each
    time, and the kernels must have been launched that way."""
    from cs336_systems.kernels import flash_triton
    from cs336_systems.kernels.launch import direct
    for _ in range(3):
        check_flash(IEEE, *shape, dtype, True)
    for kernel in (flash_triton.flash_fwd_kernel, flash_triton.flash_bwd_dq_kernel,
                   flash_triton.flash_bwd_kernel):
        assert direct(kernel).binaries, kernel


@pytest.mark.parametrize("shape", [(2, 64, 64, 32), (1, 70, 45, 24), (1, 45, 100, 80)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("atomic", [False, True])
def test_flash_triton_backward_with_unequal_tiles(shape, is_causal, atomic, monkeypatch):
    """Each backward kernel with its inner tile smaller than its outer one (the key-tile kernel
    walks 16-row query tiles inside 32-row key tiles, the dQ kernel the other way round)."""
    from cs336_systems.kernels import flash_triton

    monkeypatch.setattr(flash_triton, "_backward_tiles", lambda *_: (
        flash_triton.Tiles(16, 32, 4, 2), flash_triton.Tiles(32, 16, 4, 2)))
    # the launch plans are cached per shape: plan afresh from the tiles above
    monkeypatch.setattr(flash_triton, "_cached_backward_launches",
                        flash_triton._backward_launches)
    check_flash(Flash(atomic_dq=atomic), *shape, torch.float32, is_causal)


@pytest.mark.parametrize("shape", [(2, 64, 64, 32), (1, 70, 45, 24), (1, 33, 100, 80)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_flash_triton_deterministic_backward(shape, is_causal, dtype):
    """With torch's deterministic algorithms on, dQ comes from its own kernel in a fixed order
    even where atomic adds are chosen: the same gradients as float64, and bit for bit the same
    on a second run."""
    atomic = Flash(atomic_dq=True)
    torch.use_deterministic_algorithms(True)
    try:
        check_flash(atomic, *shape, dtype, is_causal)
        q, k, v = (torch.randn(1, n, shape[3], device=DEVICE, dtype=dtype, requires_grad=True)
                   for n in shape[1:3] + shape[2:3])
        grad_o = torch.randn_like(q)
        runs = [torch.autograd.grad(atomic.apply(q, k, v, is_causal), (q, k, v),
                                    grad_o) for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


# (tolerance, relative error of o and the gradients): tf32 keeps 10 mantissa bits, inside the
# assignment's 1e-2; tf32x3 splits each operand in two tf32 parts, about fp32's accuracy
FP32_TOLERANCE = {"ieee": 1e-5, "tf32x3": 1e-4, "tf32": 1e-2}


@pytest.mark.parametrize("precision", list(FP32_TOLERANCE))
@pytest.mark.parametrize("is_causal", [False, True])
def test_fp32_precisions(precision, is_causal):
    """The fp32 precisions at their tolerances; the default is the assignment's 1e-2 or better."""
    from cs336_systems.kernels.flash_triton import DEFAULT_FP32_PRECISION

    assert FP32_TOLERANCE[DEFAULT_FP32_PRECISION] <= 1e-2
    o, reference = _heads_case(1, 2, 70, 45, 64, torch.float32, is_causal, Flash(precision))
    assert relative_error(o, reference) < FP32_TOLERANCE[precision]


def test_unknown_fp32_precision_names_the_allowed_ones():
    q = torch.randn(1, 16, 16)
    with pytest.raises(ValueError, match="allowed: ieee, tf32x3, tf32"):
        FlashAttentionTriton.apply(q, q, q, False, "bf16")


def _heads_case(batch, heads, n_queries, n_keys, d, dtype, is_causal, flash=IEEE):
    """Our output for (batch, heads, seq, d) views of one fused (batch, seq, 3, heads, d)
    projection, as the model makes them (strided, not contiguous), and float64's."""
    n = max(n_queries, n_keys)
    fused = torch.randn(batch, n, 3, heads, d, device=DEVICE, dtype=dtype)
    q, k, v = (fused[:, :length, i].transpose(1, 2)
               for i, length in enumerate((n_queries, n_keys, n_keys)))
    assert not q.is_contiguous()
    o = flash.apply(q, k, v, is_causal)
    return o, reference_attention(q, k, v, is_causal)[0]


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_triton_takes_strided_heads_without_copies(is_causal):
    """(batch, heads, seq, d) views as the model makes them: forward and backward against
    float64, and the output in (batch, seq, heads, d) order, where merging heads is a view."""
    from einops import rearrange

    fused = torch.randn(2, 40, 3, 3, 24, device=DEVICE, requires_grad=True)
    q, k, v = (fused[:, :, i].transpose(1, 2) for i in range(3))
    o = IEEE.apply(q, k, v, is_causal)
    merged = rearrange(o, "b h s d -> b s (h d)")
    assert merged.data_ptr() == o.data_ptr() and o.transpose(1, 2).is_contiguous()
    grad_o = torch.randn_like(o)
    o.backward(grad_o)

    fused64 = fused.detach().double().requires_grad_()
    q64, k64, v64 = (fused64[:, :, i].transpose(1, 2) for i in range(3))
    o64 = reference_attention(q64, k64, v64, is_causal)[0]
    o64.backward(grad_o.double())
    assert relative_error(o, o64) < 1e-5
    assert relative_error(fused.grad, fused64.grad) < 1e-5


@pytest.mark.parametrize("shape", ANY_SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_pytorch_any_shape_against_float64(shape, is_causal, monkeypatch):
    backward_eagerly_on_a_cpu(monkeypatch)
    check_flash(FlashAttentionPytorch, *shape, torch.float32, is_causal)


@pytest.mark.parametrize("shape", [(2, 33, 7, 80), (1, 7, 40, 16)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_operator_is_differentiable(shape, is_causal):
    check_flash(FlashAttentionOp, *shape, torch.float32, is_causal)


def test_reference_causal_mask_is_sdpas_with_unequal_lengths():
    for n_queries, n_keys in ((7, 33), (33, 7)):
        q, k, v = (torch.randn(2, n, 16, device=DEVICE) for n in (n_queries, n_keys, n_keys))
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert relative_error(expected, reference_attention(q, k, v, True)[0]) < 1e-5


def test_flash_operators_pass_opcheck():
    """Schema, autograd registration and fake (shape-only) implementations against the real
    kernels; tracing the kernels themselves (aot_dispatch) needs a GPU."""
    tests = ("test_schema", "test_autograd_registration", "test_faketensor",
             *(("test_aot_dispatch_dynamic",) if ON_GPU else ()))
    make = lambda n: torch.randn(2, n, 80, device=DEVICE, requires_grad=True)  # noqa: E731
    fused = torch.randn(2, 33, 3, 2, 80, device=DEVICE)  # (batch, seq, q/k/v, heads, d)
    heads = [fused[:, :n, i].transpose(1, 2).requires_grad_() for i, n in enumerate((33, 17, 17))]
    for (q, k, v), is_causal in [((make(33), make(17), make(17)), False),
                                 ((make(33), make(17), make(17)), True), (heads, True)]:
        torch.library.opcheck(torch.ops.cs336.flash_attn_fwd.default,
                              (q, k, v, is_causal, "ieee"), test_utils=tests)
        o, lse = torch.ops.cs336.flash_attn_fwd(q, k, v, is_causal, "ieee")
        # the backward operator has no backward of its own: inputs without gradients
        args = (*(t.detach() for t in (q, k, v, o)), lse, torch.randn_like(o), is_causal, "ieee")
        for atomic_dq in (False, True):
            torch.library.opcheck(torch.ops.cs336.flash_attn_bwd.default, (*args, atomic_dq),
                                  test_utils=tests)


def compiled(fn):
    """torch.compile(fn, fullgraph=True): Inductor on a GPU, Dynamo alone under the interpreter."""
    return torch.compile(fn, fullgraph=True, backend="inductor" if ON_GPU else "eager")


def test_compiled_flash_triton_takes_any_sequence_of_shapes():
    """One compiled function, shapes changing call after call (lengths, head size, batch)."""
    torch._dynamo.reset()
    attends = [compiled(IEEE.apply), compiled(FlashAttentionOp.apply)]
    for shape in [(2, 64, 64, 16), (2, 32, 32, 16), (2, 64, 64, 32), (1, 16, 16, 16),
                  (1, 33, 20, 24)]:
        for attend in attends:
            check_attention(lambda *args: (attend(*args), None), *shape, torch.float32, True)


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_triton_with_compiled_pytorch_backward(is_causal):
    check_flash(Flash(function=FlashAttentionTritonTorchBackward), 2, 64, 64, 16, torch.float32, is_causal)


def test_flash_default_is_not_causal():
    q, k, v = (torch.randn(1, 32, 16, device=DEVICE) for _ in range(3))
    expected, _ = reference_attention(q, k, v, is_causal=False)
    for fn in (FlashAttentionPytorch, IEEE):
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
    (((1, 0, 16), (1, 8, 16), (1, 8, 16)), "n_queries must be at least 1; got 0"),
    (((1, 8, 16), (1, 0, 16), (1, 0, 16)), "n_keys must be at least 1; got 0"),
    (((1, 8, 257), (1, 8, 257), (1, 8, 257)), "d must be from 1 to 256; got 257"),
    (((1, 32, 16), (1, 64, 16), (1, 32, 16)), "must agree"),
    (((1, 32, 16), (1, 32, 24), (1, 32, 24)), "must agree"),
    (((32, 16), (32, 16), (32, 16)), "must have shape (batch, seq, d)"),
])
def test_unsupported_shapes_raise_value_error(fn, shapes, message):
    q, k, v = (torch.randn(*s, device=DEVICE) for s in shapes)
    with pytest.raises(ValueError, match=re.escape(message)):
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
    from cs336_systems.lm.model import VOCAB_SIZE, build_model

    torch.manual_seed(7)
    eager = build_model("tiny", context_length=32, device=DEVICE)
    for name in ("flash-triton", "flash-pytorch"):
        torch.manual_seed(7)
        flash = build_model("tiny", context_length=32, attention=name, device=DEVICE)
        ids = torch.randint(0, VOCAB_SIZE, (2, 32), device=DEVICE)
        with torch.no_grad():
            assert relative_error(flash(ids), eager(ids).double()) < 1e-5, name


def test_model_with_head_dim_80_trains_like_eager():
    """The 2.7b model's head size (2560 / 32 = 80) at a tiny width: d_model 160, 2 heads, and a
    sequence of 24 tokens; forward and backward against eager attention."""
    from cs336_systems.lm.model import TransformerLM

    ids = torch.randint(0, 100, (2, 24), device=DEVICE)
    results = {}
    for name in ("eager", "flash-triton"):
        torch.manual_seed(7)
        model = TransformerLM(vocab_size=100, context_length=24, d_model=160, num_layers=1,
                              num_heads=2, d_ff=64, attention=name, device=DEVICE)
        logits = model(ids)
        logits.backward(torch.linspace(-1, 1, logits.numel(), device=DEVICE).view_as(logits))
        results[name] = [logits, *(p.grad for p in model.parameters())]
    for out, ref in zip(results["flash-triton"], results["eager"]):
        assert relative_error(out, ref) < 1e-5


# --- long sequences, on a GPU only -------------------------------------------------------

@pytest.mark.skipif(not ON_GPU, reason="long sequences need a GPU")
@pytest.mark.parametrize("seq", [1024, 4096, 16384])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_triton_long_sequences_on_gpu(seq, is_causal, dtype):
    check_flash(IEEE, 1, seq, seq, 64, dtype, is_causal)


@pytest.mark.skipif(not ON_GPU, reason="long sequences need a GPU")
@pytest.mark.parametrize("lengths", [(1, 16384, 16384), (2, 1000, 3001), (4, 8192, 8192)],
                         ids=["16384", "uneven", "full-grid"])
@pytest.mark.parametrize("d", [80, 96, 128, 256])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", TRITON_DTYPES)
def test_flash_triton_any_shape_on_gpu(lengths, d, is_causal, dtype):
    check_flash(IEEE, *lengths, d, dtype, is_causal)


@pytest.mark.parametrize("precision", ["tf32", "tf32x3"])
@pytest.mark.parametrize("d", [80, 128])
def test_fp32_forward_tiles_fit_a_hopper_multiprocessor_when_the_grid_is_full(d, precision):
    """With enough query tiles to fill 132 multiprocessors none is halved, and 128 fp32 query
    rows at d 128 asked 256 KiB of shared memory, beyond an H200's 227 (the assignment run's
    batch 1 x 32768 x 128): above d 64 the fp32 forward takes 64 rows."""
    from cs336_systems.kernels import flash_triton

    tiles = flash_triton._forward_tiles(1, 32768, 32768, d, torch.float32, precision, sms=132)
    assert tiles.block_m == 64
    assert flash_triton._forward_tiles(1, 32768, 32768, 64, torch.float32, precision,
                                       sms=132).block_m == 128  # d 64 keeps its sweep's tiles


@pytest.mark.skipif(not ON_GPU, reason="Inductor compiles the Triton kernels on a GPU only")
def test_compiled_flash_triton_on_long_shape_sequence_on_gpu():
    """Compiled once, called on five shapes in a row (the sequence that used to fail inside
    Dynamo on its third shape), forward and backward against SDPA in bf16."""
    torch._dynamo.reset()
    attends = [compiled(IEEE.apply), compiled(FlashAttentionOp.apply)]
    for shape in [(2, 16384, 64), (2, 4096, 64), (2, 16384, 128), (2, 1024, 64), (1, 1000, 80)]:
        q, k, v = (torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        grad_o = torch.randn_like(q)
        expected = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None],
                                                  is_causal=True)[:, 0]
        expected_grads = torch.autograd.grad(expected, (q, k, v), grad_o)
        for attend in attends:
            o = attend(q, k, v, True)
            grads = torch.autograd.grad(o, (q, k, v), grad_o)
            for out, ref in zip((o, *grads), (expected, *expected_grads)):
                assert relative_error(out, ref) < 2e-2, shape
