"""One language-model step configuration, as the CLIs that run the model take it: its options
and its construction (the benchmark and the profiler run exactly the same step).

    parser = argparse.ArgumentParser(); add_lm_step_arguments(parser, 5, 10)
    model, phases = build_lm_step(vars(parser.parse_args(argv)), device)
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

import torch
from torch import nn

from cs336_systems.attention import ATTENTION_IMPLEMENTATIONS
from cs336_systems.experiments.cli import non_negative_int, positive_int
from cs336_systems.lm_step import MODES, lm_step_phases, random_batch
from cs336_systems.model import MODEL_SIZES, build_model
from cs336_systems.optimizer import AdamW
from cs336_systems.timing import PRECISIONS, Phase


def add_lm_step_arguments(parser: argparse.ArgumentParser, warmup_steps: int,
                          measure_steps: int, attention: str = "eager") -> None:
    """The options of one configuration: the keys `build_lm_step` reads."""
    parser.add_argument("--size", required=True, choices=list(MODEL_SIZES))
    parser.add_argument("--context-length", type=positive_int, required=True)
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--precision", default="fp32", choices=list(PRECISIONS))
    parser.add_argument("--warmup-steps", type=non_negative_int, default=warmup_steps)
    parser.add_argument("--measure-steps", type=positive_int, default=measure_steps)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--attention", default=attention, choices=list(ATTENTION_IMPLEMENTATIONS))
    parser.add_argument("--checkpoint-block-size", type=positive_int, default=None,
                        help="recompute activations in backward, k blocks per checkpoint "
                             "(default: keep them all)")


def check_context_length(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error for a context longer than the model size supports."""
    longest = MODEL_SIZES[args.size].max_context_length
    if args.context_length > longest:
        parser.error(f"--context-length {args.context_length} is longer than size "
                     f"{args.size!r} supports (at most {longest})")


def build_lm_step(config: Mapping, device: torch.device) -> tuple[nn.Module, list[Phase]]:
    """The model and the phases of one step: keys size, context_length, attention, batch_size,
    mode, precision, seed, and optionally checkpoint_block_size (see `TransformerLM`) and
    compile (`torch.compile` the model; it compiles on the first step)."""
    torch.manual_seed(config["seed"])
    model = build_model(config["size"], config["context_length"],
                        attention=config["attention"],
                        checkpoint_block_size=config.get("checkpoint_block_size"), device=device)
    if config.get("compile"):
        model = torch.compile(model)
    token_ids, targets = random_batch(config["batch_size"], config["context_length"], device,
                                      config["seed"])
    optimizer = AdamW(model.parameters(), lr=1e-4) if config["mode"] == "train-step" else None
    return model, lm_step_phases(model, token_ids, targets, config["mode"],
                                 config["precision"], optimizer)
