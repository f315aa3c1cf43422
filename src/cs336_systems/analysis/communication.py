"""communication_accounting (§4.6): memory and compute-bound batch size of the XXL model.

The assignment's simplified XXL model: `num_blocks` feed-forward blocks, each two linear
layers d_model -> d_ff -> d_model with no activation, attention, embeddings or LM head.
Master weights, accumulated gradients and AdamW's two moments are fp32; the activations saved
for backward are bf16. The compute-bound analysis follows the TPU Scaling Book's model of a
sharded two-layer MLP with FSDP over mesh axis X and tensor parallelism over axis Y:

    T_math = 4 B D F / (X Y C)            (forward: two matmuls, 2 FLOPs per multiply-add)
    T_fsdp = 4 D F / (Y W M_X)            (all-gather of the bf16 weights over X)
    T_tp   = 4 B D / (X W M_Y)            (activations over Y)

so the step is compute bound when B / X > C / (W M_X), i.e. a per-device batch
B / (X Y) > C / (W M_X Y), and when Y < F W M_Y / C.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

GB = 1e9
FP32_BYTES = 4
BF16_BYTES = 2


@dataclass(frozen=True)
class XXLConfig:
    d_model: int = 16_384
    d_ff: int = 53_248
    num_blocks: int = 126
    gpu_memory_gb: float = 80.0          # one H100
    tpu_memory_gb: float = 95.0          # one TPU v5p
    flops_per_s: float = 4.6e14          # C, TPU v5p bf16
    ici_bandwidth: float = 2 * 9e10      # W_ici, bytes/s
    mesh_multiplicity_x: int = 2         # M_X
    mesh_multiplicity_y: int = 1         # M_Y
    fsdp_degree_x: int = 16              # X
    tp_degree_y: int = 4                 # Y


def parameters(c: XXLConfig) -> int:
    return c.num_blocks * 2 * c.d_model * c.d_ff


def activation_bytes_per_token(c: XXLConfig) -> int:
    """bf16 inputs of both linear layers of every block, saved for backward."""
    return c.num_blocks * (c.d_model + c.d_ff) * BF16_BYTES


def answers(c: XXLConfig = XXLConfig()) -> dict[str, float]:
    n = parameters(c)
    weights_gb = n * FP32_BYTES / GB
    gradients_gb = n * FP32_BYTES / GB
    optimizer_gb = 2 * n * FP32_BYTES / GB                      # AdamW: first and second moment
    state_gb = weights_gb + gradients_gb + optimizer_gb
    alpha = c.flops_per_s / c.ici_bandwidth                   # FLOPs per byte of ICI
    per_device_batch = alpha / (c.mesh_multiplicity_x * c.tp_degree_y)
    devices = c.fsdp_degree_x * c.tp_degree_y
    return {
        "parameters": n,
        "master_weights_gb": weights_gb,
        "gradients_gb": gradients_gb,
        "optimizer_state_gb": optimizer_gb,
        "fp32_state_gb": state_gb,
        "activation_mb_per_token": activation_bytes_per_token(c) / 1e6,
        "h100s_for_fp32_state": state_gb / c.gpu_memory_gb,
        # (b) state sharded N ways (activations excluded: they scale with the batch, see below)
        "fsdp_degree_to_fit_tpu": math.ceil(state_gb / c.tpu_memory_gb),
        # (c) the compute-bound batch under FSDP (X) x TP (Y)
        "flops_per_ici_byte": alpha,
        "compute_bound_per_device_batch": per_device_batch,
        "compute_bound_overall_batch": per_device_batch * devices,
        "max_tp_degree_compute_bound": c.d_ff * c.ici_bandwidth * c.mesh_multiplicity_y / c.flops_per_s,
        "devices": devices,
    }


def config_dict(c: XXLConfig = XXLConfig()) -> dict:
    return asdict(c)
