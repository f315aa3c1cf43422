"""The Gluon FlashAttention for Hopper: on any machine, each kernel's configuration compiles for
sm90a without spilling and within an SM's shared memory; on a Hopper GPU, o, the logsumexp and
dQ, dK, dV against float64 references on fresh random inputs (odd lengths, causal and not)."""

import math

import pytest
import torch

from cs336_systems.kernels.flash_gluon import (
    BACKWARD_SCHEDULES,
    DEFAULT_BACKWARD_SCHEDULES,
    DEFAULT_SCHEDULES,
    KERNELS,
    L2_KV_BYTES,
    LOADER_WARPS,
    SCHEDULES,
    SPILLED_BYTES,
    SUPPORTED_HEAD_DIMS,
    TILES,
    FlashAttentionGluon,
    check_inputs,
    compile_for_sm90,
    default_backward_schedule,
    default_schedule,
    flash_gluon_backward,
    flash_gluon_forward,
    head_split,
)

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel runs on a Hopper GPU")
SM90_SHARED_BYTES = 227 * 1024  # the most shared memory one block of an H100 or H200 may hold


@pytest.mark.parametrize("kernel, d", [(kernel, d) for kernel in KERNELS for d in TILES[kernel]])
def test_compiles_for_hopper_without_spilling(kernel, d):
    usage = compile_for_sm90(kernel, d, is_causal=True)
    # none, but where the module names a few bytes that it measured fastest with
    assert usage["spilled_bytes"] <= SPILLED_BYTES.get((kernel, d), 0), usage
    assert usage["shared_bytes"] <= SM90_SHARED_BYTES, usage
    # ptxas keeps every kernel's products in flight but the overlapped forward's: its P V
    # stays in flight into the next tile's step, reading P from registers that step rewrites,
    # and ptxas waits for each of its wgmmas at once (docs/measurements.md); should a compiler
    # keep them in flight, this says so
    assert usage["serialized_wgmma"] == (kernel == "forward-overlap"), usage
    # the registers a thread may have with its warps in one block of 64K (a loader partition's
    # warps count as a warpgroup of four: registers are allotted by warpgroup)
    tiles = TILES[kernel][d]
    warps = tiles.num_warps + {"forward-specialized": 4 * LOADER_WARPS,
                               "forward-pingpong": 4 * (tiles.query_tiles - 1) + 4 * LOADER_WARPS,
                               "dkdv-specialized": 8 + 4 * LOADER_WARPS,
                               "dkdv-paired": 4 + 4 * LOADER_WARPS}.get(kernel, 0)
    assert usage["registers"] <= min(255, 65536 // (32 * warps)), usage


def test_an_unknown_kernel_says_which_there_are():
    with pytest.raises(ValueError, match="allowed: forward, forward-overlap, "
                                         "forward-specialized, forward-pingpong, dkdv, dq, "
                                         "dkdv-atomic, dkdv-specialized, dkdv-paired, "
                                         "delta"):
        compile_for_sm90("backward", 64, True)


def test_every_head_dimension_has_each_default_schedules_tiles():
    """flash-gluon runs the default schedules at every supported d; the others say which they
    take (the atomic and specialized backwards, d 64: at 128 their key-tile kernels spill; the
    paired one, d 128)."""
    assert set(DEFAULT_SCHEDULES) == set(SUPPORTED_HEAD_DIMS)
    assert set(DEFAULT_BACKWARD_SCHEDULES) == set(SUPPORTED_HEAD_DIMS)
    for d, by_length in DEFAULT_SCHEDULES.items():
        assert 0 in by_length, d          # every length has a default
        for schedule in by_length.values():
            assert d in TILES[SCHEDULES[schedule]], (d, schedule)
    for d, by_length in DEFAULT_BACKWARD_SCHEDULES.items():
        assert 0 in by_length, d          # every length has a default
        for schedule in by_length.values():
            for kernel in BACKWARD_SCHEDULES[schedule]:
                assert d in TILES[kernel], (d, schedule, kernel)
    for kernel in BACKWARD_SCHEDULES["split"]:
        assert set(TILES[kernel]) == set(SUPPORTED_HEAD_DIMS), kernel
    q = torch.randn(1, 1, 16, 128, dtype=torch.bfloat16)
    for schedule in ("atomic", "specialized"):
        with pytest.raises(ValueError, match=rf"the {schedule} backward takes d in \(64,\); "
                                             "got 128"):
            flash_gluon_backward(q, q, q, q, q[..., 0].float(), q, True, schedule)
    q = q[..., :64]
    with pytest.raises(ValueError, match=r"the paired backward takes d in \(128,\); got 64"):
        flash_gluon_backward(q, q, q, q, q[..., 0].float(), q, True, "paired")
    with pytest.raises(ValueError, match="allowed: split, atomic, specialized, paired"):
        flash_gluon_backward(q, q, q, q, q[..., 0].float(), q, True, "fused")


def test_an_unknown_schedule_says_which_there_are():
    q = torch.randn(1, 1, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="allowed: waited, overlapped, specialized, pingpong"):
        flash_gluon_forward(q, q, q, schedule="fused")


def test_head_dims_between_powers_of_two_are_split_in_two_tiles():
    """d 80 and 96 run as 64 columns and a rest of 16 or 32, each a TMA tile and a wgmma of its
    own (register tensors have power-of-two shapes), in the waited forward and the split
    backward; the other schedules say which d they take."""
    assert [head_split(d) for d in SUPPORTED_HEAD_DIMS] == [(64, 0), (64, 16), (64, 32),
                                                            (128, 0)]
    for d in (80, 96):
        assert default_schedule(d, 65536) == "waited"
        assert default_backward_schedule(d, 65536) == "split"
    q = torch.randn(1, 1, 16, 80, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"the pingpong forward takes d in \(64, 128\); got 80"):
        flash_gluon_forward(q, q, q, True, "pingpong")
    with pytest.raises(ValueError, match=r"the paired backward takes d in \(128,\); got 80"):
        flash_gluon_backward(q, q, q, q, q[..., 0].float(), q, True, "paired")


def _reference(q, k, v, is_causal):
    """o and the logsumexp in float64."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        seq = q.shape[-2]
        scores = scores.masked_fill(~torch.ones(seq, seq, dtype=torch.bool,
                                                device=q.device).tril(), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, scores.logsumexp(dim=-1)


@needs_hopper
@pytest.mark.parametrize("schedule, d", [(schedule, d) for schedule, kernel in SCHEDULES.items()
                                         for d in TILES[kernel]])
@pytest.mark.parametrize("seq", [128, 257, 1000])
@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forward_matches_float64(d, seq, is_causal, dtype, schedule):
    torch.manual_seed(seq + d)
    q, k, v = (torch.randn(2, 3, seq, d, device="cuda", dtype=dtype) for _ in range(3))
    o, lse = flash_gluon_forward(q, k, v, is_causal, schedule)
    o_ref, lse_ref = _reference(q, k, v, is_causal)
    error = (o.double() - o_ref).norm() / o_ref.norm()
    assert error < (1e-2 if dtype == torch.bfloat16 else 2e-3), f"o: relative error {error:.3g}"
    torch.testing.assert_close(lse.double(), lse_ref, rtol=1e-4, atol=1e-3)


@needs_hopper
@pytest.mark.parametrize("schedule, d", [(schedule, d) for schedule, kernels in
                                         BACKWARD_SCHEDULES.items() for d in TILES[kernels[-1]]])
@pytest.mark.parametrize("seq", [128, 257, 1000])
@pytest.mark.parametrize("is_causal", [True, False])
def test_gradients_match_float64(schedule, d, seq, is_causal):
    torch.manual_seed(2 * seq + d)
    q, k, v = (torch.randn(2, 3, seq, d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    grad_o = torch.randn(2, 3, seq, d, device="cuda", dtype=torch.bfloat16)
    if schedule == default_backward_schedule(d, seq):   # through the autograd function
        FlashAttentionGluon.apply(q, k, v, is_causal).backward(grad_o)
        got = [t.grad for t in (q, k, v)]
    else:
        o, lse = flash_gluon_forward(q.detach(), k.detach(), v.detach(), is_causal)
        got = flash_gluon_backward(q.detach(), k.detach(), v.detach(), o, lse, grad_o,
                                   is_causal, schedule)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    _reference(q64, k64, v64, is_causal)[0].backward(grad_o.double())
    for name, g, ref in zip("qkv", got, (q64.grad, k64.grad, v64.grad)):
        error = (g.double() - ref).norm() / ref.norm()
        assert error < 2e-2, f"d{name}: relative error {error:.3g}"


@needs_hopper
@pytest.mark.parametrize("heads, seq, d", [(3, 32768, 128), (6, 32768, 64), (41, 4096, 64)])
def test_heads_in_l2_groups_compute_what_each_head_does_alone(heads, seq, d):
    """Where the heads' K and V do not fit in L2_KV_BYTES, the query-tile kernels take the heads
    in groups (`_query_tile`), the last group smaller at these shapes (2 + 1, 4 + 2, 32 + 9
    heads): each head's o and logsumexp, and its gradients where the backward runs no
    reductions (split), are those of the head run alone, bit for bit."""
    assert seq * d * 4 * heads > L2_KV_BYTES
    torch.manual_seed(heads)
    q, k, v, grad_o = (torch.randn(1, heads, seq, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(4))
    o, lse = flash_gluon_forward(q, k, v, True)
    deterministic = default_backward_schedule(d, seq) == "split"
    if deterministic:
        grads = flash_gluon_backward(q, k, v, o, lse, grad_o, True)
    for h in range(heads):
        one = [t[:, h:h + 1].contiguous() for t in (q, k, v, grad_o)]
        o_one, lse_one = flash_gluon_forward(*one[:3], True)
        assert torch.equal(o[:, h:h + 1], o_one), h
        assert torch.equal(lse[:, h:h + 1], lse_one), h
        if deterministic:
            alone = flash_gluon_backward(*one[:3], o_one, lse_one, one[3], True)
            for name, g, g_one in zip("qkv", grads, alone):
                assert torch.equal(g[:, h:h + 1], g_one), (h, name)


def test_the_default_forward_pingpongs_three_consumers_for_long_sequences_at_d64():
    assert [default_schedule(64, seq) for seq in (1, 4096, 8191, 8192, 65536)] == [
        "waited", "waited", "waited", "pingpong", "pingpong"]
    assert TILES["forward-pingpong"][64].query_tiles == 3
    assert {default_schedule(128, seq) for seq in (1, 4096, 65536)} == {"pingpong"}


def test_the_default_backward_is_warp_specialized_for_long_sequences():
    assert [default_backward_schedule(64, seq) for seq in (1, 4096, 8191, 8192, 65536)] == [
        "split", "split", "split", "specialized", "specialized"]
    assert [default_backward_schedule(128, seq) for seq in (1, 2048, 4095, 4096, 65536)] == [
        "split", "split", "split", "paired", "paired"]


@needs_hopper
@pytest.mark.parametrize("d, schedule", [(64, "specialized"), (128, "paired")])
@pytest.mark.parametrize("is_causal", [True, False])
def test_the_autograd_function_takes_the_long_default_backward(d, schedule, is_causal):
    """From its head dim's first long length on (8192 keys at d 64, 4096 at 128) the autograd
    function runs the warp-specialized backward: its gradients against float64 (one head, so
    that the reference's scores fit), at a length with a masked tail."""
    torch.manual_seed(8192 + d)
    seq = max(length for length in DEFAULT_BACKWARD_SCHEDULES[d])
    q, k, v = (torch.randn(1, 1, seq + 3, d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    grad_o = torch.randn(1, 1, seq + 3, d, device="cuda", dtype=torch.bfloat16)
    assert default_backward_schedule(d, seq + 3) == schedule
    FlashAttentionGluon.apply(q, k, v, is_causal).backward(grad_o)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    _reference(q64, k64, v64, is_causal)[0].backward(grad_o.double())
    for name, t, ref in zip("qkv", (q, k, v), (q64.grad, k64.grad, v64.grad)):
        error = (t.grad.double() - ref).norm() / ref.norm()
        assert error < 2e-2, f"d{name}: relative error {error:.3g}"


def test_each_kernels_grid_has_a_program_per_tile_it_owns():
    """Query-tile kernels take the heads fastest over their grid, the others their tiles; the
    ping-pong forward's programs own three query tiles at d 64 and two at d 128, the specialized
    and paired backwards' 128 keys."""
    from cs336_systems.kernels.flash_gluon import Tiles
    from cs336_systems.kernels.flash_gluon.host import _launch_plan
    heads, seq = 48, 1000
    grids = {kernel: _launch_plan(kernel, heads, seq, 64, True, TILES[kernel][64]).grid
             for kernel in ("forward", "forward-pingpong", "dq", "dkdv", "dkdv-specialized",
                            "delta")}
    assert grids == {"forward": (heads, 16), "forward-pingpong": (heads, 6), "dq": (heads, 16),
                     "dkdv": (16, heads), "dkdv-specialized": (8, heads), "delta": (16, heads)}
    assert _launch_plan("forward-pingpong", heads, seq, 128, True,
                        TILES["forward-pingpong"][128]).grid == (heads, 8)
    assert _launch_plan("dkdv-paired", heads, seq, 128, True,
                        TILES["dkdv-paired"][128]).grid == (8, heads)
    assert _launch_plan("delta", heads, seq, 64, True, TILES["delta"][64]).kwargs == {
        "HEAD_D": 64, "BLOCK": 64, "num_warps": 4}
    # other tiles (a sweep's) are another plan, not the cached default's
    assert _launch_plan("dq", heads, seq, 64, True, Tiles(block_m=128)).grid == (heads, 8)


@pytest.mark.parametrize("kernel, d", [(kernel, d) for kernel in KERNELS for d in TILES[kernel]
                                      if kernel != "delta"])
def test_each_kernels_descriptors_are_the_tiles_it_is_compiled_for(kernel, d):
    """The descriptors a launch makes (`_operands`) are, in order, the TMA tiles of the
    signature the kernel compiles for: each one's rows and columns and its dtype."""
    import re

    from cs336_systems.kernels.flash_gluon.host import _operands
    from cs336_systems.kernels.flash_gluon.resources import _signature
    from cs336_systems.kernels.flash_gluon.tiles import _O_BY_TMA
    rows = [torch.randn(2, 256, d, dtype=torch.bfloat16)   # q, k, v, and dO or O
            for _ in range(3 if kernel.startswith("forward") and kernel not in _O_BY_TMA else 4)]
    made = [(list(m.block_shape), m.shape, m.base.dtype) for m in _operands(kernel, d, *rows)
            if m is not None]
    compiled = [[int(n) for n in re.match(r"tensordesc<bf16\[(\d+), (\d+)\]", kind).groups()]
                for name, kind in _signature(kernel, d, TILES[kernel][d], torch.bfloat16).items()
                if kind.startswith("tensordesc<bf16")]
    assert [block for block, *_ in made] == compiled
    assert all(shape == [512, d] and dtype == torch.bfloat16 for _, shape, dtype in made)


def _in_thread_order(block: torch.Tensor) -> torch.Tensor:
    """A (64, cols) block in a warpgroup's thread order, as `_thread_order` documents it: warp,
    column group of 8, lane // 4, lane % 4, then the lane's two rows and two columns."""
    cols = block.shape[1]
    return block.reshape(4, 2, 8, cols // 8, 4, 2).permute(0, 3, 2, 4, 1, 5).reshape(-1)


@pytest.mark.parametrize("kernel, d", [("dkdv-specialized", 64), ("dkdv-paired", 128)])
def test_the_dq_accumulator_in_thread_order_comes_back_in_rows(kernel, d):
    """`unpermute_dq` inverts the order the specialized and paired backwards add dQ in, each
    warpgroup's columns a part of a tile's block, tails included; the accumulator's descriptor
    is a warpgroup's part, the tile the kernel compiles for."""
    from cs336_systems.kernels.flash_gluon import unpermute_dq
    from cs336_systems.kernels.flash_gluon.host import _dq_accumulator, _dq_columns
    from cs336_systems.kernels.flash_gluon.resources import _signature
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")   # else interpreted
    heads, seq, block_m = 3, 100, TILES[kernel][d].block_m
    tiles = -(-seq // block_m)
    # values bf16 holds exactly: the interpreter rounds fp32 to bf16 toward zero, a GPU to
    # the nearest
    dq = torch.randn(heads, tiles * block_m, d, device=device).to(torch.bfloat16).float()
    cols = _dq_columns(kernel, d)
    acc = torch.cat([_in_thread_order(dq[h, t * block_m:(t + 1) * block_m, c:c + cols])
                     for h in range(heads) for t in range(tiles) for c in range(0, d, cols)])
    out = torch.empty(heads, seq, d, dtype=torch.bfloat16, device=device)
    unpermute_dq[(tiles, heads)](acc, out, seq, HEAD_D=d, BLOCK_M=block_m, PARTS=d // cols)
    assert torch.equal(out.float(), dq[:, :seq])
    zeros, desc = _dq_accumulator(kernel, heads, seq, d, device)
    assert zeros.numel() == acc.numel() and not zeros.any()
    assert desc.block_shape == [block_m * cols // 32, 32]
    assert f"fp32[{block_m * cols // 32}, 32]" in _signature(kernel, d, TILES[kernel][d],
                                                              torch.bfloat16)["dq_desc"]


def test_a_descriptor_is_made_once_an_address_shape_and_tile_and_holds_no_tensor():
    """Launches at the addresses of the step before take the descriptors made then; another
    address, shape or tile is another descriptor; a cached one keeps no memory alive."""
    import gc
    import weakref

    from cs336_systems.kernels.flash_gluon.host import _descriptor
    x = torch.randn(4, 128, 64, dtype=torch.bfloat16)
    first = _descriptor(x, 64)
    assert _descriptor(x, 64) is first
    assert first.base.data_ptr() == x.data_ptr() and first.shape == [512, 64]
    others = [_descriptor(x.view(2, 256, 64)[:1], 64), _descriptor(x, 128), _descriptor(x, 64, 32),
              _descriptor(x.clone(), 64), _descriptor(x.half(), 64)]
    assert all(other is not first for other in others)
    alive = weakref.ref(x)
    del x
    gc.collect()
    assert alive() is None


def test_unsupported_inputs_say_what_is_supported():
    q = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"d in \(64, 80, 96, 128\); got 112"):
        check_inputs(*(torch.randn(1, 2, 16, 112, dtype=torch.bfloat16) for _ in range(3)))
    with pytest.raises(ValueError, match="one dtype of bfloat16, float16"):
        check_inputs(q.float(), q.float(), q.float())
    with pytest.raises(ValueError, match=r"one \(batch, heads, seq, d\) or \(batch, seq, d\) "
                                         "shape"):
        check_inputs(q, q[:, :1], q)
    with pytest.raises(ValueError, match=r"at least one row of q, k, v; got \(1, 2, 0, 64\)"):
        check_inputs(*(q[:, :, :0],) * 3)
    with pytest.raises(ValueError, match=r"got \(1, 1, 2, 16, 64\)"):
        check_inputs(*(q[:, None],) * 3)
    for shape in (q, q[:, 0]):          # (batch, heads, seq, d), or one head
        if HOPPER:
            check_inputs(shape.cuda(), shape.cuda(), shape.cuda())
        else:
            with pytest.raises(ValueError, match="on a Hopper GPU"):
                check_inputs(shape, shape, shape)


def test_flash_gluon_falls_back_to_the_triton_kernel_saying_why(caplog):
    """Where the Gluon kernels cannot run (here: the CPU, or a head dimension of 32), the
    registry's flash-gluon is the Triton FA2's result, with the reason logged."""
    from cs336_systems.lm.attention import _log_fallback_once, get_attention
    _log_fallback_once.cache_clear()  # logged once a process: another test may have come first
    device = "cuda" if HOPPER else "cpu"
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 32, device=device) for _ in range(3))
    with caplog.at_level("WARNING"):
        o = get_attention("flash-gluon")(q, k, v, is_causal=True)
    expected = get_attention("flash-triton")(q, k, v, is_causal=True)
    torch.testing.assert_close(o, expected, rtol=0, atol=0)
    assert "flash-gluon runs the Triton FA2 here" in caplog.text


@needs_hopper
@pytest.mark.parametrize("compiled", [False, True])
def test_registry_choice_matches_float64_eager_and_compiled(compiled):
    """`flash-gluon` as the models call it: (batch, heads, seq, d) views of a (batch, seq,
    heads, d) projection, through the operators under torch.compile."""
    from cs336_systems.lm.attention import get_attention
    torch.manual_seed(7)
    qkv = torch.randn(2, 300, 3, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad_o = torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16)
    attend = get_attention("flash-gluon")
    if compiled:
        attend = torch.compile(attend, fullgraph=True)
    q, k, v = qkv.unbind(2)
    attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True).backward(grad_o)
    qkv64 = qkv.detach().double().requires_grad_()
    q, k, v = (t.transpose(1, 2) for t in qkv64.unbind(2))
    _reference(q, k, v, True)[0].backward(grad_o.double())
    error = (qkv.grad.double() - qkv64.grad).norm() / qkv64.grad.norm()
    assert error < 2e-2, f"gradients: relative error {error:.3g}"


@needs_hopper
def test_a_models_head_views_are_copied_once_for_forward_and_backward():
    """q, k, v as a model passes them, (batch, heads, seq, d) views of a token-major projection:
    the forward copies them to the rows the kernels read and saves the copies, so that the
    backward copies nothing of them again."""
    from cs336_systems.lm.attention import get_attention
    torch.manual_seed(5)
    qkv = torch.randn(2, 300, 3, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
    o = get_attention("flash-gluon")(q, k, v, True)
    saved = o.grad_fn.saved_tensors[:3]
    assert all(t.is_contiguous() for t in saved) and not q.is_contiguous()
    assert [t.shape for t in saved] == [q.shape] * 3
    assert all(torch.equal(a, b) for a, b in zip(saved, (q, k, v)))


@needs_hopper
@pytest.mark.parametrize("d", SUPPORTED_HEAD_DIMS)
def test_one_head_inputs_match_float64_with_no_copy_in_backward(d):
    """(batch, seq, d) inputs, as the flash benchmarks pass them: one head, run as they come, so
    that the backward is the kernels' alone (no view's node, no select's zero-fill and copy)."""
    from cs336_systems.lm.attention import get_attention
    torch.manual_seed(d)
    q, k, v = (torch.randn(3, 200, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad_o = torch.randn(3, 200, d, device="cuda", dtype=torch.bfloat16)
    o = get_attention("flash-gluon")(q, k, v, True)
    assert type(o.grad_fn).__name__ == "FlashAttentionGluonBackward", o.grad_fn
    o.backward(grad_o)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o64 = _reference(q64, k64, v64, True)[0]
    o64.backward(grad_o.double())
    assert (o.double() - o64).norm() / o64.norm() < 1e-2
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert (got.double() - want).norm() / want.norm() < 2e-2
