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
imported everything they need, so a rank starts in a fraction of a second; with nccl (or with
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
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from cs336_systems.distributed.launch import (
    MASTER_ADDR,
    cleanup,
    free_port,
    setup_from_env,
    unavailable_reason,
)
from cs336_systems.paths import SRC_ROOT
from cs336_systems.pipeline.records import (
    Skip,
    configure_logging,
    run_and_record,
    write_json_atomic,
)

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
    """The workers ended without rank 0's metrics; the message starts with the line of their
    output that says why (an out-of-memory line if there is one) and ends with the tail."""

    def __init__(self, returncode: int | None, output: str):
        lines = output.splitlines()
        cause = next((line for line in lines if "out of memory" in line.lower()), None)
        summary = cause or f"the workers exited with code {returncode} and no metrics"
        super().__init__(f"{summary.strip()}\n{output[-4000:]}")


def launch_or_work(module: str, section: str, config: dict, output: str, work: Work,
                   world_size: int, backend: str, argv: Sequence[str],
                   timeout_s: float = 540) -> None:
    """Launcher (record one configuration) or worker (run `work` on this rank), see above."""
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
    """Fork one worker per rank from this process, each with torchrun's environment and its
    output in a file of its own; wait for all (killing the rest when one fails or the time is
    up) and return rank 0's metrics, or raise `WorkerFailure` with their output."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics_file = Path(tmp) / "rank0.json"
        logs = [Path(tmp) / f"rank{rank}.log" for rank in range(world_size)]
        environment = {"MASTER_ADDR": MASTER_ADDR, "MASTER_PORT": str(free_port()),
                       "WORLD_SIZE": str(world_size), METRICS_FILE_ENV: str(metrics_file)}
        sys.stdout.flush()
        sys.stderr.flush()
        ranks = {}
        for rank in range(world_size):
            pid = os.fork()
            if pid == 0:
                _forked_rank(work, config, backend,
                             {**environment, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                             logs[rank])
            ranks[pid] = rank
        returncode = _wait_for_ranks(ranks, timeout_s)
        output = "".join(log.read_text(errors="replace") for log in logs if log.exists())
        if returncode == "timeout":
            output = f"timed out after {timeout_s} s\n{output}"
        sys.stderr.write(output)  # the workers' own log lines, into this job's log
        if returncode == 0 and metrics_file.exists():
            return json.loads(metrics_file.read_text())
        raise WorkerFailure(None if returncode == "timeout" else returncode, output)


def _forked_rank(work: Work, config: dict, backend: str, environment: dict,
                 log: Path) -> None:
    """A forked worker: its output to `log`, torchrun's environment, `_work`; never returns."""
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        # the launcher's sys.stdout and sys.stderr may not write to fds 1 and 2 (a test's capture)
        sys.stdout = sys.stderr = os.fdopen(fd, "w", buffering=1)
        os.environ.update(environment)
        logging.getLogger().handlers.clear()  # the launcher's handlers; _work sets the rank's
        os.environ["OMP_NUM_THREADS"] = "1"  # as torchrun sets it for several workers
        torch.set_num_threads(1)
        _work(work, config, backend)
        code = 0
    except BaseException:  # noqa: BLE001 - a fork must never unwind into the launcher's code
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait_for_ranks(ranks: dict[int, int], timeout_s: float) -> int | str:
    """Wait for every forked rank; the first non-zero exit code (the others are killed then),
    "timeout" when the time ran out (all killed), else 0."""
    deadline = time.monotonic() + timeout_s
    running, failed = dict(ranks), 0
    while running:
        for pid in list(running):
            if pid not in running:  # killed (and reaped) after a peer failed
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done:
                continue
            del running[pid]
            code = os.waitstatus_to_exitcode(status)
            if code != 0 and not failed:
                failed = code
                _kill(running)  # its peers would wait for it in their next collective
        if running and time.monotonic() > deadline:
            _kill(running)
            return "timeout"
        time.sleep(0.02)
    return failed


def _kill(running: dict[int, int]) -> None:
    for pid in list(running):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        del running[pid]


def _work(work: Work, config: dict, backend: str) -> None:
    rank, world_size, device = setup_from_env(backend=backend)
    configure_logging(prefix=f"rank {rank}: ")
    try:
        metrics = work(config, rank, world_size, device)
        if rank == 0:
            write_json_atomic(os.environ[METRICS_FILE_ENV], metrics)
    finally:
        cleanup()
