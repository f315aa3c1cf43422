"""Shared pieces of the distributed tests: a toy model with the awkward cases (a tied weight, a
frozen layer, a buffer), its data, a single-process reference run, and running a worker on
spawned ranks with results written to files."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from cs336_systems.distributed import spawn

VOCAB, D_MODEL, D_HIDDEN = 32, 16, 24
BATCH, SEQ = 8, 6
SEED = 0
WORLD_SIZE = 2
TIMEOUT_S = 60


class ToyModel(nn.Module):
    """Embedding -> Linear -> frozen Linear -> Linear -> LM head tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.fc1 = nn.Linear(D_MODEL, D_HIDDEN)
        self.frozen = nn.Linear(D_HIDDEN, D_HIDDEN).requires_grad_(False)
        self.fc2 = nn.Linear(D_HIDDEN, D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: one Parameter, used twice
        self.register_buffer("scale", 0.5 + torch.rand(D_MODEL))

    def forward(self, tokens):  # (batch, seq) -> (batch, seq, vocab)
        x = self.embed(tokens) * self.scale
        x = torch.relu(self.fc1(x))
        x = torch.tanh(self.frozen(x))
        return self.head(self.fc2(x))


def build_model(seed_offset: int = 0) -> ToyModel:
    """The reference initialisation for offset 0; a different one for any other offset."""
    torch.manual_seed(SEED + seed_offset)
    return ToyModel()


def batches(steps: int):
    """The same `steps` random full batches (tokens, targets), each (BATCH, SEQ), on every rank."""
    generator = torch.Generator().manual_seed(1234)
    for _ in range(steps):
        yield (torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator),
               torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator))


def local_rows(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    rows = tensor.shape[0] // world_size
    return tensor[rank * rows: (rank + 1) * rows]


def loss_fn(model: nn.Module, tokens, targets) -> torch.Tensor:
    """Mean cross-entropy: the mean of equal-sized shards' means is the full batch's mean."""
    logits = model(tokens).float()
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    raise ValueError(name)


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters (tied ones once) and buffers by name, detached copies."""
    return {name: t.detach().clone()
            for name, t in [*model.named_parameters(), *model.named_buffers()]}


def train_reference(optimizer_name: str, steps: int) -> tuple[dict, dict]:
    """Single-process training on the whole batch: (initial state, final state)."""
    model = build_model()
    initial = state_of(model)
    optimizer = make_optimizer(optimizer_name, model.parameters())
    for tokens, targets in batches(steps):
        optimizer.zero_grad()
        loss_fn(model, tokens, targets).backward()
        optimizer.step()
    return initial, state_of(model)


def save_result(out_dir: str, rank: int, result) -> None:
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")


def run_on_ranks(worker, out_dir: Path, *args, backend: str = "gloo") -> list:
    """spawn `worker(rank, world_size, str(out_dir), *args)` on WORLD_SIZE ranks; each rank
    saves one result with `save_result` (CPU tensors); returns them in rank order."""
    spawn(worker, WORLD_SIZE, backend=backend, args=(str(out_dir), *args), timeout_s=TIMEOUT_S)
    return [torch.load(out_dir / f"rank{rank}.pt") for rank in range(WORLD_SIZE)]
