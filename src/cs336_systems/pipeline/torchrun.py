"""Run an experiment on several processes with torchrun; the launcher writes the one record.

A distributed experiment module calls `launch_or_work(...)` from its `main`. Started by hand or
by Snakemake, it is the launcher: through `records.run_and_record` (the one writer of records)
it checks that the machine can hold the run (else `Skip`, a `skipped` record saying why), then
re-runs the same module with the same arguments under `torchrun --standalone` (a fresh
rendezvous port each time) and returns rank 0's metrics. Started by torchrun, it is a worker:
it joins the process group, calls `work(config, rank, world_size, device)` on every rank and
hands rank 0's metrics back through a file. A run that dies before rank 0 hands them back (an
out-of-memory, a crash, a timeout) raises `WorkerFailure` carrying the tail of its output,
which `run_and_record` files as `oom` or `error`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from cs336_systems.distributed.launch import cleanup, setup_from_env, unavailable_reason
from cs336_systems.paths import SRC_ROOT
from cs336_systems.pipeline.records import (
    Skip,
    configure_logging,
    run_and_record,
    write_json_atomic,
)

Work = Callable[[dict, int, int, torch.device], dict]
METRICS_FILE_ENV = "CS336_RANK0_METRICS"  # where a worker of rank 0 leaves its metrics



class WorkerFailure(RuntimeError):
    """The torchrun workers ended without rank 0's metrics; the message starts with the line of
    their output that says why (an out-of-memory line if there is one) and ends with the tail."""

    def __init__(self, returncode: int | None, output: str):
        lines = output.splitlines()
        cause = next((line for line in lines if "out of memory" in line.lower()), None)
        summary = cause or f"torchrun workers exited with code {returncode} and no metrics"
        super().__init__(f"{summary.strip()}\n{output[-4000:]}")


def launch_or_work(module: str, section: str, config: dict, output: str, work: Work,
                   world_size: int, backend: str, argv: Sequence[str],
                   timeout_s: float = 540) -> None:
    """Launcher (record one configuration) or worker (run `work` on this rank), see above."""
    if "LOCAL_RANK" in os.environ:  # each worker parsed the same arguments into `config`
        _work(work, config, backend)
        return
    device = "cuda" if backend == "nccl" else "cpu"
    run_and_record(section, config, output,
                   lambda _: _launch(module, argv, world_size, backend, timeout_s), device)


def _launch(module: str, argv: Sequence[str], world_size: int, backend: str,
            timeout_s: float) -> dict:
    reason = unavailable_reason(backend, world_size)
    if reason:
        raise Skip(reason)
    with tempfile.TemporaryDirectory() as tmp:
        metrics_file = Path(tmp) / "rank0.json"
        pythonpath = os.pathsep.join(filter(None, [str(SRC_ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, METRICS_FILE_ENV: str(metrics_file), "PYTHONPATH": pythonpath}
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={world_size}", "-m", module, *argv]
        # its own process group, so that a timeout takes torchrun's workers down with it
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env=env, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output = f"timed out after {timeout_s} s\n{process.communicate()[0]}"
        sys.stderr.write(output)  # the workers' own log lines, into this job's log
        if process.returncode == 0 and metrics_file.exists():
            return json.loads(metrics_file.read_text())
        raise WorkerFailure(process.returncode, output)


def _work(work: Work, config: dict, backend: str) -> None:
    rank, world_size, device = setup_from_env(backend=backend)
    configure_logging(prefix=f"rank {rank}: ")
    try:
        metrics = work(config, rank, world_size, device)
        if rank == 0:
            write_json_atomic(os.environ[METRICS_FILE_ENV], metrics)
    finally:
        cleanup()
