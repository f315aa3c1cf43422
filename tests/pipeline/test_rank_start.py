"""How a distributed job's ranks start (pipeline/torchrun.py): forked from the launcher on gloo,
torchrun on nccl or when asked; either way one record, and a rank that fails or hangs becomes
that record's `error`, with the rank's own output, instead of a hung job."""

import json
import os
import time

import pytest
import torch
import torch.distributed as dist

from cs336_systems.pipeline import torchrun
from cs336_systems.sections.distributed import time_allreduce

# starts ranks of a process group: the full test command runs these, not `-m "not pipeline"`
pytestmark = pytest.mark.pipeline


def _record(path):
    return json.loads(path.read_text())


def _launch(tmp_path, work, timeout_s=60):
    out = tmp_path / "r.json"
    torchrun.launch_or_work("unused.module", "test", {"seed": 0}, str(out), work, 2, "gloo",
                            [], timeout_s=timeout_s)
    return _record(out)


def _sum_of_ranks(config, rank, world_size, device):
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    return {"sum": float(value), "rank": rank, "pid": os.getpid()}


def _threads(config, rank, world_size, device):
    return {"threads": torch.get_num_threads()}


def _rank_one_raises(config, rank, world_size, device):
    if rank == 1:
        raise RuntimeError("rank one gave up")
    dist.barrier()  # rank 0 would wait here for ever
    return {}


def _rank_one_hangs(config, rank, world_size, device):
    if rank == 1:
        time.sleep(600)
    return {}


def test_gloo_forks_and_nccl_takes_torchrun_unless_told(monkeypatch):
    monkeypatch.delenv(torchrun.RANKS_ENV, raising=False)
    assert torchrun.rank_start("gloo") == "fork"
    assert torchrun.rank_start("nccl") == "torchrun"
    monkeypatch.setenv(torchrun.RANKS_ENV, "torchrun")
    assert torchrun.rank_start("gloo") == "torchrun"
    monkeypatch.setenv(torchrun.RANKS_ENV, "fork")
    with pytest.raises(ValueError, match="CUDA does not survive a fork"):
        torchrun.rank_start("nccl")
    monkeypatch.setenv(torchrun.RANKS_ENV, "spawn")
    with pytest.raises(ValueError, match="allowed: fork, torchrun"):
        torchrun.rank_start("gloo")


def test_forked_ranks_join_one_group_and_rank_0_hands_back_its_metrics(tmp_path, monkeypatch):
    monkeypatch.delenv(torchrun.RANKS_ENV, raising=False)
    record = _launch(tmp_path, _sum_of_ranks)
    assert record["status"] == "ok", record.get("message")
    assert record["metrics"]["sum"] == 3.0 and record["metrics"]["rank"] == 0
    assert record["metrics"]["pid"] != os.getpid()  # a worker measured, not the launcher


def test_forked_ranks_take_one_thread_each_as_torchruns_workers_do(tmp_path, monkeypatch):
    """A job is allotted a core a rank; with a share of the whole machine a rank, a 1 MB gloo
    all-reduce took 9x as long on a 64-core host."""
    monkeypatch.delenv(torchrun.RANKS_ENV, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)  # a machine's share would be 4 threads a rank
    record = _launch(tmp_path, _threads)
    assert record["status"] == "ok", record.get("message")
    assert record["metrics"]["threads"] == 1


def test_a_failing_rank_is_the_records_error_and_its_peer_does_not_hang(tmp_path, monkeypatch):
    monkeypatch.delenv(torchrun.RANKS_ENV, raising=False)
    started = time.monotonic()
    record = _launch(tmp_path, _rank_one_raises)
    assert record["status"] == "error"
    assert "rank one gave up" in record["message"]
    assert time.monotonic() - started < 30


def test_a_hung_rank_is_killed_at_the_time_limit(tmp_path, monkeypatch):
    monkeypatch.delenv(torchrun.RANKS_ENV, raising=False)
    record = _launch(tmp_path, _rank_one_hangs, timeout_s=3)
    assert record["status"] == "error"
    assert "did not finish within 3 s" in record["message"]


def test_torchrun_start_still_records_the_same_job(tmp_path, monkeypatch):
    """The nccl path's launcher, exercised on gloo: the same job through torchrun."""
    records = {}
    for start in torchrun.RANK_STARTS:
        monkeypatch.setenv(torchrun.RANKS_ENV, start)
        out = tmp_path / f"{start}.json"
        time_allreduce.main(["--backend", "gloo", "--size-mb", "1", "--world-size", "2",
                             "--warmup-steps", "1", "--measure-steps", "2", "--output", str(out)])
        records[start] = _record(out)
    for start, record in records.items():
        assert record["status"] == "ok", (start, record.get("message"))
    assert records["fork"]["metrics"].keys() == records["torchrun"]["metrics"].keys()
