"""The nested checkpoint strategies of `analysis.checkpoint_trees` run on real TransformerBlocks,
beside the simulator's numbers (the CLI: `nested_checkpointing`)."""

from __future__ import annotations

import torch

from cs336_systems.analysis import checkpoint_trees as ckpt
from cs336_systems.lm.attention import get_attention
from cs336_systems.lm.model import MODEL_SIZES, RotaryEmbedding, TransformerBlock


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
