"""Run an experiment on several processes; the launcher writes the one record.

A distributed experiment module calls `launch_or_work(...)` from its `main`. Started by hand or
by Snakemake, it is the launcher: through `records.run_and_record` (the one writer of records)
it checks that the machine can hold the run (else `Skip`, a `skipped` record saying why), then
starts one worker per rank (a fresh rendezvous port each time) and returns rank 0's metrics.
Each worker joins the process group, calls `work(config, rank, world_size, device)` and rank 0
hands its metrics back through a file. A run that dies before rank 0 hands them back (an
out-of-memory, a crash, a timeout) raises `WorkerFailure` carrying the tail of its output,
which `run_and_record` files as `oom` or `error`.

How the workers start (`rank_start`): on gloo they are forked from the launcher, which has
imported everything they need, so a rank starts in a fraction of a second (`launch.spawn`,
the tests' launcher, with its fork start method); with nccl (or with
`CS336_RANKS=torchrun`) the launcher re-runs the same module with the same arguments under
`torchrun --standalone`, fresh processes that initialise CUDA for themselves (CUDA does not
survive a fork once the launcher has started it), about seven seconds of interpreter starts and
imports on a CPU machine.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from cs336_systems.distributed.launch import (
    cleanup,
    setup_from_env,
    spawn,
    unavailable_reason,
)
from cs336_systems.paths import SRC_ROOT
from cs336_systems.pipeline.records import Skip, configure_logging, run_and_record
from cs336_systems.records import write_json_atomic

Work = Callable[[dict, int, int, torch.device], dict]
METRICS_FILE_ENV = "CS336_RANK0_METRICS"  # where a worker of rank 0 leaves its metrics
RANKS_ENV = "CS336_RANKS"  # how the workers start: "fork" or "torchrun" (default: rank_start)
RANK_STARTS = ("fork", "torchrun")


def rank_start(backend: str) -> str:
    """How a job's workers start: `CS336_RANKS` if set, else fork on gloo, torchrun on nccl."""
    chosen = os.environ.get(RANKS_ENV)
    if chosen is None:
        return "torchrun" if backend == "nccl" else "fork"
    if chosen not in RANK_STARTS:
        raise ValueError(f"{RANKS_ENV}={chosen!r}; allowed: {', '.join(RANK_STARTS)}")
    if chosen == "fork" and backend == "nccl":
        raise ValueError(f"{RANKS_ENV}=fork cannot start nccl ranks: CUDA does not survive a "
                         "fork; use torchrun")
    return chosen


class WorkerFailure(RuntimeError):
    """The torchrun workers ended without rank 0's metrics; the message starts with the line of
    their output that says why (an out-of-memory line if there is one) and ends with the tail."""

    def __init__(self, returncode: int | None, output: str):
        lines = output.splitlines()
        cause = next((line for line in lines if "out of memory" in line.lower()), None)
        summary = cause or f"torchrun workers exited with code {returncode} and no metrics"
        super().__init__(f"{summary.strip()}\n{output[-4000:]}")


def launch_or_work(module: str, section: str, config: dict, output: str, work: Work,
                   world_size: int, backend: str, argv: Sequence[str] | None = None,
                   timeout_s: float = 540) -> None:
    """Launcher (record one configuration) or worker (run `work` on this rank), see above.
    `argv`: the module's arguments, for torchrun to start it again with (default: this
    process's)."""
    argv = sys.argv[1:] if argv is None else argv
    if "LOCAL_RANK" in os.environ:  # each worker parsed the same arguments into `config`
        _work(work, config, backend)
        return
    device = "cuda" if backend == "nccl" else "cpu"

    def measure(_device) -> dict:
        if reason := unavailable_reason(backend, world_size):
            raise Skip(reason)
        if rank_start(backend) == "fork":
            return _fork_ranks(work, config, world_size, backend, timeout_s)
        return _torchrun(module, argv, world_size, timeout_s)

    run_and_record(section, config, output, measure, device)


def _torchrun(module: str, argv: Sequence[str], world_size: int, timeout_s: float) -> dict:
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


def _fork_ranks(work: Work, config: dict, world_size: int, backend: str,
                timeout_s: float) -> dict:
    """Fork one worker per rank from this process (`launch.spawn`, which kills the rest when
    one fails or the time is up and raises with the first failure) and return rank 0's
    metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics_file = Path(tmp) / "rank0.json"
        # One intra-op thread a rank, as torchrun gives its workers (OMP_NUM_THREADS=1) and as the
        # rule allots (a core a rank). With a share of all the host's cores a rank, a 1 MB gloo
        # all-reduce took 7.6 ms on a 64-core host even with one job at a time, 0.85 ms with one.
        spawn(_forked_rank, world_size, backend, args=(work, config, str(metrics_file)),
              timeout_s=timeout_s, start_method="fork", threads_per_rank=1)
        return json.loads(metrics_file.read_text())


def _forked_rank(rank: int, world_size: int, work: Work, config: dict,
                 metrics_file: str) -> None:
    logging.getLogger().handlers.clear()  # the launcher's; this rank's lines carry its number
    _run_rank(work, config, rank, world_size, torch.device("cpu"), metrics_file)


def _work(work: Work, config: dict, backend: str) -> None:
    """A worker that torchrun started: join its group, run this rank, leave."""
    rank, world_size, device = setup_from_env(backend=backend)
    try:
        _run_rank(work, config, rank, world_size, device, os.environ[METRICS_FILE_ENV])
    finally:
        cleanup()


def _run_rank(work: Work, config: dict, rank: int, world_size: int, device: torch.device,
              metrics_file: str) -> None:
    """One rank's work, in a joined group; rank 0 hands its metrics back through the file."""
    configure_logging(prefix=f"rank {rank}: ")
    metrics = work(config, rank, world_size, device)
    if rank == 0:
        write_json_atomic(metrics_file, metrics)
