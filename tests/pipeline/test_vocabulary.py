"""Each term is defined once in the library; the config schema, the rules and the CLIs follow it."""

import argparse

import pytest

from cs336_systems.distributed.launch import BACKENDS
from cs336_systems.distributed.variants import DDP_VARIANTS, FSDP_VARIANTS
from cs336_systems.lm.attention import (
    ATTENTION_IMPLEMENTATIONS,
    attention_label,
    get_attention,
)
from cs336_systems.lm.loss import HEAD_LOSSES
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.optimizer import FLAT_OPTIMIZERS
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.lm.sizes import LEADERBOARD_SHAPES
from cs336_systems.lm.step import MODES
from cs336_systems.sections.benchmark import time_step as benchmark
from cs336_systems.sections.checkpointing import (
    nested_checkpointing as checkpointing_nested,
)
from cs336_systems.sections.checkpointing import time_checkpointing as checkpointing
from cs336_systems.sections.distributed import time_allreduce as allreduce
from cs336_systems.sections.distributed import time_ddp as ddp
from cs336_systems.sections.flash import time_flash as flash
from cs336_systems.sections.leaderboard.runs import VARIANTS as LEADERBOARD_VARIANTS
from cs336_systems.sections.memory import record_memory as memory
from cs336_systems.sections.mixed_precision import run_study as mixed_precision
from cs336_systems.sections.profile import profile_step as profile
from cs336_systems.sections.residuals import count_saved as residuals
from cs336_systems.sections.residuals import saved
from cs336_systems.sections.training.runs import RUNS
from support.checkout import project_yaml

SCHEMA = project_yaml("workflow/schemas/config.schema.yaml")


@pytest.mark.parametrize("definition, names", [
    ("size", list(MODEL_SIZES)),
    ("mode", list(MODES)),
    ("precision", list(PRECISIONS)),
    ("attention", list(ATTENTION_IMPLEMENTATIONS)),
    ("ddp_variant", list(DDP_VARIANTS)),
    ("fsdp_variant", list(FSDP_VARIANTS)),
    ("backend", list(BACKENDS)),
    ("residuals_variant", list(saved.VARIANTS)),
    ("optimizer", list(FLAT_OPTIMIZERS)),
    ("training_run", list(RUNS)),
    ("leaderboard_variant", list(LEADERBOARD_VARIANTS)),
    ("leaderboard_shape", list(LEADERBOARD_SHAPES)),
    ("head_loss", list(HEAD_LOSSES)),
])
def test_schema_enums_are_the_library_names(definition, names):
    assert SCHEMA["$defs"][definition]["enum"] == names


def test_checkpointing_modes_are_the_library_modes_with_a_backward():
    # forward alone has nothing to recompute: the schema and the CLI refuse it
    assert SCHEMA["$defs"]["checkpointing"]["properties"]["mode"]["enum"] == [
        m for m in MODES if m != "forward"]


def _choices(module, dest: str) -> list[str]:
    """The choices of a CLI option, read from the parser `main` builds."""
    captured = {}
    original = argparse.ArgumentParser.parse_args

    def capture(self, *args, **kwargs):
        captured.update({a.dest: a.choices for a in self._actions})
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = capture
    try:
        with pytest.raises(SystemExit):
            module.main([])
    finally:
        argparse.ArgumentParser.parse_args = original
    return list(captured[dest])


@pytest.mark.parametrize("module, dest, names", [
    (benchmark, "size", list(MODEL_SIZES)),
    (benchmark, "mode", list(MODES)),
    (benchmark, "precision", list(PRECISIONS)),
    (benchmark, "attention", list(ATTENTION_IMPLEMENTATIONS)),
    (benchmark, "optimizer", list(FLAT_OPTIMIZERS)),
    (ddp, "optimizer", list(FLAT_OPTIMIZERS)),
    (profile, "size", list(MODEL_SIZES)),
    (profile, "mode", list(MODES)),
    (profile, "precision", list(PRECISIONS)),
    (profile, "attention", list(ATTENTION_IMPLEMENTATIONS)),
    (mixed_precision, "precision", list(PRECISIONS)),
    (flash, "attention", list(ATTENTION_IMPLEMENTATIONS)),
    (flash, "precision", list(PRECISIONS)),
    (ddp, "variant", list(DDP_VARIANTS)),
    (ddp, "backend", list(BACKENDS)),
    (allreduce, "backend", list(BACKENDS)),
    (memory, "size", list(MODEL_SIZES)),
    (memory, "mode", list(MODES)),
    (memory, "precision", list(PRECISIONS)),
    (memory, "attention", list(ATTENTION_IMPLEMENTATIONS)),
    (residuals, "size", list(MODEL_SIZES)),
    (residuals, "precision", list(PRECISIONS)),
    (residuals, "variant", list(saved.VARIANTS)),
    (checkpointing, "size", list(MODEL_SIZES)),
    (checkpointing, "mode", list(MODES)),
    (checkpointing, "precision", list(PRECISIONS)),
    (checkpointing, "attention", list(ATTENTION_IMPLEMENTATIONS)),
    (checkpointing_nested, "size", list(MODEL_SIZES)),
    (checkpointing_nested, "attention", list(ATTENTION_IMPLEMENTATIONS)),
])
def test_cli_choices_are_the_library_names(module, dest, names):
    assert _choices(module, dest) == names


def test_every_attention_implementation_has_a_label_and_a_callable():
    for name, entry in ATTENTION_IMPLEMENTATIONS.items():
        assert callable(get_attention(name)) and attention_label(name) == entry.label
    with pytest.raises(ValueError, match="unknown attention 'flash'; allowed: eager, annotated, sdpa"):
        get_attention("flash")
