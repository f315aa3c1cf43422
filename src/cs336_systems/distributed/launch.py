"""Starting and stopping process groups: spawned workers for tests, torchrun for benchmarks.

`spawn(fn, world_size)` runs `fn(rank, world_size, *args)` in `world_size` fresh processes on
this machine, each already joined to a process group (gloo on CPU, or nccl with one GPU per
rank), and re-raises the first worker exception in the parent. It never hangs: collectives time
out after `timeout_s` (the process group's own timeout) and the whole run is killed after
`timeout_s` too.

`setup_from_env()` is for scripts started by `torchrun`, which sets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MASTER_ADDR = "127.0.0.1"
# The communication backends this package runs on: gloo (CPU) and nccl (one GPU per rank).
BACKENDS = ("gloo", "nccl")


def unavailable_reason(backend: str, world_size: int) -> str | None:
    """Why this machine cannot hold `world_size` ranks on `backend`, or None if it can."""
    if backend == "nccl":
        gpus = torch.cuda.device_count()
        if gpus < world_size:
            return f"nccl with {world_size} processes needs {world_size} GPUs; this machine has {gpus}"
    cores = os.cpu_count() or 1
    if backend == "gloo" and world_size > cores:
        return (f"gloo with {world_size} processes on {cores} CPU cores would time the "
                "oversubscription, not the collective")
    return None


def backend_for(device: str) -> str:
    """nccl for CUDA devices, gloo for the CPU; `auto` follows what this machine has."""
    if device == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


# how many ports `spawn` tries: one picked free can be taken before rank 0 listens on it
PORT_ATTEMPTS = 3


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (the OS picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((MASTER_ADDR, 0))
        return sock.getsockname()[1]


def require_initialized(who: str) -> tuple[int, int]:
    """(rank, world_size) of the default process group; a ValueError when there is none."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"{who} needs an initialized torch.distributed process group: call "
                         "dist.init_process_group (or run under launch.spawn / setup_from_env)")
    return dist.get_rank(), dist.get_world_size()


def _worker(rank: int, fn: Callable, world_size: int, backend: str, port: int, timeout_s: float,
            threads: int, args: tuple, errors) -> None:
    os.environ.update(MASTER_ADDR=MASTER_ADDR, MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    else:  # CPU ranks share the cores; oversubscribed intra-op threads only slow everyone down
        torch.set_num_threads(threads)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        fn(rank, world_size, *args)
    except BaseException:
        errors.put((time.time(), rank, traceback.format_exc()))
        raise  # without destroy_process_group, which can block on pending collectives; exit frees
    dist.destroy_process_group()


# How `spawn` starts its workers: fresh interpreters, or forks of the caller (gloo only: CUDA
# does not survive a fork once the caller has started it).
START_METHODS = ("spawn", "fork")


def spawn(fn: Callable, world_size: int, backend: str = "gloo", args: tuple = (),
          timeout_s: float = 120, start_method: str = "spawn",
          threads_per_rank: int | None = None) -> None:
    """Run `fn(rank, world_size, *args)` on `world_size` local processes joined in one group.

    With the "spawn" start method `fn` must be importable by name (a module-level function);
    "fork" starts each worker as a copy of this process, everything imported, in a fraction of
    a second, and works on gloo only. When a worker raises, the others are terminated and a RuntimeError carrying
    the traceback of the rank that failed *first* is raised here (its peers then fail too, with
    "connection closed" errors that hide the cause). A run still going after `timeout_s` seconds
    is terminated and raises TimeoutError. Every call uses a fresh port (another, up to
    PORT_ATTEMPTS, where the one picked was taken meanwhile). CPU (gloo) ranks take
    `threads_per_rank` intra-op threads each, by default an equal share of the machine's cores;
    a caller that shares the machine with other jobs passes its own share.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {', '.join(START_METHODS)}, got "
                         f"{start_method!r}")
    if start_method == "fork" and backend == "nccl":
        raise ValueError("nccl workers cannot be forked: CUDA does not survive a fork; use "
                         "start_method='spawn'")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"nccl with world_size {world_size} needs as many GPUs; "
                         f"found {torch.cuda.device_count()}")
    if threads_per_rank is None:
        threads_per_rank = max(1, (os.cpu_count() or 1) // world_size)
    elif threads_per_rank < 1:
        raise ValueError(f"threads_per_rank must be at least 1, got {threads_per_rank}")
    for attempt in range(PORT_ATTEMPTS):
        try:
            return _run(fn, world_size, backend, tuple(args), timeout_s, start_method,
                        threads_per_rank)
        except (RuntimeError, mp.ProcessRaisedException) as error:
            # the port was free when picked and taken before rank 0 listened on it: nothing
            # of `fn` has run yet (it runs after the group forms), so try another port
            if "EADDRINUSE" not in str(error) or attempt == PORT_ATTEMPTS - 1:
                raise


def _run(fn: Callable, world_size: int, backend: str, args: tuple, timeout_s: float,
         start_method: str, threads_per_rank: int) -> None:
    """One attempt of `spawn`, on a fresh port."""
    errors = mp.get_context(start_method).SimpleQueue()  # (time, rank, traceback) per failure
    context = mp.start_processes(
        _worker, args=(fn, world_size, backend, free_port(), timeout_s, threads_per_rank,
                       args, errors),
        nprocs=world_size, join=False, start_method=start_method)
    deadline = time.monotonic() + timeout_s
    try:
        # join() returns True once all workers exited cleanly and raises on the first failure.
        while not context.join(timeout=0.5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"distributed run of {fn.__name__} (world_size {world_size}) "
                                   f"did not finish within {timeout_s} s")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
        failures = []
        while not errors.empty():
            failures.append(errors.get())
        if not failures:  # killed without a Python exception (a signal, os._exit)
            raise
        _, rank, trace = min(failures)
        raise RuntimeError(f"rank {rank} of {world_size} failed first ({len(failures)} failed):"
                           f"\n{trace}") from error
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
            process.join()


def setup_from_env(timeout_s: float = 600, backend: str | None = None
                   ) -> tuple[int, int, torch.device]:
    """Join the process group described by torchrun's environment; returns (rank, world, device).

    By default nccl and cuda:LOCAL_RANK when CUDA is available, gloo and the CPU otherwise;
    `backend="gloo"` keeps the ranks on the CPU even on a GPU machine.
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
               if k not in os.environ]
    if missing:
        raise ValueError(f"setup_from_env needs the environment variables torchrun sets; "
                         f"missing: {', '.join(missing)}")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return rank, world_size, device


def cleanup() -> None:
    """Leave the process group, if one is initialized (safe to call twice)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
