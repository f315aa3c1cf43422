"""Option sets that several section CLIs share: one LM step's (the keys
`cs336_systems.lm.build.build_lm_step` reads) and one data-parallel training benchmark's (the
DDP and FSDP benchmarks'). Each CLI adds its own options beside them."""

from __future__ import annotations

import argparse

from cs336_systems.distributed.launch import BACKENDS, backend_for
from cs336_systems.lm.attention import ATTENTION_IMPLEMENTATIONS
from cs336_systems.lm.model import MODEL_SIZES, context_length_problem
from cs336_systems.lm.optimizer import FLAT_OPTIMIZERS
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.lm.step import MODES
from cs336_systems.pipeline.cli import (
    non_negative_int,
    parsed_config,
    positive_int,
)


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
    parser.add_argument("--optimizer", default=None, choices=list(FLAT_OPTIMIZERS),
                        help="the train-step's optimizer (default: adamw, written out)")


def check_context_length(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error for a context length the model size does not support."""
    if problem := context_length_problem(args.size, args.context_length):
        parser.error(f"--context-length: {problem}")


def add_training_arguments(parser: argparse.ArgumentParser, *, size: str, context_length: int,
                           batch_size: int, warmup_steps: int, measure_steps: int) -> None:
    """The arguments of a data-parallel training benchmark (this one's and FSDP's), with its
    defaults; `--variant` is each benchmark's own."""
    parser.add_argument("--bucket-size-mb", type=float, default=None,
                        help="bucket size for --variant bucketed")
    parser.add_argument("--size", default=size, choices=list(MODEL_SIZES))
    parser.add_argument("--context-length", type=positive_int, default=context_length)
    parser.add_argument("--batch-size", type=positive_int, default=batch_size,
                        help="global batch size")
    parser.add_argument("--world-size", type=positive_int, default=2)
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="default: nccl for --device cuda, gloo for cpu, auto: what is here")
    parser.add_argument("--warmup-steps", type=non_negative_int, default=warmup_steps)
    parser.add_argument("--measure-steps", type=positive_int, default=measure_steps)
    parser.add_argument("--trace", default=None, help="where to write rank 0's profiler trace")
    parser.add_argument("--optimizer", default="adamw", choices=list(FLAT_OPTIMIZERS),
                        help="the optimizer of every rank")


def training_config(parser: argparse.ArgumentParser, argv: list[str] | None
                    ) -> tuple[dict, str, str]:
    """Parse and check `add_training_arguments`' options: (config, output, device)."""
    args = parser.parse_args(argv)
    check_context_length(parser, args)
    if args.batch_size % args.world_size:
        parser.error(f"--batch-size {args.batch_size} does not split evenly over "
                     f"--world-size {args.world_size}")
    if (args.variant == "bucketed") != (args.bucket_size_mb is not None):
        parser.error("--bucket-size-mb goes with --variant bucketed, and only with it")
    if args.bucket_size_mb is not None and args.bucket_size_mb <= 0:
        parser.error(f"--bucket-size-mb must be positive, got {args.bucket_size_mb}")
    config = parsed_config(args)
    config["backend"] = args.backend or backend_for(args.device)
    return config, args.output, args.device
