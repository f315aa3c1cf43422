"""The optimizers a training job can take, by name (`OPTIMIZERS`), all AdamW with the same
hyperparameters: ours written out (`lm/adamw.py`, the readable definition), the same update
fused into one Triton pass (`lm/fused_adamw.py` over `kernels/adamw.py`), that one stepping
each layer in backward with its moments on the host (`lm/offloaded_adamw.py`), and torch's
fused AdamW.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from cs336_systems.lm.adamw import AdamW


@dataclass(frozen=True)
class OptimizerChoice:
    """One optimizer of the registry: how to build it, its label in tables, and the kernel
    module it imports lazily (which a rule running it lists as a source)."""

    cls: Callable[[], Callable[..., torch.optim.Optimizer]]
    label: str
    modules: tuple[str, ...] = ()
    # steps each layer in backward: built over one param group per layer (`layer_groups`)
    per_layer: bool = False


def _fused_adamw() -> Callable[..., torch.optim.Optimizer]:
    from cs336_systems.lm.fused_adamw import FusedAdamW  # Triton only when used
    return FusedAdamW


def _offloaded_adamw() -> Callable[..., torch.optim.Optimizer]:
    from cs336_systems.lm.offloaded_adamw import OffloadedAdamW
    return OffloadedAdamW


# The optimizers, all AdamW with the same hyperparameters: ours written out, ours fused in
# Triton, the fused one stepping each layer in backward with its moments in host memory between
# steps (the leaderboard's), and torch's fused CUDA kernel. A training job takes one of
# `FLAT_OPTIMIZERS`.
OPTIMIZERS: dict[str, OptimizerChoice] = {
    "adamw": OptimizerChoice(lambda: AdamW, "AdamW (foreach)"),
    "adamw-fused": OptimizerChoice(_fused_adamw, "AdamW (fused Triton)",
                                   ("cs336_systems.kernels.adamw", "cs336_systems.lm.fused_adamw")),
    "adamw-offloaded": OptimizerChoice(
        _offloaded_adamw, "AdamW (fused Triton, in backward, moments on the host)",
        ("cs336_systems.kernels.adamw", "cs336_systems.lm.fused_adamw",
         "cs336_systems.lm.offloaded_adamw"), per_layer=True),
    "torch-adamw-fused": OptimizerChoice(lambda: partial(torch.optim.AdamW, fused=True),
                                         "torch AdamW (fused)"),
}


# The optimizers that take any list of parameters: every training job's choice (config key
# `optimizer`). A per-layer one needs the model's layers, and its gradients whole in backward
# (not DDP's, which are averaged after it), so only the leaderboard's job builds it.
FLAT_OPTIMIZERS: tuple[str, ...] = tuple(n for n, c in OPTIMIZERS.items() if not c.per_layer)


def _choice(name: str) -> OptimizerChoice:
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def optimizer_class(name: str) -> Callable[..., torch.optim.Optimizer]:
    """What builds optimizer `name`: call it as `(params, lr=..., weight_decay=...)`."""
    return _choice(name).cls()


def build_optimizer(name: str, params: Iterable, lr: float = 1e-4, **hyperparameters
                    ) -> torch.optim.Optimizer:
    return optimizer_class(name)(params, lr=lr, **hyperparameters)


def layer_groups(root: torch.nn.Module, layers: Sequence[torch.nn.Module]) -> list[dict]:
    """`root`'s parameters as param groups for a `per_layer` optimizer: each of `layers`'
    (given in forward order) a group marked "offload", the last layer's first (the order
    backward completes them), then one group of the rest (embeddings, final norm, head)."""
    groups = [{"params": list(layer.parameters()), "offload": True}
              for layer in reversed(layers)]
    in_layers = {p for group in groups for p in group["params"]}
    rest = [p for p in root.parameters() if p not in in_layers]
    return groups + ([{"params": rest}] if rest else [])


def is_per_layer(name: str) -> bool:
    return _choice(name).per_layer


def runs_triton(name: str) -> bool:
    """Whether optimizer `name` runs a Triton kernel (on a CPU: Triton's interpreter)."""
    return "cs336_systems.kernels.adamw" in _choice(name).modules


def optimizer_label(name: str) -> str:
    return OPTIMIZERS[name].label if name in OPTIMIZERS else name


def optimizer_modules(name: str) -> list[str]:
    """Package modules a job running `name` imports lazily, for its rule's source inputs."""
    return list(_choice(name).modules)
