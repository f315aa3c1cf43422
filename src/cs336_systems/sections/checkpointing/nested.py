"""The nested checkpoint strategies of `analysis.checkpoint_trees` run on real TransformerBlocks,
beside the simulator's numbers (the CLI: `nested_checkpointing`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from cs336_systems.analysis import checkpoint_trees as ckpt
from cs336_systems.analysis.checkpoint_trees import BLOCK, Strategy, length
from cs336_systems.lm.attention import get_attention
from cs336_systems.lm.model import MODEL_SIZES, RotaryEmbedding, TransformerBlock
from cs336_systems.measure.memory import peak_window


def run_strategy(strategy: Strategy, blocks: Sequence[nn.Module]) -> Callable:
    """x -> the blocks applied in order, each checkpoint of the tree a
    `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` around its parts (nesting by
    wrapping functions)."""
    if length(strategy) != len(blocks):
        raise ValueError(f"strategy of {length(strategy)} blocks for {len(blocks)} modules")
    steps, start = [], 0
    for part in strategy:
        n = length(part)
        if part is BLOCK:
            steps.append(blocks[start])
        else:
            steps.append(functools.partial(checkpoint, run_strategy(part.parts,
                                                                    blocks[start:start + n]),
                                           use_reentrant=False))
        start += n

    def run(x: torch.Tensor) -> torch.Tensor:
        for step in steps:
            x = step(x)
        return x
    return run


def measure_strategy(strategy: Strategy, blocks: Sequence[nn.Module], shape: Sequence[int],
                     device: torch.device, seed: int = 0) -> dict:
    """One forward + backward of `strategy` on `blocks` from a fresh random input of `shape`:
    peak bytes above what was alive before (the input and every activation and gradient made
    inside; the parameters are not counted, and their gradients are not computed, so the peak
    is activation memory, as in the simulator), block forward calls (recomputations included),
    and where the peak was read (`memory.PEAK_SOURCES`)."""
    calls = [0]

    def count(module, args):
        calls[0] += 1
    hooks = [b.register_forward_pre_hook(count) for b in blocks]
    generator = torch.Generator(device=device).manual_seed(seed)
    try:
        with peak_window(device) as reading:
            x = torch.randn(*shape, device=device, generator=generator, requires_grad=True)
            y = run_strategy(strategy, blocks)(x)
            grad = torch.randn(y.shape, device=device, generator=generator)
            torch.autograd.backward(y, grad, inputs=[x])
            del x, y, grad
    finally:
        for h in hooks:
            h.remove()
    return {"peak_bytes": reading.peak_bytes - reading.start_bytes, "block_calls": calls[0],
            "peak_source": reading.source}


def block_units(blocks: Sequence[nn.Module], shape: Sequence[int], device: torch.device
                ) -> dict[str, int]:
    """The simulator's units measured on one real block: boundary = bytes of one block input,
    activations = what a plain block keeps for backward besides its input (bytes alive after
    its forward, less its input and output)."""
    with peak_window(device) as reading:
        x = torch.randn(*shape, device=device, requires_grad=True)
        y = blocks[0](x)
        boundary = x.numel() * x.element_size()
        alive = reading.current_bytes() - reading.start_bytes
        del x, y
    return {"boundary": boundary, "activations": alive - 2 * boundary}


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
    units = block_units(blocks, shape, device)
    rows = []
    for n in config["blocks"]:
        for name, strategy in strategies(n, units).items():
            measured = measure_strategy(strategy, blocks[:n], shape, device,
                                             seed=config["seed"])
            simulated = ckpt.simulate(strategy, units["activations"], units["boundary"])
            rows.append({"strategy": name, "blocks": n, "tree": ckpt.notation(strategy),
                         "peak_bytes": measured["peak_bytes"],
                         "block_calls": measured["block_calls"],
                         "simulated_peak_bytes": simulated.peak,
                         "simulated_compute": simulated.compute})
    return {"units": units, "rows": rows, "peak_source": measured["peak_source"]}
