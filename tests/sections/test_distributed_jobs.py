"""The distributed experiments on CPUs (gloo, two ranks, the tiny model), end to end through
torchrun: the records they write carry what the distributed section reads."""

import json

import pytest

from cs336_systems.measure.collectives import PROFILE_STEPS
from cs336_systems.sections.distributed import check_ddp as ddp_check
from cs336_systems.sections.distributed import ddp_equivalence
from cs336_systems.sections.distributed import time_ddp as ddp
from cs336_systems.sections.distributed import (
    time_sharded_optimizer as sharded_optimizer,
)

# Each starts torchrun and its workers (seconds of process start-up): run with the pipeline's.
pytestmark = pytest.mark.pipeline

TINY = ["--size", "tiny", "--context-length", "16", "--batch-size", "4", "--world-size", "2",
        "--warmup-steps", "1", "--measure-steps", "2", "--device", "cpu"]


# --- the experiments, end to end on gloo ------------------------------------------------------

def _record(path):
    record = json.loads(path.read_text())
    assert record["status"] == "ok", record.get("message")
    return record["metrics"]


def test_ddp_records_its_collective_time_and_timeline(tmp_path):
    out = tmp_path / "overlap.json"
    ddp.main(["--variant", "overlap", *TINY, "--output", str(out),
              "--trace", str(tmp_path / "overlap.trace.json.gz")])
    m = _record(out)
    assert m["collective_busy_ms_per_step"] > 0
    assert 0 <= m["collective_hidden_fraction"] <= 1
    assert m["profile_steps"] == PROFILE_STEPS
    assert m["trace_file"] == "overlap.trace.json.gz"
    assert m["timeline"]["collective"] and m["timeline"]["compute"]
    assert {"forward", "backward", "optimizer"} <= set(m["timeline"]["phases"])


def test_sharded_optimizer_records_every_rank(tmp_path):
    out = tmp_path / "sharded.json"
    sharded_optimizer.main(["--sharded", *TINY, "--output", str(out)])
    m = _record(out)
    assert len(m["memory_per_rank"]) == 2
    for key in ("peak_gib_init", "peak_gib_before_step", "peak_gib_step"):
        assert key in m and all(key in r for r in m["memory_per_rank"])  # None on a CPU
    states = [r["optimizer_state_gib"] for r in m["memory_per_rank"]]
    assert sum(states) == pytest.approx(2 * m["parameter_gib"], rel=1e-3)  # AdamW's m and v


def test_ddp_check_matches_single_process_training(tmp_path):
    out = tmp_path / "check.json"
    ddp_check.main(["--output", str(out)])
    m = _record(out)
    assert [c["variant"] for c in m["checks"]] == list(ddp_equivalence.DDP_CHECK_VARIANTS)
    for c in m["checks"]:
        assert c["allclose"], c
        assert c["replicas_max_abs_diff"] == 0.0
        assert c["moved_max_abs"] > 100 * c["max_abs_diff"]
