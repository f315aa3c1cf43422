"""launch.py: ports, worker failures and hangs surface in the parent, torchrun-style setup."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch
import torch.distributed as dist

from cs336_systems.distributed import cleanup, free_port, setup_from_env, spawn
from support.distributed import run_on_ranks, save_result

# starts ranks of a process group: the full test command runs these, not `-m "not pipeline"`
pytestmark = pytest.mark.pipeline


def _all_reduce_worker(rank: int, world_size: int, out_dir: str) -> None:
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x)
    save_result(out_dir, rank, (dist.get_rank(), dist.get_world_size(), x))


def _failing_worker(rank: int, world_size: int) -> None:
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.barrier()  # rank 0 would wait here forever without the failure handling


def _threads_worker(rank: int, world_size: int, out_dir: str) -> None:
    save_result(out_dir, rank, torch.get_num_threads())


def _hanging_worker(rank: int, world_size: int) -> None:
    time.sleep(600)


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_spawn_runs_every_rank_in_one_group(tmp_path):
    for rank, (got_rank, world_size, x) in enumerate(run_on_ranks(_all_reduce_worker, tmp_path)):
        assert (got_rank, world_size) == (rank, 2)
        assert torch.equal(x, torch.full((3,), 3.0))


def test_cpu_ranks_take_the_threads_they_are_given(tmp_path):
    spawn(_threads_worker, 2, args=(str(tmp_path),), threads_per_rank=3)
    assert [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)] == [3, 3]
    default = max(1, (os.cpu_count() or 1) // 2)
    spawn(_threads_worker, 2, args=(str(tmp_path),))
    assert [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)] == [default, default]


def test_spawn_takes_another_port_when_its_first_was_taken(tmp_path, monkeypatch):
    """A port picked free can be taken before rank 0 listens on it (a full test run once met
    EADDRINUSE so): spawn tries another."""
    from cs336_systems.distributed import launch

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = [taken.getsockname()[1]]
        picked = launch.free_port
        monkeypatch.setattr(launch, "free_port", lambda: ports.pop() if ports else picked())
        spawn(_threads_worker, 2, args=(str(tmp_path),), threads_per_rank=1, timeout_s=60)
    assert not ports  # the taken one was tried first
    assert [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)] == [1, 1]


def test_spawn_reraises_a_worker_exception():
    with pytest.raises(Exception, match="rank 1 fails on purpose"):
        spawn(_failing_worker, 2, timeout_s=60)


def test_spawn_times_out_instead_of_hanging():
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        spawn(_hanging_worker, 2, timeout_s=4)
    assert time.monotonic() - start < 30


def test_spawn_rejects_bad_arguments():
    with pytest.raises(ValueError, match="world_size"):
        spawn(_hanging_worker, 0)
    with pytest.raises(ValueError, match="backend"):
        spawn(_hanging_worker, 1, backend="mpi")
    with pytest.raises(ValueError, match="threads_per_rank"):
        spawn(_hanging_worker, 1, threads_per_rank=0)
    with pytest.raises(ValueError, match="start_method must be one of spawn, fork"):
        spawn(_hanging_worker, 1, start_method="forkserver")
    with pytest.raises(ValueError, match="CUDA does not survive a fork"):
        spawn(_hanging_worker, 1, backend="nccl", start_method="fork")


def test_setup_from_env_joins_torchruns_group(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="RANK"):
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(name, raising=False)
        setup_from_env()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    try:
        assert setup_from_env(timeout_s=30) == (0, 1, torch.device("cpu"))
        assert dist.get_backend() == "gloo"
    finally:
        cleanup()
    assert not dist.is_initialized()
    cleanup()  # a second call is harmless
