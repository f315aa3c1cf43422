"""Run an experiment on several processes with torchrun; rank 0 writes the one record.

A distributed experiment module calls `launch_or_work(...)` from its `main`. Started by hand or
by Snakemake, it is the launcher: it checks that the machine can hold the run (else a `skipped`
record says why), then re-runs the same module under `torchrun --standalone` (a fresh
rendezvous port each time). Started by torchrun, it is a worker: it joins the process group,
calls `work(config, rank, world_size, device)` on every rank and writes rank 0's metrics.
A run that dies before rank 0 writes (an out-of-memory, a crash) becomes an `oom` or `error`
record with the tail of its output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from cs336_systems.distributed.launch import cleanup, setup_from_env
from cs336_systems.records import environment, make_record, write_json_atomic

Work = Callable[[dict, int, int, torch.device], dict]


def unavailable_reason(backend: str, world_size: int) -> str | None:
    if backend == "nccl":
        gpus = torch.cuda.device_count()
        if gpus < world_size:
            return f"nccl with {world_size} processes needs {world_size} GPUs; this machine has {gpus}"
    cores = os.cpu_count() or 1
    if backend == "gloo" and world_size > cores:
        return (f"gloo with {world_size} processes on {cores} CPU cores would time the "
                "oversubscription, not the collective")
    return None


def launch_or_work(module: str, section: str, config: dict, output: str, work: Work,
                   world_size: int, backend: str, timeout_s: float = 540) -> None:
    if "LOCAL_RANK" in os.environ:
        _work(section, config, output, work, backend)
    else:
        _launch(module, section, config, output, world_size, backend, timeout_s)


def _launch(module, section, config, output, world_size, backend, timeout_s) -> None:
    env_device = "cuda" if backend == "nccl" and torch.cuda.is_available() else "cpu"
    reason = unavailable_reason(backend, world_size)
    if reason:
        write_json_atomic(output, make_record(section, config, "skipped",
                                              env=environment(env_device), message=reason))
        return
    Path(output).unlink(missing_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={world_size}", "-m", module, *sys.argv[1:]]
    # its own process group, so that a timeout takes torchrun's workers down with it
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        log, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        log = f"timed out after {timeout_s} s\n{process.communicate()[0]}"
    if not Path(output).exists():
        status = "oom" if "out of memory" in log.lower() else "error"
        write_json_atomic(output, make_record(section, config, status,
                                              env=environment(env_device), message=log[-4000:]))


def _work(section, config, output, work: Work, backend: str) -> None:
    rank, world_size, device = setup_from_env(backend=backend)
    try:
        metrics = work(config, rank, world_size, device)
        if rank == 0:
            write_json_atomic(output, make_record(section, config, "ok", metrics,
                                                  environment(device)))
    finally:
        cleanup()
