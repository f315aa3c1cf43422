"""flash_benchmarking's measurement (assignment §4.4-4.5): forward, backward and
forward+backward of one attention implementation at one shape, each timed with
`triton.testing.do_bench` (median, ms); an out-of-memory in one pass still leaves the others.
The job's CLI is `time_flash`; the other flash jobs take their inputs from `attention_inputs`.
"""

from __future__ import annotations

import torch

from cs336_systems.lm.attention import get_attention, sdpa_choice, unavailable_reason
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.measure.memory import peak_gib
from cs336_systems.measure.timing import benchmark_ms
from cs336_systems.pipeline.records import Skip


def attention_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
                     ) -> tuple[torch.Tensor, ...]:
    """q, k and v of `shape`, requiring grad, and an output gradient: standard normal."""
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    return q, k, v, torch.randn(shape, device=device, dtype=dtype)


def measure(config: dict, device: torch.device) -> dict:
    dtype = PRECISIONS[config["precision"]]
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
