"""The AdamW stepped in backward with its moments on the host (lm/offloaded_adamw.py) against the
fused AdamW stepping after backward, on fresh random weights and batches: the same parameters and
moments bit for bit after several steps, in one process and on two FSDP2 ranks (gloo), each
layer's gradients gone once backward has stepped it; and what it refuses. On a CPU the update
runs under Triton's interpreter."""

import pytest
import torch
from conftest import DEVICE

from cs336_systems.lm.build import cpu_unavailable_reason
from cs336_systems.lm.fused_adamw import FusedAdamW
from cs336_systems.lm.levers import LanguageModelLoss
from cs336_systems.lm.model import TransformerLM
from cs336_systems.lm.offloaded_adamw import OffloadedAdamW
from cs336_systems.lm.optimizer import build_optimizer, is_per_layer, layer_groups
from support.distributed import run_on_ranks, save_result

VOCAB, SEQ, LAYERS = 64, 8, 3
STEPS = 3
HYPER = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)


def _model(seed: int, device=DEVICE) -> LanguageModelLoss:
    torch.manual_seed(seed)
    model = TransformerLM(VOCAB, SEQ, d_model=16, num_layers=LAYERS, num_heads=2, d_ff=24,
                          attention="sdpa", device=device)
    return LanguageModelLoss(model)


def _batches(seed: int, device=DEVICE):
    generator = torch.Generator(device=device).manual_seed(seed)
    return [tuple(torch.randint(0, VOCAB, (2, SEQ), device=device, generator=generator)
                  for _ in range(2)) for _ in range(STEPS)]


def _offloaded(lm_loss: LanguageModelLoss, lookahead: int, prefetch: bool = True
               ) -> OffloadedAdamW:
    optimizer = OffloadedAdamW(layer_groups(lm_loss, lm_loss.model.layers), lookahead=lookahead,
                               **HYPER)
    if prefetch:  # else each step's first group is fetched when its gradients arrive
        lm_loss.model.ln_final.register_forward_pre_hook(lambda *_: optimizer.prefetch())
    return optimizer


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


@pytest.mark.parametrize("lookahead, prefetch", [(1, True), (2, True), (5, True), (2, False)])
def test_stepping_in_backward_is_the_fused_step_after_it(lookahead, prefetch):
    seed = int(torch.randint(0, 2**31, ()))
    ours, reference = _model(seed), _model(seed)
    optimizer = _offloaded(ours, lookahead, prefetch)
    fused = FusedAdamW(reference.parameters(), **HYPER)
    layer_params = {p for layer in ours.model.layers for p in layer.parameters()}
    for ids, targets in _batches(seed):
        ours(ids, targets).backward()
        # each layer stepped and its gradients dropped in backward; the rest wait for step()
        for p in ours.parameters():
            assert (p.grad is None) == (p in layer_params)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        reference(ids, targets).backward()
        fused.step()
        fused.zero_grad(set_to_none=True)
        for (name, p), q in zip(ours.named_parameters(), reference.parameters()):
            assert torch.equal(p, q), name
    for p, q in zip(ours.parameters(), reference.parameters()):
        for moment in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizer.state[p][moment], fused.state[q][moment])
        assert optimizer.state[p]["step"] == fused.state[q]["step"] == STEPS
    assert not torch.equal(next(ours.parameters()), _model(seed).parameters().__next__())


def test_the_registry_builds_it_over_one_group_per_layer():
    lm_loss = _model(0)
    assert is_per_layer("adamw-offloaded") and not is_per_layer("adamw-fused")
    groups = layer_groups(lm_loss, lm_loss.model.layers)
    assert [g["params"] for g in groups[:LAYERS]] == [
        list(layer.parameters()) for layer in reversed(lm_loss.model.layers)]
    assert sum(len(g["params"]) for g in groups) == len(list(lm_loss.parameters()))
    assert isinstance(build_optimizer("adamw-offloaded", groups), OffloadedAdamW)
    # its update is the fused Triton pass: compiled layers beside it are refused on a CPU
    assert "interpreter" in cpu_unavailable_reason("sdpa", "adamw-offloaded", True, "fp32")
    assert cpu_unavailable_reason("sdpa", "adamw-offloaded", False, "fp32") is None


def test_groups_out_of_backward_order_are_refused_with_the_reason():
    lm_loss = _model(1)
    groups = layer_groups(lm_loss, list(reversed(lm_loss.model.layers)))  # the first layer first
    optimizer = OffloadedAdamW(groups, lookahead=1, **HYPER)
    lm_loss.model.ln_final.register_forward_pre_hook(lambda *_: optimizer.prefetch())
    ids, targets = _batches(1)[0]
    with pytest.raises(RuntimeError, match="order backward completes them"):
        lm_loss(ids, targets).backward()


def test_it_gives_its_moments_but_loads_no_state():
    lm_loss = _model(4)
    optimizer = OffloadedAdamW(layer_groups(lm_loss, lm_loss.model.layers), **HYPER)
    state = optimizer.state_dict()
    assert len(state["state"]) == len(list(lm_loss.model.layers.parameters()))
    with pytest.raises(NotImplementedError, match="does not load state"):
        optimizer.load_state_dict(state)


def test_gradients_its_hooks_never_saw_are_an_error_at_step():
    lm_loss = _model(2)
    optimizer = OffloadedAdamW(layer_groups(lm_loss, lm_loss.model.layers), **HYPER)
    for p in lm_loss.parameters():
        p.grad = torch.randn_like(p)  # as if backward had run without the hooks
    with pytest.raises(RuntimeError, match="hooks did not all run"):
        optimizer.step()


@pytest.mark.parametrize("groups, message", [
    (lambda m: list(m.parameters()), "marked \"offload\""),
    (lambda m: [{"params": [p.detach().bfloat16().requires_grad_()], "offload": True}
                for p in m.parameters()], "fp32 parameters"),
])
def test_what_it_cannot_offload_is_refused(groups, message):
    with pytest.raises(ValueError, match=message):
        OffloadedAdamW(groups(_model(3)), **HYPER)
    with pytest.raises(ValueError, match="lookahead"):
        OffloadedAdamW(layer_groups(_model(3), _model(3).model.layers), lookahead=0)


def _fsdp_worker(rank: int, world_size: int, out_dir: str, seed: int) -> None:
    from cs336_systems.distributed.fully_shard import fully_shard_layers
    device = torch.device("cpu")
    models = []
    for _ in range(2):
        lm_loss = _model(seed, device)
        fully_shard_layers(lm_loss, lm_loss.model.layers, device)
        models.append(lm_loss)
    ours, reference = models
    optimizer = _offloaded(ours, lookahead=2)
    fused = FusedAdamW(reference.parameters(), **HYPER)
    dropped = []
    for ids, targets in _batches(seed + rank, device):
        for lm_loss, opt in ((ours, optimizer), (reference, fused)):
            lm_loss(ids, targets).backward()
            if opt is optimizer:
                dropped.append([p.grad is None for p in ours.model.layers.parameters()])
            opt.step()
            opt.zero_grad(set_to_none=True)
    save_result(out_dir, rank, {
        "ours": [_local(p).detach().clone() for p in ours.parameters()],
        "reference": [_local(p).detach().clone() for p in reference.parameters()],
        "dropped": dropped})


@pytest.mark.pipeline  # starts ranks of a process group: the full test command runs it
def test_on_two_fsdp2_ranks_it_steps_each_shard_as_the_fused_step(tmp_path):
    seed = int(torch.randint(0, 2**31, ()))
    for result in run_on_ranks(_fsdp_worker, tmp_path, seed):
        assert all(all(step) for step in result["dropped"])  # stepped in FSDP's reduce
        for p, q in zip(result["ours"], result["reference"]):
            assert torch.equal(p, q)
