"""The phases of one language-model benchmark step, for the timing harness.

    phases = lm_step_phases(model, token_ids, targets, "train-step", "bf16", optimizer)
    times = time_phases(phases, device, warmup_steps, measure_steps)

Each part of a step runs inside a profiler range named in `STEP_RANGES` (`record_function`:
free unless a profiler is recording; NVTX ranges under `torch.autograd.profiler.emit_nvtx`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.profiler import record_function

from cs336_systems.lm.loss import cross_entropy
from cs336_systems.lm.model import VOCAB_SIZE
from cs336_systems.lm.precision import autocast_context
from cs336_systems.measure.timing import Phase

MODES = ("forward", "forward-backward", "train-step")
# The profiler ranges of a step, in the order they run (nsys_profile).
STEP_RANGES = ("forward", "loss", "backward", "optimizer")


def random_batch(batch_size: int, context_length: int, device: torch.device, seed: int,
                 rank: int = 0, world_size: int = 1, vocab_size: int = VOCAB_SIZE
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and targets below `vocab_size`; with world_size > 1, this rank's share
    of the batch."""
    if batch_size % world_size:
        raise ValueError(f"batch size {batch_size} does not split over {world_size} ranks")
    generator = torch.Generator(device=device).manual_seed(seed + rank)
    shape = (batch_size // world_size, context_length)
    token_ids = torch.randint(0, vocab_size, shape, device=device, generator=generator)
    targets = torch.randint(0, vocab_size, shape, device=device, generator=generator)
    return token_ids, targets


def lm_step_phases(model: nn.Module, token_ids: torch.Tensor, targets: torch.Tensor,
                   mode: str, precision: str,
                   optimizer: torch.optim.Optimizer | None = None,
                   loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
                   ) -> list[Phase]:
    """The phases of one LM benchmark step in `mode`.

    forward:          forward pass only, under `torch.no_grad()` (inference)
    forward-backward: forward + loss, then backward
    train-step:       forward + loss, backward, optimizer step (needs `optimizer`)

    `loss_of(token_ids, targets)`, where given, computes the loss in place of the model's
    logits and `cross_entropy` (a `lm.levers.LanguageModelLoss`), in the forward's range.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    device = token_ids.device
    state: dict[str, torch.Tensor] = {}

    if mode == "forward":
        def forward():
            with torch.no_grad(), autocast_context(device, precision), record_function("forward"):
                model(token_ids)
        return [("forward", forward)]

    def forward_loss():
        # a new iteration: outputs of the last one may be overwritten (where a compiled model
        # replays CUDA graphs; a counter otherwise)
        torch.compiler.cudagraph_mark_step_begin()
        with autocast_context(device, precision):
            if loss_of is not None:
                with record_function("forward"):
                    state["loss"] = loss_of(token_ids, targets)
                return
            with record_function("forward"):
                logits = model(token_ids)
            with record_function("loss"):
                state["loss"] = cross_entropy(logits, targets)

    def backward():
        with record_function("backward"):
            state.pop("loss").backward()

    if mode == "forward-backward":
        def backward_and_clear():
            backward()
            model.zero_grad(set_to_none=True)
        return [("forward", forward_loss), ("backward", backward_and_clear)]

    if optimizer is None:
        raise ValueError("mode 'train-step' needs an optimizer")

    def optimizer_step():
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return [("forward", forward_loss), ("backward", backward), ("optimizer", optimizer_step)]
