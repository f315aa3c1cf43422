"""FSDP as the 2026 handout specifies it, on 2 gloo ranks, with a toy LM that has every kind of
layer the wrapper must tell apart: Embedding, RMSNorm, Linear, ReLU, RMSNorm, a frozen Linear, a
user's own Linear class and an LM head tied to the embedding, from torch's classes, this
project's and the user's.

Exactness. Each rank's gradient is that of its half of the batch (its mean loss); FSDP averages
them. The single-process reference takes the whole batch in one process, as the same two halves:
it adds their gradients and halves the sum, which is the gradient of the whole batch's mean loss,
computed in the ranks' order. So training must match it bit for bit, in fp32 and (with the same
casts) in fp16. (Halving the loss instead would round fp16 gradients that halving makes
subnormal.)

One spawn runs every check, each training run REPEATS times (asynchronous collectives race, if
they can), and saves what it saw; the tests read it.
"""

from __future__ import annotations

import math
import time
import weakref
from functools import partial

import pytest
import torch
from torch import nn

from cs336_systems.distributed import FSDP
from cs336_systems.distributed import fsdp as fsdp_module
from cs336_systems.lm import model as lm
from cs336_systems.lm.adamw import AdamW
from support.distributed import (
    WORLD_SIZE,
    batches,
    local_rows,
    loss_fn,
    run_on_ranks,
    save_result,
)

VOCAB, D_MODEL, D_HIDDEN = 33, 16, 25  # odd row counts: the last rank's shard is padded
STEPS, REPEATS = 3, 3
OPTIMIZERS = {
    "sgd": partial(torch.optim.SGD, lr=0.1, momentum=0.9),
    "adamw": partial(AdamW, lr=1e-2, weight_decay=0.1),  # this project's
    "torch-adamw": partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.1),
}
SHARDED = {"embed.weight": VOCAB, "fc1.weight": D_HIDDEN, "frozen.weight": D_HIDDEN,
           "fc2.weight": D_MODEL}  # name -> rows of the full weight (head.weight is embed's)


class UserLinear(nn.Module):
    """A user's own Linear (no relation to nn.Linear): sharded by its class name."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) / math.sqrt(d_in))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight)


class NormedToy(nn.Module):
    """Embedding, RMSNorm, Linear, ReLU, RMSNorm, frozen Linear, tanh, user's Linear, LM head."""

    def __init__(self):
        super().__init__()
        self.embed = lm.Embedding(VOCAB, D_MODEL)
        self.norm1 = lm.RMSNorm(D_MODEL)
        self.fc1 = nn.Linear(D_MODEL, D_HIDDEN)  # its bias stays whole
        self.norm2 = lm.RMSNorm(D_HIDDEN)
        self.frozen = nn.Linear(D_HIDDEN, D_HIDDEN).requires_grad_(False)
        self.fc2 = UserLinear(D_HIDDEN, D_MODEL)
        self.head = lm.Linear(D_MODEL, VOCAB)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens):  # (batch, seq) -> (batch, seq, vocab)
        x = self.norm2(torch.relu(self.fc1(self.norm1(self.embed(tokens)))))
        return self.head(self.fc2(torch.tanh(self.frozen(x))))


def build_toy(seed: int) -> NormedToy:
    torch.manual_seed(seed)
    model = NormedToy()
    with torch.no_grad():  # RMSNorm's weights start at one: move them, as training would
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def _cast_forward(model: nn.Module, dtype: torch.dtype, tokens):
    """`model` run with every parameter cast to `dtype`, as FSDP's compute_dtype runs it."""
    cast = {name: p.to(dtype) for name, p in model.named_parameters(remove_duplicate=False)}
    return torch.func.functional_call(model, cast, (tokens,), tie_weights=False)


def _reference_step(model, optimizer, tokens, targets, compute_dtype) -> None:
    """One step of single-process training on the whole batch: the gradient of its mean loss
    is the mean of the gradients of the halves the ranks take, summed here in that order."""
    forward = model if compute_dtype is None else partial(_cast_forward, model, compute_dtype)
    optimizer.zero_grad()
    for rank in range(WORLD_SIZE):
        loss_fn(forward, local_rows(tokens, rank, WORLD_SIZE),
                local_rows(targets, rank, WORLD_SIZE)).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(WORLD_SIZE)
    optimizer.step()


def _train(rank: int, world_size: int, optimizer: str, compute_dtype) -> dict:
    """FSDP and the reference side by side: per step, whether every weight is equal and the
    largest difference; at the end, FSDP's full weights and its gradients."""
    reference, model = build_toy(0), FSDP(build_toy(rank), compute_dtype=compute_dtype)
    ref_optimizer = OPTIMIZERS[optimizer](reference.parameters())
    fsdp_optimizer = OPTIMIZERS[optimizer](model.parameters())
    equal, max_diff = [], []
    for tokens, targets in batches(STEPS):
        fsdp_optimizer.zero_grad()
        loss_fn(model, local_rows(tokens, rank, world_size),
                local_rows(targets, rank, world_size)).backward()
        model.finish_gradient_synchronization()
        fsdp_optimizer.step()
        _reference_step(reference, ref_optimizer, tokens, targets, compute_dtype)
        full = model.gather_full_params()
        equal.append(all(torch.equal(full[name], p) for name, p in reference.named_parameters()))
        max_diff.append(max((full[name] - p).abs().max().item()
                            for name, p in reference.named_parameters()))
    grads = {name: (p.shape, p.dtype, None if p.grad is None else p.grad.clone())
             for name, p in model.module.named_parameters()}
    return {"equal": equal, "max_diff": max_diff, "final": full, "grads": grads}


def _alive_once_settled(refs: list, at_most: int = 0) -> int:
    """How many of the weakly referenced buffers are alive, once the backend's worker thread has
    let go of finished collectives (gloo may hold one a moment after its wait() returned, longer
    on a loaded machine): polled for up to a second until at most `at_most` are."""
    deadline = time.monotonic() + 1.0
    while ((alive := sum(ref() is not None for ref in refs)) > at_most
           and time.monotonic() < deadline):
        time.sleep(0.01)
    return alive


def _observe(rank: int, world_size: int) -> dict:
    """Two training steps, the second one recorded: when each weight's all-gather is issued
    (and whether asynchronously), when each sharded layer's forward begins and ends, when
    backward asks for a saved weight; and how many gathered weights are alive."""
    model = FSDP(build_toy(rank))
    inner = model.module
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    name_of = {p.data_ptr(): name for name, p in inner.named_parameters()}
    events, alive, peak = [], [], [0]

    def spy_gather(out, inp, async_op=False):
        events.append(("gather" if async_op else "blocking gather", name_of[inp.data_ptr()]))
        # FSDP holds at most two full weights when it issues a gather, this one the third
        peak[0] = max(peak[0], _alive_once_settled(alive, at_most=2) + 1)
        alive.append(weakref.ref(out))
        return real_gather(out, inp, async_op=async_op)

    def spy_unpack(self, packed):
        if isinstance(packed, fsdp_module._Note):
            events.append(("backward needs", name_of[packed.saved.shard.param.data_ptr()]))
        return real_unpack(self, packed)

    real_gather, real_unpack = fsdp_module._all_gather, FSDP._unpack
    fsdp_module._all_gather, FSDP._unpack = spy_gather, spy_unpack
    for name, module in inner.named_modules():
        if fsdp_module.is_sharded_layer(module):  # after FSDP's pre-hook, before its post-hook
            module.register_forward_pre_hook(lambda *_, name=name: events.append(("begin", name)))
            module.register_forward_hook(lambda *_, name=name: events.append(("end", name)),
                                         prepend=True)
    try:
        for tokens, targets in batches(2):
            events.clear()
            optimizer.zero_grad()
            loss = loss_fn(model, local_rows(tokens, rank, world_size),
                           local_rows(targets, rank, world_size))
            alive_after_forward = _alive_once_settled(alive)
            loss.backward()
            model.finish_gradient_synchronization()
            optimizer.step()
    finally:
        fsdp_module._all_gather, FSDP._unpack = real_gather, real_unpack
    return {"events": list(events), "peak_alive": peak[0],
            "alive_after_forward": alive_after_forward,
            "alive_after_step": _alive_once_settled(alive)}


def _worker(rank: int, world_size: int, out_dir: str) -> None:
    result = {"fp32": {name: [_train(rank, world_size, name, None) for _ in range(REPEATS)]
                       for name in OPTIMIZERS},
              "fp16": {"sgd": [_train(rank, world_size, "sgd", torch.float16)
                               for _ in range(REPEATS)]},
              "observed": [_observe(rank, world_size) for _ in range(REPEATS)]}
    save_result(out_dir, rank, result)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Per rank, what the worker saw."""
    return run_on_ranks(_worker, tmp_path_factory.mktemp("fsdp"))


@pytest.mark.pipeline  # starts ranks of a process group: the full test command runs it
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_fp32_training_matches_single_process_exactly(results, optimizer):
    for rank, result in enumerate(results):
        for run in result["fp32"][optimizer]:
            assert run["equal"] == [True] * STEPS, (rank, run["max_diff"])


@pytest.mark.pipeline  # starts ranks of a process group: the full test command runs it
def test_fp16_compute_matches_single_process_with_the_same_casts_exactly(results):
    """The reference casts every parameter to fp16 where each layer uses it (the tied weight
    once per use) and sums fp32 gradients: FSDP's compute_dtype, bit for bit."""
    for result in results:
        fp32 = result["fp32"]["sgd"][0]["final"]
        for run in result["fp16"]["sgd"]:
            assert run["equal"] == [True] * STEPS, run["max_diff"]
            assert not all(torch.equal(run["final"][name], fp32[name]) for name in fp32)


@pytest.mark.pipeline  # starts ranks of a process group: the full test command runs it
def test_shards_and_gradients_have_their_parameters_shape_and_dtype(results):
    for rank, result in enumerate(results):
        for run in result["fp32"]["sgd"] + result["fp16"]["sgd"]:
            for name, (shape, dtype, grad) in run["grads"].items():
                assert dtype == torch.float32, name  # the fp32 masters, also under fp16
                if name in SHARDED:  # Linear and Embedding weights: half the rows, padded
                    assert shape[0] == math.ceil(SHARDED[name] / WORLD_SIZE), name
                if name.startswith("frozen."):
                    assert grad is None
                else:
                    assert grad.shape == shape and grad.dtype == dtype, name
    assert set(results[0]["fp32"]["sgd"][0]["grads"]) == {  # head.weight is embed.weight
        *SHARDED, "norm1.weight", "fc1.bias", "norm2.weight", "frozen.bias"}


@pytest.mark.pipeline  # starts ranks of a process group: the full test command runs it
def test_replicated_gradients_are_identical_on_every_rank(results):
    for kind in ("fp32", "fp16"):
        for repeat in range(REPEATS):
            for name in ("norm1.weight", "fc1.bias", "norm2.weight"):
                grads = [result[kind]["sgd"][repeat]["grads"][name][2] for result in results]
                assert grads[0].shape == (D_MODEL if name == "norm1.weight" else D_HIDDEN,)
                assert all(torch.equal(grad, grads[0]) for grad in grads), (kind, name)


@pytest.mark.pipeline  # starts ranks of a process group: the full test command runs it
def test_gathers_run_in_a_prefetch_window_and_weights_are_freed(results):
    """Forward: the gather for layer i is issued as layer i - 2's forward ends, so it runs while
    layer i - 1 computes; backward re-gathers in reverse, each weight's gather issued when
    backward starts on the layer after it. All asynchronous; at most three full weights alive,
    none once a forward or a step is over."""
    forward = [
        ("gather", "embed.weight"), ("gather", "fc1.weight"),  # layers 0 and 1 at the start
        ("begin", "embed"), ("end", "embed"), ("gather", "frozen.weight"),
        ("begin", "fc1"), ("end", "fc1"), ("gather", "fc2.weight"),
        ("begin", "frozen"), ("end", "frozen"), ("gather", "embed.weight"),  # the tied head
        ("begin", "fc2"), ("end", "fc2"),
        ("begin", "head"), ("end", "head"),
    ]
    backward = [  # the embedding's backward needs no weight
        ("backward needs", "embed.weight"), ("gather", "embed.weight"),  # the head, on demand
        ("gather", "fc2.weight"),
        ("backward needs", "fc2.weight"), ("gather", "frozen.weight"),
        ("backward needs", "frozen.weight"), ("gather", "fc1.weight"),
        ("backward needs", "fc1.weight"),
    ]
    for result in results:
        for observed in result["observed"]:
            assert observed["events"] == forward + backward
            assert observed["peak_alive"] <= 3
            assert observed["alive_after_forward"] == 0  # autograd holds notes, not weights
            assert observed["alive_after_step"] == 0


def test_sharding_breakdown_shards_linear_and_embedding_weights_only():
    model = lm.build_model("tiny", 16)
    breakdown = fsdp_module.sharding_breakdown(model)
    norms = [p for name, p in model.named_parameters() if "ln" in name]
    assert breakdown["replicated_parameters"] == sum(p.numel() for p in norms) > 0
    assert (breakdown["sharded_parameters"] + breakdown["replicated_parameters"]
            == sum(p.numel() for p in model.parameters()))
    assert breakdown["sharded_bytes"] == 4 * breakdown["sharded_parameters"]  # fp32


# --- fp16 on two GPUs: the ranks' halves exactly, the whole batch within fp16 rounding ---------

FP16_UNIT_ROUNDOFF = 2.0 ** -11  # fp16 keeps 11 significant bits: rounding errs by <= 2^-11


def _fp16_on_gpus(rank: int, world_size: int, out_dir: str) -> None:
    """FSDP with fp16 compute on NCCL, beside two one-process models on this rank's GPU with
    the same casts: one given the batch as the ranks' halves (their gradients summed in fp32),
    one given it whole. Per step: FSDP's largest difference from each, the largest update."""
    device = torch.device("cuda", rank)
    model = FSDP(build_toy(rank).to(device), compute_dtype=torch.float16)
    halves, whole = build_toy(0).to(device), build_toy(0).to(device)
    optimizers = [OPTIMIZERS["sgd"](m.parameters()) for m in (model, halves, whole)]
    steps = []
    for tokens, targets in batches(STEPS):
        tokens, targets = tokens.to(device), targets.to(device)
        before = {name: p.detach().clone() for name, p in halves.named_parameters()}
        optimizers[0].zero_grad()
        loss_fn(model, local_rows(tokens, rank, world_size),
                local_rows(targets, rank, world_size)).backward()
        model.finish_gradient_synchronization()
        optimizers[0].step()
        _reference_step(halves, optimizers[1], tokens, targets, torch.float16)
        optimizers[2].zero_grad()
        loss_fn(partial(_cast_forward, whole, torch.float16), tokens, targets).backward()
        optimizers[2].step()
        full = model.gather_full_params()
        steps.append({
            "halves_equal": all(torch.equal(full[n], p) for n, p in halves.named_parameters()),
            **{f"{kind}_diff": max((full[n] - p).abs().max().item()
                                   for n, p in reference.named_parameters())
               for kind, reference in (("halves", halves), ("whole", whole))},
            "update": max((p - before[n]).abs().max().item()
                          for n, p in halves.named_parameters())})
    save_result(out_dir, rank, steps)


@pytest.mark.skipif(torch.cuda.device_count() < WORLD_SIZE,
                    reason=f"NCCL with {WORLD_SIZE} ranks needs {WORLD_SIZE} GPUs")
def test_fp16_on_gpus_matches_the_ranks_halves_exactly_and_the_whole_batch_within_rounding(
        tmp_path):
    """Data parallelism rounds each rank's fp16 weight gradient (its matmul's output) before the
    ranks' sum; a model given the whole batch rounds the sum once. So FSDP equals, bit for bit,
    only a reference that splits the batch as the ranks do. Against the whole batch, the first
    update differs by a few fp16 roundings of the gradient (it is lr x gradient, and the
    gradients differ by at most about three half-units of their last place); later steps carry
    that difference on, through momentum and the changed weights."""
    for steps in run_on_ranks(_fp16_on_gpus, tmp_path, backend="nccl"):
        assert [s["halves_equal"] for s in steps] == [True] * STEPS, steps
        first = steps[0]
        assert 0 < first["whole_diff"] <= 4 * FP16_UNIT_ROUNDOFF * first["update"], steps
