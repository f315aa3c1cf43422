"""flash_benchmarking (assignment §4.4-4.5): latency of one attention implementation at one shape.

    python -m cs336_systems.sections.flash.time_flash --attention flash-triton --seq 4096 --d 64 \
        --dtype bf16 --output r.json [--batch-size 16 --compile]   # the leaderboard adds these

Times forward, backward and forward+backward with `triton.testing.do_bench` (median, ms).
`--attention` names an implementation of the attention registry (`cs336_systems.lm.attention`):
`flash-triton` (our FlashAttention-2 kernels), `flash-pytorch` (our tiled PyTorch version),
`eager` (softmax(q k^T / sqrt(d)) v in plain PyTorch ops), `sdpa` (torch's
scaled_dot_product_attention, its record naming the backend SDPA's dispatch chose) and
`sdpa-flash` / `sdpa-cudnn` (SDPA pinned to one backend; a
backend that cannot run the inputs here records `skipped` with SDPA's reason). On a CPU the
Triton kernels run under TRITON_INTERPRET=1, which `cs336_systems.kernels` sets where
there is no CUDA device.
"""

from __future__ import annotations

import argparse

import torch

from cs336_systems.kernels.checks import MAX_HEAD_DIM  # on a CPU: TRITON_INTERPRET=1
from cs336_systems.lm.attention import (
    ATTENTION_IMPLEMENTATIONS,
    get_attention,
    sdpa_choice,
    unavailable_reason,
)
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.measure.memory import peak_gib
from cs336_systems.measure.timing import benchmark_ms
from cs336_systems.pipeline.cli import add_common_arguments, positive_int
from cs336_systems.pipeline.records import Skip, run_and_record


def attention_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
                     ) -> tuple[torch.Tensor, ...]:
    """q, k and v of `shape`, requiring grad, and an output gradient: standard normal."""
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    return q, k, v, torch.randn(shape, device=device, dtype=dtype)


def measure(config: dict, device: torch.device) -> dict:
    dtype = PRECISIONS[config["dtype"]]
    triton_on_cpu = config["attention"] == "flash-triton" and device.type == "cpu"
    if triton_on_cpu and dtype == torch.bfloat16:
        raise Skip("Triton's CPU interpreter cannot run bf16 tl.dot (triton-lang/triton#11584)")
    if triton_on_cpu and config["compile"]:
        raise Skip("torch.compile cannot trace kernels run by Triton's CPU interpreter")
    torch.manual_seed(config["seed"])
    q, k, v, grad_o = attention_inputs((config["batch_size"], config["seq"], config["d"]), dtype,
                                       device)
    causal = config["causal"]
    if reason := unavailable_reason(config["attention"], q, k, v, causal):
        raise Skip(reason)
    attend = get_attention(config["attention"])
    if config["compile"]:
        attend = torch.compile(attend)

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
    # unpinned SDPA: which backend its dispatch chose, so that a table can name it
    metrics: dict = {"sdpa_backend": sdpa_choice(q, k, v, causal)} \
        if config["attention"] == "sdpa" else {}
    for name, run in passes.items():  # an out-of-memory in one pass still leaves the others
        metrics.update(_measure_pass(name, run, device))
    if not any(key.endswith("_ms") for key in metrics):
        raise torch.OutOfMemoryError(f"every pass ran out of memory: {metrics}")
    metrics["peak_gib"] = peak_gib(device)
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
    parser.add_argument("--attention", required=True, choices=list(ATTENTION_IMPLEMENTATIONS))
    parser.add_argument("--seq", type=positive_int, required=True)
    parser.add_argument("--d", type=positive_int, required=True)
    parser.add_argument("--dtype", required=True, choices=list(PRECISIONS))
    parser.add_argument("--batch-size", type=positive_int, default=1)
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                        help="time torch.compile(the implementation), as the leaderboard does")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.seq < 1:
        parser.error(f"--seq must be at least 1, got {args.seq}")
    if not 1 <= args.d <= MAX_HEAD_DIM:
        parser.error(f"--d must be from 1 to {MAX_HEAD_DIM}, got {args.d}")
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    return run_and_record("flash", config, args.output, lambda device: measure(config, device),
                          args.device)


if __name__ == "__main__":
    main()
