"""scripts/migrate_results.py: an older results folder's keys and run names become the current
ones, in place, its measurements untouched; the committed reference run needs nothing."""

import importlib.util
import json

from support.checkout import ROOT

spec = importlib.util.spec_from_file_location("migrate_results",
                                              ROOT / "scripts" / "migrate_results.py")
migrate_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(migrate_results)


def _write(path, record):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def test_an_old_folder_is_renamed_in_place_and_a_second_run_changes_nothing(tmp_path):
    flash = _write(tmp_path / "flash" / "eager_seq16_d16_bf16.json", {
        "section": "flash", "status": "ok", "metrics": {"forward_ms": 1.5},
        "config": {"attention": "eager", "seq": 16, "d": 16, "dtype": "bf16", "causal": True}})
    attention = _write(tmp_path / "attention" / "eager_d16_seq32_none.json", {
        "section": "attention", "status": "ok", "metrics": {},
        "config": {"variant": "eager", "warmup": 5, "iterations": 100}})
    _write(tmp_path / "training" / "small" / "ours-fa2-fused.json", {
        "section": "training", "status": "ok", "metrics": {"step_ms_median": 12.0},
        "config": {"run": "ours-fa2-fused", "size": "small"}})
    (tmp_path / "logs" / "training").mkdir(parents=True)
    (tmp_path / "logs" / "training" / "ours-fa2-fused.log").write_text("a log\n")
    board = _write(tmp_path / "leaderboard" / "proxy" / "ours-but-cudnn.json", {
        "section": "leaderboard", "status": "ok", "metrics": {},
        "config": {"variant": "ours-but-cudnn", "shape": "8b"}})
    current = _write(tmp_path / "benchmark" / "r.json", {
        "section": "benchmark", "status": "ok", "metrics": {},
        "config": {"size": "small", "warmup_steps": 1, "measure_steps": 2}})
    before = current.read_text()

    assert migrate_results.migrate(tmp_path) == (4, 3)

    assert list(json.loads(flash.read_text())["config"]) == [
        "attention", "seq", "d", "precision", "causal"]  # renamed where it stood
    assert json.loads(flash.read_text())["metrics"] == {"forward_ms": 1.5}
    assert json.loads(attention.read_text())["config"] == {
        "variant": "eager", "warmup_steps": 5, "measure_steps": 100}
    run = tmp_path / "training" / "small" / "ours-flash-triton-fused.json"
    assert json.loads(run.read_text())["config"]["run"] == "ours-flash-triton-fused"
    assert (tmp_path / "logs" / "training" / "ours-flash-triton-fused.log").is_file()
    assert not board.exists()
    variant = tmp_path / "leaderboard" / "proxy" / "ours-but-sdpa-cudnn.json"
    assert json.loads(variant.read_text())["config"]["variant"] == "ours-but-sdpa-cudnn"
    assert current.read_text() == before
    assert migrate_results.migrate(tmp_path) == (0, 0)


def test_the_committed_reference_run_uses_the_current_names():
    stale = []
    for path in (ROOT / "docs" / "reference-run" / "results").rglob("*.json"):
        record = json.loads(path.read_text())
        if (isinstance(record, dict) and "status" in record
                and migrate_results.migrate_record(record)) \
                or migrate_results.renamed(path.name) != path.name:
            stale.append(str(path.relative_to(ROOT)))
    assert not stale, stale
