"""The fused AdamW (lm/fused_adamw.py over kernels/adamw.py) against the readable AdamW and
torch's, over several steps on fresh random parameters and gradients: fp32, bf16 gradients of
fp32 masters, tensors larger than one chunk, several groups, and what the kernel refuses. On a
CPU it runs under Triton's interpreter."""

import pytest
import torch
from conftest import DEVICE

from cs336_systems.kernels.adamw import BLOCK, CHUNK, Plan
from cs336_systems.lm.adamw import AdamW
from cs336_systems.lm.fused_adamw import FusedAdamW
from cs336_systems.lm.optimizer import OPTIMIZERS, build_optimizer, optimizer_modules

# odd sizes, a tensor of more than one chunk, one of whole blocks and a tail, a 1-element and
# a 2-D one
SHAPES = [(7,), (CHUNK + 1001,), (2 * BLOCK + 5,), (1,), (33, 65)]
STEPS = 5
# fp32 rounding over a few steps (fused multiply-adds where the reference rounds twice)
FP32 = dict(rtol=1e-5, atol=1e-6)


def _params(shapes, dtype=torch.float32):
    return [torch.nn.Parameter(torch.randn(shape, device=DEVICE, dtype=dtype)) for shape in shapes]


def _param(tensor: torch.Tensor, grad_dtype: torch.dtype) -> torch.nn.Parameter:
    p = torch.nn.Parameter(tensor.detach().clone())
    if grad_dtype != p.dtype:
        p.grad_dtype = grad_dtype  # torch >= 2.12: a gradient of another dtype than its tensor
    return p


def _run(optimizer_cls, groups, grads, **kwargs):
    """`STEPS` steps of `optimizer_cls` over copies of `groups` ([params] per group, with
    per-group options), fed the same gradients; the parameters and moments after."""
    grad_dtype = grads[0][0][0].dtype
    copies = [{"params": [_param(p, grad_dtype) for p in g["params"]],
               **{k: v for k, v in g.items() if k != "params"}} for g in groups]
    optimizer = optimizer_cls(copies, **kwargs)
    for step in range(STEPS):
        for group, group_grads in zip(copies, grads[step]):
            for p, g in zip(group["params"], group_grads):
                p.grad = g.clone()
        optimizer.step()
    params = [p for g in copies for p in g["params"]]
    state = [(optimizer.state[p]["exp_avg"], optimizer.state[p]["exp_avg_sq"]) for p in params]
    return params, state


def _grads(groups, dtype):
    return [[[torch.randn_like(p, dtype=dtype) for p in g["params"]] for g in groups]
            for _ in range(STEPS)]


@pytest.mark.parametrize("kwargs", [dict(lr=1e-3, weight_decay=0.01),
                                    dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6,
                                         weight_decay=0.1)])
def test_fused_adamw_is_the_reference_update(kwargs):
    groups = [{"params": _params(SHAPES)}, {"params": _params([(5, 3)]), "lr": 0.5,
                                            "weight_decay": 0.0}]
    grads = _grads(groups, torch.float32)
    fused, fused_state = _run(FusedAdamW, groups, grads, **kwargs)
    ours, ours_state = _run(AdamW, groups, grads, **kwargs)
    torch_params, torch_state = _run(torch.optim.AdamW, groups, grads, **kwargs)
    initial = [p for g in groups for p in g["params"]]
    for f, o, t, p in zip(fused, ours, torch_params, initial):
        torch.testing.assert_close(f, o, **FP32)
        torch.testing.assert_close(f, t, **FP32)
        assert not torch.equal(f, p)  # every tensor moved
    for (fm, fv), (om, ov) in zip(fused_state, ours_state):
        torch.testing.assert_close(fm, om, **FP32)
        torch.testing.assert_close(fv, ov, **FP32)


@pytest.mark.skipif(not hasattr(torch.Tensor, "grad_dtype"),
                    reason="this torch takes no gradient of another dtype than its tensor")
def test_bf16_gradients_update_fp32_masters_as_their_fp32_values_would():
    groups = [{"params": _params(SHAPES)}]
    grads = _grads(groups, torch.bfloat16)
    fused, _ = _run(FusedAdamW, groups, grads, lr=1e-2)
    as_fp32 = [[[g.float() for g in group] for group in step] for step in grads]
    reference, _ = _run(AdamW, groups, as_fp32, lr=1e-2)
    for f, r in zip(fused, reference):
        assert f.dtype == torch.float32
        torch.testing.assert_close(f, r, **FP32)


@pytest.mark.skipif(not hasattr(torch.Tensor, "grad_dtype"),
                    reason="this torch takes no gradient of another dtype than its tensor")
def test_working_copies_update_as_their_fp32_masters_would_and_are_them_rounded():
    shapes = [*SHAPES, (BLOCK,)]
    initial = _params(shapes)
    grads = [[torch.randn(shape, device=DEVICE, dtype=torch.bfloat16) for shape in shapes]
             for _ in range(STEPS)]
    # the reference: fp32 parameters taking the same bf16 gradients
    reference = [_param(p, torch.bfloat16) for p in initial]
    copies = [torch.nn.Parameter(p.detach().clone()) for p in initial]
    optimizers = FusedAdamW(reference, lr=1e-2), FusedAdamW(copies, lr=1e-2)
    optimizers[1].hold_masters(copies[1:], torch.bfloat16)  # the first stays fp32
    assert copies[0].dtype == torch.float32
    assert all(c.dtype == torch.bfloat16 for c in copies[1:])
    for step in grads:
        for r, c, g in zip(reference, copies, step):
            r.grad = g.clone()
            c.grad = g.clone().to(c.dtype)  # the fp32 one's: the same values, exactly
        for optimizer in optimizers:
            optimizer.step()
    masters = [copies[0]] + [optimizers[1].state[c]["master"] for c in copies[1:]]
    for r, m, c, p in zip(reference, masters, copies, initial):
        assert torch.equal(m, r)                  # the same update, bit for bit
        assert torch.equal(c, m.to(c.dtype))      # the copy is the master, rounded
        assert not torch.equal(m, p)
    for p in copies[1:]:
        for name in ("exp_avg", "exp_avg_sq"):
            assert optimizers[1].state[p][name].dtype == torch.float32


def test_what_hold_masters_refuses_it_says():
    a, b = _params([(8,), (4,)])
    optimizer = FusedAdamW([a], lr=0.1)
    with pytest.raises(ValueError, match="parameters of this optimizer"):
        optimizer.hold_masters([b], torch.bfloat16)
    a.grad = torch.randn_like(a)
    optimizer.step()
    with pytest.raises(ValueError, match="before the first step"):
        optimizer.hold_masters([a], torch.bfloat16)
    half = _params([(8,)], dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="fp32 parameter"):
        FusedAdamW(half).hold_masters(half, torch.bfloat16)


def test_parameters_without_gradients_are_left_alone():
    a, b = _params([(9,), (4,)])
    before = b.detach().clone()
    optimizer = FusedAdamW([a, b], lr=0.1)
    a.grad = torch.randn_like(a)
    optimizer.step()
    assert torch.equal(b, before) and b not in optimizer.state


def test_what_the_kernel_refuses_it_says():
    base = torch.randn(20, device=DEVICE)
    view = torch.nn.Parameter(base[1:9])  # 4 bytes past an aligned start
    view.grad = torch.randn_like(view)
    with pytest.raises(ValueError, match="16-byte aligned"):
        FusedAdamW([view]).step()
    strided = torch.nn.Parameter(torch.randn(6, 4, device=DEVICE).T)
    strided.grad = torch.randn_like(strided)
    with pytest.raises(ValueError, match="contiguous"):
        FusedAdamW([strided]).step()
    with pytest.raises(ValueError, match="betas"):
        FusedAdamW(_params([(2,)]), betas=(0.9, 1.0))
    params = _params([(8,)])
    plan = Plan(params, [torch.zeros_like(p) for p in params],
                [torch.zeros_like(p) for p in params], chunk=1024)
    with pytest.raises(ValueError, match="must divide the chunk"):
        plan.step([torch.randn_like(p) for p in params], step=1, lr=1e-3, beta1=0.9,
                  beta2=0.999, eps=1e-8, weight_decay=0.0, block=768)


def test_the_registry_builds_each_optimizer_and_names_its_kernel():
    assert list(OPTIMIZERS) == ["adamw", "adamw-fused", "adamw-offloaded", "torch-adamw-fused"]
    assert isinstance(build_optimizer("adamw-fused", _params([(3,)])), FusedAdamW)
    assert optimizer_modules("adamw-fused") == ["cs336_systems.kernels.adamw",
                                                "cs336_systems.lm.fused_adamw"]
    assert optimizer_modules("adamw-offloaded") == ["cs336_systems.kernels.adamw",
                                                    "cs336_systems.lm.fused_adamw",
                                                    "cs336_systems.lm.offloaded_adamw"]
    assert optimizer_modules("adamw") == []
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'; allowed: adamw, adamw-fused"):
        build_optimizer("sgd", _params([(3,)]))


def test_the_launch_plan_is_kept_between_steps_and_rebuilt_when_the_tensors_change():
    a, b = _params([(9,), (40,)])
    optimizer = FusedAdamW([a, b], lr=0.1)
    for p in (a, b):
        p.grad = torch.randn_like(p)
    optimizer.step()
    (plan,) = optimizer._plans.values()
    for p in (a, b):
        p.grad = torch.randn_like(p)  # new gradients, new addresses: the plan stays
    optimizer.step()
    assert list(optimizer._plans.values()) == [plan]
    b.grad = None  # b sits this step out: a plan of a alone
    a.grad = torch.randn_like(a)
    optimizer.step()
    assert list(optimizer._plans.values())[0] is not plan
    assert list(optimizer._plans.values())[0].params == [a]
