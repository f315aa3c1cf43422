"""benchmarking_script (assignment §1.1): time one model configuration.

    python -m cs336_systems.experiments.benchmark --size small --context-length 128 \
        --mode train-step --precision bf16 --warmup-steps 5 --measure-steps 10 --output r.json

With --compile the model is `torch.compile`d (torch_compile (b), assignment 3.2): the first
warm-up step then includes the compilation.
"""

from __future__ import annotations

import argparse

import torch

from cs336_systems.attention import ATTENTION_IMPLEMENTATIONS
from cs336_systems.experiments.cli import add_common_arguments, non_negative_int, positive_int
from cs336_systems.lm_step import MODES, lm_step_phases, random_batch
from cs336_systems.memory import peak_gib, reset_peak
from cs336_systems.model import MODEL_SIZES, build_model, count_parameters, forward_flops
from cs336_systems.optimizer import AdamW
from cs336_systems.records import run_and_record
from cs336_systems.timing import PRECISIONS, time_phases


def measure(config: dict, device: torch.device) -> dict:
    torch.manual_seed(config["seed"])
    model = build_model(config["size"], config["context_length"],
                        attention=config["attention"], device=device)
    if config["compile"]:  # compiled on the first (warm-up) step: step_warmup_ms_samples[0]
        model = torch.compile(model)
    token_ids, targets = random_batch(config["batch_size"], config["context_length"], device,
                                      config["seed"])
    shape = token_ids.shape
    optimizer = AdamW(model.parameters(), lr=1e-4) if config["mode"] == "train-step" else None
    phases = lm_step_phases(model, token_ids, targets, config["mode"], config["precision"],
                            optimizer)
    reset_peak(device)
    times = time_phases(phases, device, config["warmup_steps"], config["measure_steps"])
    flops = forward_flops(config["size"], *shape) * (1 if config["mode"] == "forward" else 3)
    metrics = {"parameters": count_parameters(model), "model_flops_per_step": flops,
               **times.metrics(), "peak_gib": peak_gib(device)}
    return metrics


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", required=True, choices=list(MODEL_SIZES))
    parser.add_argument("--context-length", type=positive_int, required=True)
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--precision", default="fp32", choices=list(PRECISIONS))
    parser.add_argument("--warmup-steps", type=non_negative_int, default=5)
    parser.add_argument("--measure-steps", type=positive_int, default=10)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--attention", default="eager", choices=list(ATTENTION_IMPLEMENTATIONS))
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                        help="torch.compile the whole model (torch_compile, assignment 3.2)")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    max_context = MODEL_SIZES[args.size].max_context_length
    if args.context_length > max_context:
        parser.error(f"--context-length {args.context_length} is longer than size "
                     f"{args.size!r} supports (at most {max_context})")
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    return run_and_record("benchmark", config, args.output,
                          lambda device: measure(config, device), args.device)


if __name__ == "__main__":
    main()
