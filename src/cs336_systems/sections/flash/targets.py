"""The speed targets of our Triton FlashAttention-2, each defined once: what it measures, at
which shapes, against what, and the bound it must meet.

A target is measured by one job of its *group* (`GROUPS`): the group's job times our kernels
and every reference its targets name in the same process, at the group's shapes. The shapes
come from the config's `flash` block (the leaderboard case, the sweep's sequence lengths and
head dimensions), filtered by what the target asks (sequences from 4096, say); the bounds and
those filters are the targets' own and live here. The job (`sections/flash/time_targets.py`)
measures, the report (`sections/flash/speed_table.py`) compares; both read this table.

A target compares either a ratio, our time over a reference's measured beside it, or our
value itself (a time, a sequence length, seconds of compilation) with its bound. The
leaderboard's targets time ours and its references under torch.compile, as the leaderboard
does; the others time the implementations as they are, beside plain PyTorch both as it is and
compiled.
"""

from __future__ import annotations

import argparse
import operator
from collections.abc import Callable
from dataclasses import dataclass

from cs336_systems.lm.attention import attention_label, attention_modules
from cs336_systems.lm.sizes import MODEL_SIZES
from cs336_systems.pipeline.cli import positive_int

OURS = "flash-triton"
# our FlashAttention for Hopper in Gluon (kernels/flash_gluon/), held against cuDNN's
GLUON = "flash-gluon"
# FlashAttention-4 (optional package flash-attn-4): the stock kernels beside cuDNN's on Hopper;
# a machine without it records the targets against it as skipped
PEER = "fa4"
Shape = tuple[int, int, int]  # batch, sequence length, head dimension
# the cold_compile group's child process: one compiled forward+backward from empty caches
COLD_COMPILE_CLI = "cs336_systems.sections.flash.cold_compile"
# The precision of the targets on the sweep's shapes ("bf16, seq >= 4096, every d in the sweep").
SWEEP_DTYPE = "bf16"
# Forward alone is timed at the leaderboard's batch and length with these head dimensions; the
# Gluon forward's own target takes the larger one alone.
FORWARD_D_HEADS = (64, 128)
# Sweep lengths from which our kernels are held against SDPA's flash backend, and against
# plain PyTorch attention.
SDPA_FLASH_FROM_SEQ = 4096
PYTORCH_FROM_SEQ = 1024
# Our forward+backward must run (no out-of-memory) up to this length.
LONGEST_SEQ = 65536
# Long sequences, where the GPU is busy: the leaderboard's batch at 16384 (d 64 and 128) and at
# 4096, and one sequence of 65536, held against SDPA's cuDNN backend.
LONG_SHAPES = ((16, 16384, 64), (16, 16384, 128), (16, 4096, 64), (1, 65536, 64))
# The attention our models run: (batch x heads, context, d_head) of a model size at a batch and
# context, and the 2026 leaderboard model's heads (32 of d 128) on one 2048-token sequence.
MODEL_CASES = (("small", 4, 512), ("2.7b", 4, 512), ("2.7b", 1, 2048))
LEADERBOARD_8B_HEADS = (32, 2048, 128)
# Batch 1 at 4096: too few query tiles to fill the GPU unless the tiles shrink.
BATCH_ONE_SHAPES = ((1, 4096, 64), (1, 4096, 128))
# fp32 forward at the default precision against full-fp32 ("ieee") dots.
FP32_SHAPE = (16, 4096, 64)
# The best 2025 class leaderboard entry (ms, on an H100): quoted, never measured here.
CLASS_BEST_MS = 5.364

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge}
SYMBOLS = {"<=": "≤", "<": "<", ">=": "≥"}


@dataclass(frozen=True)
class AttentionRun:
    """An attention implementation of the registry, run as it is or under torch.compile."""

    name: str
    compiled: bool = False

    @property
    def key(self) -> str:
        return f"{self.name}+compile" if self.compiled else self.name

    @property
    def label(self) -> str:
        return f"{attention_label(self.name)}{', compiled' if self.compiled else ''}"


@dataclass(frozen=True)
class Case:
    """What a group's job measures: (batch, seq, d) shapes of q, k and v, a precision, causal or
    not."""

    shapes: tuple[tuple[int, int, int], ...]
    precision: str
    causal: bool


@dataclass(frozen=True)
class Group:
    """One job: `kind` says how it measures (`versus`: our time and the references' at each
    shape, `longest`: the longest sequence our forward+backward runs, `cold_compile`: seconds to
    the first compiled forward+backward from empty caches); `metric` is what it records."""

    name: str
    kind: str
    metric: str
    case: Callable[[dict], Case]


@dataclass(frozen=True)
class Target:
    """`value` (ours, or ours / reference's where there is a reference) `op` `bound`."""

    key: str
    title: str
    group: str
    ours: AttentionRun
    op: str
    bound: float
    reference: AttentionRun | None = None
    stretch: bool = False
    # A fixed bound quoted for one GPU (a name `env.gpu` contains): a value measured on another
    # GPU is shown but not judged against it.
    bound_gpu: str | None = None

    @property
    def name(self) -> str:
        """The title as tables show it, a stretch target marked."""
        return f"{self.title} (stretch)" if self.stretch else self.title

    def meets(self, value: float) -> bool:
        return OPERATORS[self.op](value, self.bound)

    @property
    def unit(self) -> str:
        return "x" if self.reference else UNITS[GROUPS[self.group].metric]

    def describe(self) -> str:
        """The target as a table shows it: '≤ 0.75x SDPA flash, compiled', '< 5.364 ms'."""
        against = f" {self.reference.label}" if self.reference else ""
        return f"{SYMBOLS[self.op]} {self.bound:g}{UNITS_SHOWN[self.unit]}{against}"

    def off_by(self, value: float) -> float:
        """How far `value` is from the bound, as a factor of at least 1 when the target is
        missed: value / bound for an upper bound, bound / value for a lower one."""
        return self.bound / value if self.op == ">=" else value / self.bound


def _leaderboard(flash: dict) -> Case:
    lb = flash["leaderboard"]
    return Case(((lb["batch_size"], lb["seq"], lb["d"]),), lb["precision"], causal=True)


def _forward(flash: dict) -> Case:
    lb = flash["leaderboard"]
    return Case(tuple((lb["batch_size"], lb["seq"], d) for d in FORWARD_D_HEADS), lb["precision"],
                causal=True)


def _gluon_forward(flash: dict) -> Case:
    lb = flash["leaderboard"]
    return Case(((lb["batch_size"], lb["seq"], max(FORWARD_D_HEADS)),), lb["precision"],
                causal=True)


def _sweep_from(min_seq: int) -> Callable[[dict], Case]:
    def case(flash: dict) -> Case:
        return Case(tuple((flash["batch_size"], seq, d) for seq in flash["seq_lengths"]
                          if seq >= min_seq for d in flash["d_heads"]),
                    SWEEP_DTYPE, flash["causal"])
    return case


def _longest(flash: dict) -> Case:
    return Case(tuple((flash["batch_size"], LONGEST_SEQ, d) for d in flash["d_heads"]),
                SWEEP_DTYPE, flash["causal"])


def _fixed(shapes: tuple, precision: str = "bf16") -> Callable[[dict], Case]:
    def case(flash: dict) -> Case:
        return Case(tuple(shapes), precision, causal=True)
    return case


def _model_shapes() -> tuple[tuple[int, int, int], ...]:
    def shape(size: str, batch: int, context: int) -> tuple[int, int, int]:
        spec = MODEL_SIZES[size]
        return batch * spec.num_heads, context, spec.d_model // spec.num_heads
    return (*(shape(*case) for case in MODEL_CASES), LEADERBOARD_8B_HEADS)


# each step's metric and its twin, the same step replayed from a CUDA graph: the GPU's time,
# without the host's (Python, autograd, launches), which at small shapes outlasts the kernels of
# every implementation and under do_bench shows as the GPU's wait for a launch
GRAPH_METRICS = {"forward_backward_ms": "forward_backward_graph_ms",
                 "forward_ms": "forward_graph_ms"}
GRAPH_METRIC = GRAPH_METRICS["forward_backward_ms"]
UNITS = {"forward_backward_ms": "ms", "forward_ms": "ms",
         **dict.fromkeys(GRAPH_METRICS.values(), "ms"), "longest_seq": "tokens",
         "cold_compile_s": "s"}
UNITS_SHOWN = {"x": "x", "ms": " ms", "s": " s", "tokens": ""}

GROUPS: dict[str, Group] = {g.name: g for g in (
    Group("leaderboard", "versus", "forward_backward_ms", _leaderboard),
    Group("forward", "versus", "forward_ms", _forward),
    Group("gluon_forward", "versus", "forward_ms", _gluon_forward),
    Group("gluon_forward_graph", "versus", GRAPH_METRICS["forward_ms"], _gluon_forward),
    Group("sdpa_flash_sweep", "versus", "forward_backward_ms", _sweep_from(SDPA_FLASH_FROM_SEQ)),
    Group("pytorch_sweep", "versus", "forward_backward_ms", _sweep_from(PYTORCH_FROM_SEQ)),
    Group("long", "versus", "forward_backward_ms", _fixed(LONG_SHAPES)),
    Group("long_graph", "versus", GRAPH_METRIC, _fixed(LONG_SHAPES)),
    Group("model_shapes", "versus", "forward_backward_ms", _fixed(_model_shapes())),
    Group("batch_one", "versus", "forward_backward_ms", _fixed(BATCH_ONE_SHAPES)),
    Group("model_shapes_graph", "versus", GRAPH_METRIC, _fixed(_model_shapes())),
    Group("batch_one_graph", "versus", GRAPH_METRIC, _fixed(BATCH_ONE_SHAPES)),
    Group("fp32_forward", "versus", "forward_ms", _fixed((FP32_SHAPE,), "fp32")),
    Group("longest", "longest", "longest_seq", _longest),
    Group("cold_compile", "cold_compile", "cold_compile_s", _leaderboard),
)}

TARGETS: tuple[Target, ...] = (
    Target("leaderboard_vs_sdpa_flash", "leaderboard forward+backward", "leaderboard",
           AttentionRun(OURS, compiled=True), "<=", 0.75, AttentionRun("sdpa-flash", compiled=True)),
    Target("leaderboard_vs_class_best", "leaderboard forward+backward, against the best 2025 "
           "class entry (H100, quoted)", "leaderboard", AttentionRun(OURS, compiled=True), "<",
           CLASS_BEST_MS, bound_gpu="H100"),
    Target("leaderboard_vs_sdpa_cudnn", "leaderboard forward+backward", "leaderboard",
           AttentionRun(OURS, compiled=True), "<=", 1.0, AttentionRun("sdpa-cudnn", compiled=True),
           stretch=True),
    Target("leaderboard_vs_fa4", "leaderboard forward+backward", "leaderboard",
           AttentionRun(OURS, compiled=True), "<=", 1.0, AttentionRun(PEER, compiled=True),
           stretch=True),
    Target("forward_vs_sdpa_flash", "forward alone", "forward", AttentionRun(OURS), "<=", 1.0,
           AttentionRun("sdpa-flash")),
    Target("forward_vs_sdpa_cudnn", "forward alone", "forward", AttentionRun(OURS), "<=", 1.0,
           AttentionRun("sdpa-cudnn")),
    Target("forward_vs_fa4", "forward alone", "forward", AttentionRun(OURS), "<=", 1.0,
           AttentionRun(PEER), stretch=True),
    Target("long_vs_sdpa_cudnn", "forward+backward, long sequences", "long", AttentionRun(OURS),
           "<=", 1.0, AttentionRun("sdpa-cudnn")),
    Target("long_vs_sdpa_cudnn_stretch", "forward+backward, long sequences", "long",
           AttentionRun(OURS), "<=", 0.9, AttentionRun("sdpa-cudnn"), stretch=True),
    Target("long_vs_fa4", "forward+backward, long sequences", "long", AttentionRun(OURS), "<=",
           1.0, AttentionRun(PEER), stretch=True),
    Target("models_vs_sdpa_flash", "forward+backward, the models' heads", "model_shapes",
           AttentionRun(OURS), "<=", 1.0, AttentionRun("sdpa-flash")),
    Target("models_vs_sdpa_cudnn", "forward+backward, the models' heads", "model_shapes",
           AttentionRun(OURS), "<=", 1.0, AttentionRun("sdpa-cudnn"), stretch=True),
    Target("models_vs_fa4", "forward+backward, the models' heads", "model_shapes",
           AttentionRun(OURS), "<=", 1.0, AttentionRun(PEER), stretch=True),
    Target("batch_one_vs_sdpa_flash", "forward+backward, batch 1 at 4096", "batch_one",
           AttentionRun(OURS), "<=", 1.25, AttentionRun("sdpa-flash")),
    Target("batch_one_vs_fa4", "forward+backward, batch 1 at 4096", "batch_one",
           AttentionRun(OURS), "<=", 1.0, AttentionRun(PEER), stretch=True),
    Target("models_graph_vs_sdpa_flash", "forward+backward, the models' heads, GPU time (CUDA "
           "graph)", "model_shapes_graph", AttentionRun(OURS), "<=", 1.0,
           AttentionRun("sdpa-flash")),
    Target("models_graph_vs_sdpa_cudnn", "forward+backward, the models' heads, GPU time (CUDA "
           "graph)", "model_shapes_graph", AttentionRun(OURS), "<=", 1.0,
           AttentionRun("sdpa-cudnn"), stretch=True),
    Target("models_graph_vs_fa4", "forward+backward, the models' heads, GPU time (CUDA graph)",
           "model_shapes_graph", AttentionRun(OURS), "<=", 1.0, AttentionRun(PEER), stretch=True),
    Target("batch_one_graph_vs_sdpa_flash", "forward+backward, batch 1 at 4096, GPU time (CUDA "
           "graph)", "batch_one_graph", AttentionRun(OURS), "<=", 1.25,
           AttentionRun("sdpa-flash")),
    Target("batch_one_graph_vs_fa4", "forward+backward, batch 1 at 4096, GPU time (CUDA graph)",
           "batch_one_graph", AttentionRun(OURS), "<=", 1.0, AttentionRun(PEER), stretch=True),
    Target("fp32_forward_vs_ieee", "fp32 forward at the default precision", "fp32_forward",
           AttentionRun(OURS), "<=", 0.25, AttentionRun("flash-triton-ieee")),
    Target("sweep_vs_sdpa_flash", f"forward+backward, seq ≥ {SDPA_FLASH_FROM_SEQ}",
           "sdpa_flash_sweep", AttentionRun(OURS), "<=", 1.25, AttentionRun("sdpa-flash")),
    Target("sweep_vs_fa4", f"forward+backward, seq ≥ {SDPA_FLASH_FROM_SEQ}", "sdpa_flash_sweep",
           AttentionRun(OURS), "<=", 1.0, AttentionRun(PEER), stretch=True),
    Target("sweep_vs_eager", f"forward+backward, seq ≥ {PYTORCH_FROM_SEQ}", "pytorch_sweep",
           AttentionRun(OURS), "<", 1.0, AttentionRun("eager")),
    Target("sweep_vs_compiled", f"forward+backward, seq ≥ {PYTORCH_FROM_SEQ}", "pytorch_sweep",
           AttentionRun(OURS), "<", 1.0, AttentionRun("eager", compiled=True)),
    Target("gluon_long_vs_sdpa_cudnn", "Gluon forward+backward, long sequences", "long",
           AttentionRun(GLUON), "<=", 0.95, AttentionRun("sdpa-cudnn")),
    # the same steps' GPU time: where the eager row misses and this one meets, host time bounds it
    Target("gluon_long_graph_vs_sdpa_cudnn", "Gluon forward+backward, long sequences, GPU time "
           "(CUDA graph)", "long_graph", AttentionRun(GLUON), "<=", 0.95,
           AttentionRun("sdpa-cudnn")),
    Target("gluon_forward_vs_sdpa_cudnn", f"Gluon forward alone, d {max(FORWARD_D_HEADS)}",
           "gluon_forward", AttentionRun(GLUON), "<=", 0.90, AttentionRun("sdpa-cudnn")),
    Target("gluon_forward_graph_vs_sdpa_cudnn", f"Gluon forward alone, d {max(FORWARD_D_HEADS)}, "
           "GPU time (CUDA graph)", "gluon_forward_graph", AttentionRun(GLUON), "<=", 0.90,
           AttentionRun("sdpa-cudnn")),
    Target("gluon_models_graph_vs_sdpa_cudnn", "Gluon forward+backward, the models' heads, GPU "
           "time (CUDA graph)", "model_shapes_graph", AttentionRun(GLUON), "<=", 1.0,
           AttentionRun("sdpa-cudnn")),
    Target("no_oom", "longest sequence forward+backward runs", "longest", AttentionRun(OURS), ">=",
           LONGEST_SEQ),
    Target("cold_compile", "leaderboard: autotuning and compilation from empty Triton and "
           "Inductor caches", "cold_compile", AttentionRun(OURS, compiled=True), "<=", 600),
)


def graph_twin(target: Target) -> Target | None:
    """The same comparison timed as GPU time: the target of the group's CUDA-graph twin
    (`<group>_graph`, at the same shapes, its metric the twin of the group's in GRAPH_METRICS)
    with the same implementations, operator and bound, or None."""
    twin_group = GROUPS.get(f"{target.group}_graph")
    if (twin_group is None
            or twin_group.metric != GRAPH_METRICS.get(GROUPS[target.group].metric)):
        return None
    for twin in TARGETS:
        if (twin.group == twin_group.name and twin.ours == target.ours
                and twin.reference == target.reference and twin.op == target.op
                and twin.bound == target.bound):
            return twin
    return None


def group_targets(group: str) -> list[Target]:
    return [t for t in TARGETS if t.group == group]


def group_runs(group: str) -> list[AttentionRun]:
    """Ours first, then each reference the group's targets name, once each, in order."""
    impls: list[AttentionRun] = []
    for target in group_targets(group):
        for impl in (target.ours, target.reference):
            if impl is not None and impl not in impls:
                impls.append(impl)
    return impls


def group_case(group: str, flash: dict) -> Case:
    """The shapes, precision and causal flag a group's job measures, from the config's `flash`."""
    return GROUPS[group].case(flash)


def group_args(group: str, flash: dict) -> dict:
    """A group's job arguments (`sections/flash/time_targets.py`) from the config's `flash`."""
    case = group_case(group, flash)
    return {"group": group, "shapes": ["x".join(map(str, shape)) for shape in case.shapes],
            "precision": case.precision, "causal": case.causal, "rounds": flash["speed"]["rounds"]}


def group_modules(group: str) -> list[str]:
    """The kernel modules the group's implementations import lazily (its rule's sources)."""
    modules = {m for impl in group_runs(group) for m in attention_modules(impl.name)}
    return sorted(modules | ({COLD_COMPILE_CLI} if group == "cold_compile" else set()))


def parse_shape(text: str) -> Shape:
    """'16x16384x64' -> (16, 16384, 64): batch, sequence length, head dimension."""
    try:
        shape = tuple(positive_int(part) for part in text.split("x"))
    except (ValueError, argparse.ArgumentTypeError) as error:
        raise argparse.ArgumentTypeError(f"expected BATCHxSEQxD, got {text!r}") from error
    if len(shape) != 3:
        raise argparse.ArgumentTypeError(f"expected BATCHxSEQxD, got {text!r}")
    return shape
