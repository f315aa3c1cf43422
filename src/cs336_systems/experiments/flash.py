"""flash_benchmarking (assignment §3.4-3.5): latency of one attention implementation at one shape.

    python -m cs336_systems.experiments.flash --impl triton --seq 4096 --d 64 --dtype bf16 \
        --output r.json [--batch-size 16 --compile]   # the leaderboard case adds these two

Times forward, backward and forward+backward with `triton.testing.do_bench` (median, ms).
Implementations: `triton` (our FlashAttention-2 kernels), `pytorch` (plain attention,
softmax(q k^T / sqrt(d)) v in PyTorch ops), `sdpa` (torch's scaled_dot_product_attention), and
`flash-pytorch` (our tiled PyTorch FlashAttention-2). On a CPU the Triton kernels run under
TRITON_INTERPRET=1, which this CLI sets when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import importlib
import os

import torch

if not torch.cuda.is_available():  # before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cs336_systems.attention import eager_attention  # noqa: E402
from cs336_systems.experiments.cli import add_common_arguments, positive_int  # noqa: E402
from cs336_systems.records import Skip, run_and_record  # noqa: E402
from cs336_systems.timing import benchmark_ms  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# implementation -> (module, attribute); imported only when used, so that a job's source
# inputs (see `implementation_modules`) are exactly the code it runs.
IMPLEMENTATIONS = {
    "triton": ("cs336_systems.kernels.flash_triton", "FlashAttentionTriton"),
    "flash-pytorch": ("cs336_systems.kernels.flash_pytorch", "FlashAttentionPytorch"),
    "pytorch": None,
    "sdpa": None,
}


def implementation_modules(impl: str) -> list[str]:
    """Package modules a job of `impl` imports beyond this CLI (for Snakemake's inputs)."""
    spec = IMPLEMENTATIONS[impl]
    return [spec[0]] if spec else []


def attention_fn(impl: str):
    """(q, k, v, is_causal) -> o on (batch, seq, d) tensors."""
    if impl == "pytorch":
        return eager_attention
    if impl == "sdpa":
        # a head axis lets SDPA pick its fused (flash / memory-efficient) kernels
        return lambda q, k, v, is_causal: torch.nn.functional.scaled_dot_product_attention(
            q[:, None], k[:, None], v[:, None], is_causal=is_causal)[:, 0]
    module, name = IMPLEMENTATIONS[impl]
    return getattr(importlib.import_module(module), name).apply


def measure(config: dict, device: torch.device) -> dict:
    dtype = DTYPES[config["dtype"]]
    if config["impl"] == "triton" and device.type == "cpu" and dtype == torch.bfloat16:
        raise Skip("Triton's CPU interpreter cannot run bf16 tl.dot (triton-lang/triton#11584)")
    if config["impl"] == "triton" and device.type == "cpu" and config["compile"]:
        raise Skip("torch.compile cannot trace kernels run by Triton's CPU interpreter")
    torch.manual_seed(config["seed"])
    shape = (config["batch_size"], config["seq"], config["d"])
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad_o = torch.randn(shape, device=device, dtype=dtype)
    attend = attention_fn(config["impl"])
    if config["compile"]:
        attend = torch.compile(attend)
    causal = config["causal"]

    def forward():
        return attend(q, k, v, causal)

    def forward_backward():
        forward().backward(grad_o)

    def backward():
        output = forward()
        return benchmark_ms(lambda: output.backward(grad_o, retain_graph=True), device,
                            grad_to_none=[q, k, v])

    passes = {
        "forward": lambda: benchmark_ms(forward, device),
        "backward": backward,
        "forward_backward": lambda: benchmark_ms(forward_backward, device, grad_to_none=[q, k, v]),
    }
    metrics: dict = {}
    for name, run in passes.items():  # an out-of-memory in one pass still leaves the others
        metrics.update(_measure_pass(name, run, device))
    if not any(key.endswith("_ms") for key in metrics):
        raise torch.OutOfMemoryError(f"every pass ran out of memory: {metrics}")
    if device.type == "cuda":
        metrics["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return metrics


def _measure_pass(name: str, run, device: torch.device) -> dict:
    """`{name}_ms`, or `{name}_status: "oom"` if this pass alone runs out of memory."""
    try:
        return {f"{name}_ms": run()}
    except torch.OutOfMemoryError:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {f"{name}_status": "oom"}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", required=True, choices=list(IMPLEMENTATIONS))
    parser.add_argument("--seq", type=positive_int, required=True)
    parser.add_argument("--d", type=positive_int, required=True)
    parser.add_argument("--dtype", required=True, choices=list(DTYPES))
    parser.add_argument("--batch-size", type=positive_int, default=1)
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--compile", action="store_true",
                        help="time torch.compile(the implementation), as the leaderboard does")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    for name in ("seq", "d"):
        value = getattr(args, name)
        if value < 16 or value & (value - 1):
            parser.error(f"--{name} must be a power of two of at least 16, got {value}")
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    return run_and_record("flash", config, args.output, lambda device: measure(config, device),
                          args.device)


if __name__ == "__main__":
    main()
