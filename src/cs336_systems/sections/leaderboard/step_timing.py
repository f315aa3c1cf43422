"""One leaderboard training step of a variant of `runs.VARIANTS`: built, checked against the
model as written, timed, sampled and optionally profiled (the CLI: `time_leaderboard`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist

from cs336_systems.distributed.fully_shard import fully_shard_layers
from cs336_systems.lm.attention import package_unavailable_reason
from cs336_systems.lm.build import cpu_unavailable_reason
from cs336_systems.lm.levers import LanguageModelLoss, apply_layer_levers, plain
from cs336_systems.lm.loss import head_loss_unavailable_reason
from cs336_systems.lm.model import TransformerLM, train_step_flops
from cs336_systems.lm.optimizer import build_optimizer, is_per_layer, layer_groups
from cs336_systems.lm.precision import PRECISIONS, autocast_context
from cs336_systems.lm.sizes import LEADERBOARD_SHAPES, ModelSize
from cs336_systems.lm.step import lm_step_phases, random_batch
from cs336_systems.measure.ceilings import matmul_tflops
from cs336_systems.measure.gpu_state import GpuSampler
from cs336_systems.measure.memory import alloc_retries, peak_gib, reset_peak
from cs336_systems.measure.profiling import capture, time_by_class, trace_events
from cs336_systems.measure.timing import synchronize, time_phases
from cs336_systems.pipeline.records import Skip
from cs336_systems.sections.leaderboard.runs import PLAIN, VARIANTS, LeaderboardVariant

STARTED = time.time()  # the from-empty-caches clock starts when the job imports this


def shape_of(config: dict) -> ModelSize:
    spec = LEADERBOARD_SHAPES[config["shape"]]
    if config["context_length"] > spec.max_context_length:
        raise ValueError(f"context length {config['context_length']} exceeds shape "
                         f"{config['shape']!r}'s {spec.max_context_length}")
    return spec


def build(run: LeaderboardVariant, config: dict, device: torch.device, world_size: int):
    """The model with the run's levers, its loss module (sharded when world_size > 1)."""
    spec = shape_of(config)
    torch.manual_seed(config["seed"])
    if run.model == "hf-llama":
        from cs336_systems.lm.hf_llama import HFLanguageModelLoss, llama_of, stock_layer_levers
        lm_loss = HFLanguageModelLoss(llama_of(spec, config["context_length"], config["layers"],
                                               device=device))
        stock_layer_levers(lm_loss, recompute=run.recompute == "all", compile=run.compile)
        model, layers = lm_loss.model, lm_loss.layers
    else:
        model = TransformerLM(spec.vocab_size, config["context_length"], spec.d_model,
                              config["layers"] or spec.num_layers, spec.num_heads, spec.d_ff,
                              attention=run.attention, device=device)
        apply_layer_levers(model, run.recompute, run.compile, run.selective_share, run.others)
        lm_loss = LanguageModelLoss(model, chunked=run.chunked_loss, head_loss=run.head_loss)
        layers = model.layers
    if world_size > 1:
        dtype = PRECISIONS[config["precision"]]
        fully_shard_layers(lm_loss, layers, device, None if dtype == torch.float32 else dtype)
    return model, lm_loss


def levers_off(run: LeaderboardVariant, model, lm_loss):
    """A context in which `lm_loss` runs as the model is written: every lever off."""
    if run.model == "hf-llama":
        from cs336_systems.lm.hf_llama import hf_plain
        return hf_plain(lm_loss)
    return plain(model, lm_loss)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def check_io(run: LeaderboardVariant, model, lm_loss, config: dict, device: torch.device,
             rank: int, world_size: int) -> dict:
    """Loss and gradients of the run's levers against the model as written, both eager, on one
    batch of `check_tokens`-token sequences; each rank compares its own shards."""
    ids, targets = random_batch(world_size, config["check_tokens"], device, config["seed"] + 1,
                                rank, world_size, shape_of(config).vocab_size)

    def loss_and_grads():
        with autocast_context(device, config["precision"]):
            loss = lm_loss(ids, targets)
        loss.backward()
        grads = {n: _local(p.grad).float().clone() for n, p in lm_loss.named_parameters()}
        lm_loss.zero_grad(set_to_none=True)
        return loss.detach().float(), grads

    with levers_off(run, model, lm_loss):
        reference_loss, reference = loss_and_grads()
    with torch.compiler.set_stance("force_eager"):
        loss, grads = loss_and_grads()
    worst, worst_name = 0.0, None
    for name, ref in reference.items():
        error = float((grads.pop(name) - ref).norm() / ref.norm().clamp_min(1e-30))
        if error > worst:
            worst, worst_name = error, name
    del reference
    losses = torch.stack([loss, reference_loss])
    if world_size > 1:  # the batch's mean loss, and the worst gradient of any rank
        dist.all_reduce(losses)
        losses /= world_size
        everyone = [None] * world_size
        dist.all_gather_object(everyone, (worst, worst_name))
        worst, worst_name = max(everyone, key=lambda pair: pair[0])
    return {"check_tokens": config["check_tokens"], "check_loss": float(losses[0]),
            "check_loss_reference": float(losses[1]),
            "check_loss_abs_diff": float((losses[0] - losses[1]).abs()),
            "check_grad_max_rel_diff": worst, "check_grad_worst": worst_name}


def build_step_optimizer(name: str, model: TransformerLM, lm_loss: LanguageModelLoss
                         ) -> torch.optim.Optimizer:
    """The variant's optimizer over every parameter; one that steps each layer in backward
    gets a group per layer, and fetches their moments from the final norm's forward on (late in
    the forward, so that the first layers' moments are on the GPU when backward reaches them)."""
    if not is_per_layer(name):
        return build_optimizer(name, lm_loss.parameters())
    optimizer = build_optimizer(name, layer_groups(lm_loss, model.layers))
    model.ln_final.register_forward_pre_hook(lambda *_: optimizer.prefetch())
    return optimizer


def profile_step(phases, device: torch.device) -> dict:
    """One more step under torch.profiler: its device time by class of kernel, in ms, as
    `kernel_ms_<class>` (and `kernel_ms_busy`, `_span`, `_idle`; none on a CPU)."""
    with capture(device) as prof:
        for _, fn in phases:
            fn()
        synchronize(device)
    return {f"kernel_ms_{label}": ms
            for label, ms in time_by_class(trace_events(prof)).items()}


def skip_reason(run: LeaderboardVariant, config: dict) -> str | None:
    """Why this machine cannot run the variant (gloo: the CPU), or None if it can."""
    if run.model == "hf-llama":
        from cs336_systems.lm.hf_llama import unavailable_reason
        if reason := unavailable_reason():
            return reason
    device = torch.device("cpu" if config["backend"] == "gloo" else "cuda")
    if run.head_loss and (reason := head_loss_unavailable_reason(run.head_loss, device)):
        return reason  # a peer's loss first: the reason names its package
    if config["backend"] == "gloo":
        return cpu_unavailable_reason(run.attention, run.optimizer, run.compile,
                                      config["precision"])
    spec = shape_of(config)  # an optional package's attention, on a GPU it supports
    return package_unavailable_reason(run.attention, spec.d_model // spec.num_heads,
                                      PRECISIONS[config["precision"]], device)


def work(config: dict, rank: int, world_size: int, device: torch.device) -> dict:
    run = VARIANTS[config["variant"]]
    if device.type == "cuda" and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        # the compiled stock run needs it (else it runs out of memory); a user's setting wins
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    ceiling = matmul_tflops(device) if device.type == "cuda" else None
    model, lm_loss = build(run, config, device, world_size)
    # the model as written has no lever to check against itself
    metrics = check_io(run, model, lm_loss, config, device, rank, world_size) \
        if config["check_tokens"] and run != PLAIN else {}
    spec = shape_of(config)
    ids, targets = random_batch(world_size, config["context_length"], device, config["seed"],
                                rank, world_size, spec.vocab_size)
    optimizer = build_step_optimizer(run.optimizer, model, lm_loss)
    phases = lm_step_phases(lm_loss, ids, targets, "train-step", config["precision"],
                            optimizer, loss_of=lm_loss)
    reset_peak(device)
    sampler = GpuSampler(device)  # the GPU's clock over the timed steps, not the compilation
    steps = iter(range(1, config["warmup_steps"] + config["measure_steps"] + 1))
    retries_before = [alloc_retries(device)]  # the allocator's retries before the timed steps

    def after_step():
        if next(steps) == config["warmup_steps"]:
            sampler.start()
            retries_before[0] = alloc_retries(device)

    try:
        if config["warmup_steps"] == 0:
            sampler.start()
        times = time_phases(phases, device, config["warmup_steps"], config["measure_steps"],
                            after_step=after_step)
    finally:
        sampler.stop()
    metrics.update({k: v for k, v in times.metrics().items() if "warmup" not in k})
    metrics.update(sampler.metrics())
    if device.type == "cuda" and sampler.reason:
        metrics["gpu_state_missing"] = sampler.reason
    metrics["warmup_step_ms"] = times.warmup_ms.get("step", [])
    if device.type == "cuda":  # a retry frees the allocator's cache: the GPU waits meanwhile
        metrics["alloc_retries"] = alloc_retries(device) - retries_before[0]
    peak = peak_gib(device)
    if config["profile"]:
        metrics.update(profile_step(phases, device))
    peaks = [peak]
    if world_size > 1:
        peaks = [None] * world_size
        dist.all_gather_object(peaks, peak)
    layers = config["layers"] or spec.num_layers
    metrics.update(
        peak_gib=peak, peak_gib_per_rank=peaks, matmul_tflops=ceiling, layers=layers,
        model_flops=train_step_flops(spec, world_size, config["context_length"], layers),
        parameters=sum(p.numel() for p in lm_loss.parameters()),  # a DTensor counts whole
        wall_s=time.time() - STARTED)
    return metrics


def measure(config: dict, device: torch.device) -> dict:
    """The step in this one process (world size 1), or `Skip` where this machine cannot run
    the variant (at any world size)."""
    if reason := skip_reason(VARIANTS[config["variant"]], config):
        raise Skip(reason)
    return work(config, 0, 1, device)


@contextlib.contextmanager
def empty_caches(empty: bool = True):
    """Inside the block, torch.compile's and Triton's on-disk caches are a new empty folder
    (inherited by torchrun's workers), removed after it; with `empty` False, nothing changes."""
    if not empty:
        yield
        return
    folder = tempfile.mkdtemp(prefix="cs336-leaderboard-caches-")
    names = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
    before = {name: os.environ.get(name) for name in names}
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(folder, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "triton")
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(folder, ignore_errors=True)
