"""gradient_checkpointing (a), measured (assignment §2): the nested checkpoint strategies of
`cs336_systems.analysis.checkpoint_trees` run on real TransformerBlocks, beside the simulator's numbers.

    python -m cs336_systems.sections.checkpointing.nested_checkpointing --size tiny --context-length 64 \
        --batch-size 2 --blocks 1 2 4 8 --device cpu --output r.json

For each N in `--blocks` and each strategy (`checkpointing.STRATEGIES`, and the simulator's
optimum in the units measured here), one forward + backward of N blocks of `--size`'s shape
(parameters frozen out of the gradient, so the peak is activations): the peak bytes above what
was alive before (`memory.peak_window`: the live-tensor stand-in on a CPU, the allocator on a
GPU), the blocks' forward calls (recomputations included), and the simulator's peak and
compute for the same tree with its units measured on one block here (`block_units`).
"""

from __future__ import annotations

import argparse

import torch

from cs336_systems.analysis import checkpoint_trees as ckpt
from cs336_systems.lm.attention import ATTENTION_IMPLEMENTATIONS, get_attention
from cs336_systems.lm.model import MODEL_SIZES, RotaryEmbedding, TransformerBlock
from cs336_systems.pipeline.cli import add_common_arguments, positive_int
from cs336_systems.pipeline.options import check_context_length
from cs336_systems.pipeline.records import run_and_record


def strategies(n: int, units: dict[str, int]) -> dict[str, ckpt.Strategy]:
    """The compared strategies for n blocks: the named ones and the simulator's optimum."""
    named = {name: make(n) for name, (_, make) in ckpt.STRATEGIES.items()}
    return {**named, ckpt.OPTIMAL: ckpt.optimal(n, units["activations"], units["boundary"])[0]}


def measure(config: dict, device: torch.device) -> dict:
    spec = MODEL_SIZES[config["size"]]
    torch.manual_seed(config["seed"])
    rope = RotaryEmbedding(spec.d_model // spec.num_heads, config["context_length"],
                           device=device)
    blocks = [TransformerBlock(spec.d_model, spec.num_heads, spec.d_ff, rope,
                               get_attention(config["attention"]), device=device)
              for _ in range(max(config["blocks"]))]
    shape = (config["batch_size"], config["context_length"], spec.d_model)
    units = ckpt.block_units(blocks, shape, device)
    rows = []
    for n in config["blocks"]:
        for name, strategy in strategies(n, units).items():
            measured = ckpt.measure_strategy(strategy, blocks[:n], shape, device,
                                             seed=config["seed"])
            simulated = ckpt.simulate(strategy, units["activations"], units["boundary"])
            rows.append({"strategy": name, "blocks": n, "tree": ckpt.notation(strategy),
                         "peak_bytes": measured["peak_bytes"],
                         "block_calls": measured["block_calls"],
                         "simulated_peak_bytes": simulated.peak,
                         "simulated_compute": simulated.compute})
    return {"units": units, "rows": rows, "peak_source": measured["peak_source"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", required=True, choices=list(MODEL_SIZES),
                        help="the shape of each block (d_model, heads, d_ff)")
    parser.add_argument("--context-length", type=positive_int, required=True)
    parser.add_argument("--batch-size", type=positive_int, default=2)
    parser.add_argument("--blocks", type=positive_int, nargs="+", required=True,
                        help="chain lengths N to measure")
    parser.add_argument("--attention", default="eager", choices=list(ATTENTION_IMPLEMENTATIONS))
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    check_context_length(parser, args)
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    config["blocks"] = sorted(set(config["blocks"]))
    return run_and_record("checkpointing", config, args.output,
                          lambda device: measure(config, device), args.device)


if __name__ == "__main__":
    main()
