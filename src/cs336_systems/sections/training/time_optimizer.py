"""The optimizer step alone, at one model size: every optimizer of `FLAT_OPTIMIZERS` in one process,
beside the memory-bandwidth floor from a copy measured in the same process.

    python -m cs336_systems.sections.training.time_optimizer --size 2.7b --output r.json

The parameters are the model's (fp32, built on the device), with fp32 gradients of standard
normal noise. For each optimizer in turn: its state is created by one step, then `--rounds`
rounds of do_bench medians of `step()`; the memory its step allocates beyond what the
parameters, gradients and state hold (`extra_gib`: the written-out AdamW's sqrt(v)); then its
state is freed. The floor is the bytes a step must move (read p, g, m, v; write p, m, v: 28 per
fp32 parameter) over the copy's bandwidth (bytes read plus written).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from cs336_systems.lm.model import MODEL_SIZES, build_model
from cs336_systems.lm.optimizer import FLAT_OPTIMIZERS, build_optimizer
from cs336_systems.measure.ceilings import copy_gbps
from cs336_systems.measure.memory import GIB, allocated_gib, peak_gib, reset_peak
from cs336_systems.measure.timing import benchmark_ms
from cs336_systems.pipeline.cli import add_common_arguments, positive_int
from cs336_systems.pipeline.records import Skip, is_out_of_memory, run_and_record

BYTES_PER_PARAMETER = 7 * 4  # fp32: read p, g, m, v; write p, m, v


def time_optimizer(name: str, params: list[torch.nn.Parameter], rounds: int,
                   device: torch.device) -> dict:
    optimizer = build_optimizer(name, params)
    try:
        optimizer.step()  # creates the state
        torch.cuda.synchronize(device)
        before = allocated_gib(device)
        reset_peak(device)
        optimizer.step()
        extra = peak_gib(device) - before
        medians = [benchmark_ms(optimizer.step, device) for _ in range(rounds)]
        return {"optimizer": name, "status": "ok", "ms_median": statistics.median(medians),
                "ms_min": min(medians), "ms_max": max(medians), "rounds_ms": medians,
                "extra_gib": extra}
    except torch.OutOfMemoryError as error:
        return {"optimizer": name, "status": "oom", "message": str(error).splitlines()[0]}
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        return {"optimizer": name, "status": "oom", "message": str(error).splitlines()[0]}
    finally:
        optimizer.state.clear()
        del optimizer
        torch.cuda.empty_cache()


def measure(config: dict, device: torch.device) -> dict:
    if device.type != "cuda":
        raise Skip("the optimizer benchmark times CUDA kernels against the GPU's bandwidth; "
                   f"this job runs on {device.type}")
    bandwidth = copy_gbps(device)
    params = list(build_model(config["size"], context_length=16, device=device).parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    count = sum(p.numel() for p in params)
    floor_ms = count * BYTES_PER_PARAMETER / (bandwidth * 1e9) * 1e3
    return {"parameters": count, "copy_gbps": bandwidth, "floor_ms": floor_ms,
            "bytes_per_parameter": BYTES_PER_PARAMETER,
            "state_gib": 2 * count * 4 / GIB,
            "optimizers": [time_optimizer(name, params, config["rounds"], device)
                           for name in config["optimizers"]]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", required=True, choices=list(MODEL_SIZES))
    parser.add_argument("--optimizers", nargs="+", default=list(FLAT_OPTIMIZERS),
                        choices=list(FLAT_OPTIMIZERS))
    parser.add_argument("--rounds", type=positive_int, default=3)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    return run_and_record("optimizer", config, args.output,
                          lambda device: measure(config, device), args.device)


if __name__ == "__main__":
    main()
