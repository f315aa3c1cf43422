"""Every data-parallel method, on 2 gloo ranks each training on half the batch, ends with the
weights of single-process training on the whole batch.

The ranks start from different random weights (the model is built with a per-rank seed, rank 0
with the reference's): only a correct broadcast from rank 0 makes them agree.
"""

from __future__ import annotations

import traceback

import pytest
import torch

from cs336_systems.distributed import (
    DDP,
    FSDP,
    DDPBucketed,
    allreduce_gradients_flat,
    allreduce_gradients_individually,
    broadcast_parameters,
)
from support.distributed import (
    batches,
    build_model,
    local_rows,
    loss_fn,
    make_optimizer,
    run_on_ranks,
    save_result,
    state_of,
    train_reference,
)

STEPS = 3
FP32 = dict(rtol=1e-5, atol=1e-6)
GPU_FP32 = dict(rtol=1e-4, atol=1e-5)  # GPU kernels sum in another order than the CPU's
BF16 = dict(rtol=0.0, atol=1e-2)  # bf16 forward/backward, fp32 master weights and reduction

# variant -> (optimizer, tolerance against the fp32 single-process reference). SGD is the
# default because it is sensitive to the gradient's scale (Adam hides a missing 1/world_size).
VARIANTS = {
    "naive-individual": ("sgd", FP32),
    "naive-flat": ("sgd", FP32),
    "ddp": ("sgd", FP32),
    "ddp-bucketed-small": ("sgd", FP32),
    "ddp-bucketed-one": ("sgd", FP32),
    "fsdp": ("sgd", FP32),
    "fsdp-adamw": ("adamw", FP32),  # Adam's moments live on the shards only
    "fsdp-bf16": ("sgd", BF16),
}


def _wrap(variant: str, model: torch.nn.Module):
    """(model to train, function called between backward and step)."""
    if variant.startswith("naive"):
        broadcast_parameters(model)
        sync = (allreduce_gradients_individually if variant == "naive-individual"
                else allreduce_gradients_flat)
        return model, lambda: sync(model)
    if variant == "ddp":
        wrapped = DDP(model)
    elif variant == "ddp-bucketed-small":  # ~2.5 KB: the 2 KB embedding alone, biases together
        wrapped = DDPBucketed(model, bucket_size_mb=2.5e-3)
        assert len(wrapped.buckets) >= 3, [len(b) for b in wrapped.buckets]
    elif variant == "ddp-bucketed-one":
        wrapped = DDPBucketed(model, bucket_size_mb=100)
        assert len(wrapped.buckets) == 1
    else:
        wrapped = FSDP(model, compute_dtype=torch.bfloat16 if variant == "fsdp-bf16" else None)
    return wrapped, wrapped.finish_gradient_synchronization


def _train(variant: str, rank: int, world_size: int, device: torch.device) -> dict:
    model, sync = _wrap(variant, build_model(seed_offset=rank).to(device))
    optimizer = make_optimizer(VARIANTS[variant][0], model.parameters())
    for tokens, targets in batches(STEPS):
        optimizer.zero_grad()
        loss = loss_fn(model, local_rows(tokens, rank, world_size).to(device),
                       local_rows(targets, rank, world_size).to(device))
        loss.backward()
        sync()
        optimizer.step()
    if isinstance(model, FSDP):
        result = {**model.gather_full_params(), **dict(model.module.named_buffers())}
    else:
        result = state_of(getattr(model, "module", model))
    return {name: t.cpu() for name, t in result.items()}


def _train_worker(rank: int, world_size: int, out_dir: str, variants: list[str],
                  device: str) -> None:
    """Every variant in turn on the same two ranks (one spawn for all: starting processes is
    most of a run's time); a variant that raises leaves its traceback as its result."""
    device = torch.device(device, rank) if device == "cuda" else torch.device(device)
    results = {}
    for variant in variants:
        try:
            results[variant] = _train(variant, rank, world_size, device)
        except Exception:  # noqa: BLE001 - reported by that variant's test
            results[variant] = traceback.format_exc()
    save_result(out_dir, rank, results)


def _results(out_dir, device: str, backend: str) -> dict[str, list]:
    per_rank = run_on_ranks(_train_worker, out_dir, list(VARIANTS), device, backend=backend)
    return {variant: [rank[variant] for rank in per_rank] for variant in VARIANTS}


@pytest.fixture(scope="module")
def cpu_results(tmp_path_factory) -> dict[str, list]:
    return _results(tmp_path_factory.mktemp("training"), "cpu", "gloo")


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory) -> dict[str, list]:
    return _results(tmp_path_factory.mktemp("training"), "cuda", "nccl")


def _check_against_reference(variant: str, results: list, tolerance: dict) -> None:
    for result in results:
        assert isinstance(result, dict), f"{variant} raised on a rank:\n{result}"
    initial, expected = train_reference(VARIANTS[variant][0], STEPS)
    for rank, result in enumerate(results):
        assert result.keys() == expected.keys()
        for name, value in expected.items():
            torch.testing.assert_close(result[name], value, **tolerance,
                                       msg=lambda m: f"rank {rank}, {name}: {m}")
        # Frozen: never stepped, so bitwise the (rank 0) initial value on every rank.
        for name in ("frozen.weight", "frozen.bias"):
            assert torch.equal(result[name], initial[name]), (rank, name)
    assert not torch.equal(initial["fc1.weight"], expected["fc1.weight"])  # training did move


@pytest.mark.pipeline  # starts ranks of a process group: the full test command runs it
@pytest.mark.parametrize("variant", VARIANTS)
def test_data_parallel_training_matches_single_process(variant, cpu_results):
    _check_against_reference(variant, cpu_results[variant], VARIANTS[variant][1])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (nccl)")
@pytest.mark.parametrize("variant", VARIANTS)
def test_data_parallel_training_on_gpus_with_nccl(variant, gpu_results):
    """The same runs on 2 GPUs; the reference stays on the CPU, hence a looser fp32 tolerance."""
    tolerance = VARIANTS[variant][1]
    _check_against_reference(variant, gpu_results[variant],
                             GPU_FP32 if tolerance is FP32 else tolerance)


def test_ranks_really_start_from_different_weights():
    """The premise of the broadcast checks above."""
    assert not torch.equal(build_model(0).fc1.weight, build_model(1).fc1.weight)
    assert not torch.equal(build_model(0).scale, build_model(1).scale)
