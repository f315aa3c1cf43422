"""The flash section's report math, on the reference GPU run's records and on synthetic ones:
every fact is recomputed here from the JSON records, independently of the report module."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd
import pytest

from cs336_systems.report.facts import jsonable, read_facts, write_facts
from cs336_systems.report.render import fmt, fmt_ratio
from cs336_systems.sections.flash import report as flash
from support.checkout import ROOT, project_yaml
from support.sections import section_text

REFERENCE = ROOT / "docs/reference-run/results/quick"
# The assignment's matrix, as the flash_tables rule passes it: the config's defaults.
ASSIGNMENT = project_yaml()["defaults"]["flash"]
FLASH_RECORDS = sorted(str(p) for p in (REFERENCE / "flash").glob("*.json"))
BOARD_RECORDS = sorted(str(p) for p in (REFERENCE / "flash_leaderboard").glob("*.json"))
CPU_ENV = {"device": "cpu", "gpu": None, "torch": "2.x", "triton": None, "git": "abc"}


def _outputs(tmp_path: Path) -> dict[str, str]:
    return {"table": str(tmp_path / "tables/flash.csv"),
            "leaderboard_table": str(tmp_path / "tables/flash_leaderboard.csv"),
            "speed_table": str(tmp_path / "tables/flash_speed.csv"),
            "kernels_table": str(tmp_path / "tables/flash_kernels.csv"),
            "latency_figure": str(tmp_path / "figures/flash_latency_vs_seq.png"),
            "speedup_figure": str(tmp_path / "figures/flash_speedup.png")}


def _build(tmp_path: Path, records: list[str], board: list[str],
           assignment: dict = ASSIGNMENT, speed: list[str] = (), kernels: list[str] = ()
           ) -> dict:
    """build(), then its facts through JSON as the pipeline stores them."""
    facts = flash.build({"records": records, "leaderboard": board, "speed": list(speed),
                         "kernels": list(kernels)},
                        {"assignment": assignment}, _outputs(tmp_path))
    write_facts(tmp_path / "flash.json", facts)
    return read_facts(tmp_path / "flash.json")


def _records(paths: list[str]) -> list[dict]:
    return [json.loads(Path(p).read_text()) for p in paths]


def _times(records: list[dict], impl: str, metric: str) -> dict[tuple, float]:
    """(d, dtype, seq) -> metric of `impl`, for the records that have it."""
    return {(r["config"]["d"], r["config"]["precision"], r["config"]["seq"]): r["metrics"][metric]
            for r in records if r["config"]["attention"] == impl and metric in r["metrics"]}


def _ratios(records: list[dict], over: str, metric: str = "forward_backward_ms") -> dict:
    ours, theirs = _times(records, "flash-triton", metric), _times(records, over, metric)
    return {shape: theirs[shape] / ours[shape] for shape in ours.keys() & theirs.keys()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[dict, Path]:
    assert len(FLASH_RECORDS) == 48 and len(BOARD_RECORDS) == 2
    tmp_path = tmp_path_factory.mktemp("flash")
    return _build(tmp_path, FLASH_RECORDS, BOARD_RECORDS), tmp_path


@pytest.mark.parametrize("over", ["eager", "sdpa"])
def test_speedup_summary_matches_per_shape_ratios(reference, over):
    facts, _ = reference
    ratios = _ratios(_records(FLASH_RECORDS), over)
    s = facts["speedup_over"][over]
    assert s["shapes"] == len(ratios) == 16
    assert s["median"] == pytest.approx(statistics.median(ratios.values()), rel=1e-12)
    lo, hi = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
    assert s["min"] == pytest.approx(ratios[lo]) and s["max"] == pytest.approx(ratios[hi])
    assert (s["min_at"]["d"], s["min_at"]["precision"], s["min_at"]["seq"]) == lo
    assert (s["max_at"]["d"], s["max_at"]["precision"], s["max_at"]["seq"]) == hi
    assert s["faster_shapes"] == sum(r > 1 for r in ratios.values())
    median = statistics.median(ratios.values())
    assert s["median_verdict"]["word"] == ("faster" if median > 1 else "slower")
    assert s["median_verdict"]["factor"] == pytest.approx(max(median, 1 / median))


def test_pass_medians_match_records(reference):
    facts, _ = reference
    records = _records(FLASH_RECORDS)
    for over in ("eager", "sdpa"):
        for p in ("forward", "backward", "forward_backward"):
            expected = statistics.median(_ratios(records, over, f"{p}_ms").values())
            assert facts["pass_speedups"][over]["medians"][p] == pytest.approx(expected)


def test_counts_and_run_facts(reference):
    facts, _ = reference
    records = _records(FLASH_RECORDS)
    assert facts["configurations"] == 48 and facts["shapes"] == 16
    assert facts["batch_size"] == 1 and facts["causal"] is True and facts["do_bench"] is True
    assert facts["flash_interpreted"] is False
    assert facts["implementations"] == ["Triton FA2", "torch SDPA", "plain PyTorch"]
    fb = [r["metrics"]["forward_backward_ms"] for r in records]
    assert facts["timed_cells"] == facts["overhead"]["of"] == len(fb)
    # overhead-bound, recomputed from the records: a longer sequence of the same series with
    # at least 4x the FLOPs (seq squared, at batch 1) in at most 1.5x the time
    series = {}
    for r in records:
        c = r["config"]
        series.setdefault((c["attention"], c["d"], c["precision"]), []).append(
            (c["seq"], r["metrics"]["forward_backward_ms"]))
    bound = sum(any(s2 ** 2 >= 4 * s ** 2 and t2 <= 1.5 * t for s2, t2 in cells)
                for cells in series.values() for s, t in cells)
    assert facts["overhead"]["count"] == bound > 0
    assert facts["oom"] == [] and facts["skipped"]["count"] == facts["errors"]["count"] == 0
    assert facts["env"]["gpu"] == sorted({r["env"]["gpu"] for r in records})
    assert len(facts["env"]["gpu"]) == 1  # the whole sweep on one kind of GPU


def test_leaderboard_facts_match_the_two_records(reference):
    facts, _ = reference
    by_impl = {r["config"]["attention"]: r["metrics"]["forward_backward_ms"]
               for r in _records(BOARD_RECORDS)}
    board = facts["leaderboard"]
    assert board["triton_ms"] == by_impl["flash-triton"] and board["sdpa_ms"] == by_impl["sdpa"]
    ratio = by_impl["sdpa"] / by_impl["flash-triton"]
    assert board["vs_sdpa"]["ratio"] == pytest.approx(ratio)
    assert board["vs_sdpa"]["word"] == ("faster" if ratio > 1 else "slower")
    assert board["vs_sdpa"]["within_spread"] is None  # medians only: no significance claimed
    assert board["is_assignment_shape"] is True
    assert board["shape"] == {"batch_size": 16, "seq": 16384, "d": 64, "precision": "bf16",
                              "causal": True, "compile": True}
    assert board["class_best_ms"] == 5.364
    assert board["vs_class_best"]["ratio"] == pytest.approx(5.364 / by_impl["flash-triton"])
    assert board["not_ok"] == []


def test_coverage_of_the_reference_run(reference):
    facts, _ = reference
    cov = facts["coverage"]
    assert set(cov) == {"weighted_sum", "flash_forward", "flash_backward",
                        "flash_benchmarking", "leaderboard (2025)"}
    for key in ("weighted_sum", "flash_forward", "flash_backward"):
        # answered by code and tests, and the note says so: no record claims them
        assert cov[key]["status"] == "answered" and cov[key]["anchor"] == key
        assert "tests/kernels/test_flash_kernels.py" in cov[key]["note"]
        assert "not by a job of this pipeline" in cov[key]["note"]
    # the quick preset runs part of the assignment's sweep (config.yaml's defaults)
    records = _records(FLASH_RECORDS)
    absent = {key: [v for v in ASSIGNMENT[plural] if v not in {r["config"][key] for r in records}]
              for key, plural in (("seq", "seq_lengths"), ("d", "d_heads"))}
    assert absent["seq"] and absent["d"]
    assert cov["flash_benchmarking"]["status"] == "partly answered"
    for key, values in absent.items():
        assert f"{key} {', '.join(map(str, values))}" in cov["flash_benchmarking"]["note"]
    assert "precision" not in cov["flash_benchmarking"]["note"]
    assert cov["leaderboard (2025)"]["status"] == "answered"


def test_tables_and_figures_are_written(reference):
    facts, tmp_path = reference
    outputs = _outputs(tmp_path)
    table = pd.read_csv(outputs["table"])
    assert len(table) == 48 and set(table["attention"]) == {"flash-triton", "sdpa", "eager"}
    assert len(pd.read_csv(outputs["leaderboard_table"])) == 2
    for key in ("latency_figure", "speedup_figure"):
        assert Path(outputs[key]).stat().st_size > 0 and facts[key] == outputs[key]
    assert json.dumps(jsonable(facts), allow_nan=False)


def test_template_renders_the_facts(reference):
    facts, tmp_path = reference
    text = section_text("flash", facts, link_base=tmp_path)
    assert text.startswith("## 4 FlashAttention-2")
    for anchor in ("weighted_sum", "flash_forward", "flash_backward", "flash_benchmarking",
                   "leaderboard_2025"):
        assert f'<a id="{anchor}"></a>' in text
    eager, sdpa = facts["speedup_over"]["eager"], facts["speedup_over"]["sdpa"]
    board = facts["leaderboard"]
    for number in (fmt_ratio(eager["median"]), fmt_ratio(eager["min"]), fmt_ratio(eager["max"]),
                   fmt_ratio(sdpa["median"]), fmt(board["triton_ms"], 3),
                   fmt(board["sdpa_ms"], 3), fmt_ratio(board["vs_sdpa"]["factor"]),
                   fmt_ratio(board["vs_class_best"]["factor"]), "5.364"):
        assert number in text, number
    assert f"{fmt_ratio(board['vs_sdpa']['factor'])} {board['vs_sdpa']['word']} than" in text
    assert "quoted from" in text and "no spread recorded" in text
    if facts["overhead"]["count"]:
        words = " ".join(text.split())  # the template wraps its lines
        assert f"{facts['overhead']['count']} of 48 cells (marked `*`) are overhead-bound" \
            in words
        assert facts["latency"]["markdown"].count(" *") == facts["overhead"]["count"]
    assert "(figures/flash_latency_vs_seq.png)" in text and "(figures/flash_speedup.png)" in text
    assert "| plain PyTorch ms" in facts["latency"]["markdown"] and facts["latency"]["markdown"] in text


# --- synthetic records -------------------------------------------------------------------------

def _write(tmp_path: Path, impl: str, seq: int, status: str = "ok", metrics=None,
           message: str = "", d: int = 16, dtype: str = "fp32", folder: str = "flash",
           **config) -> str:
    record = {"section": "flash", "status": status, "metrics": metrics or {}, "env": CPU_ENV,
              "config": {"attention": impl, "seq": seq, "d": d, "precision": dtype, "batch_size": 1,
                         "causal": True, "compile": False, "seed": 0, **config}}
    if message:
        record["message"] = message
    path = tmp_path / folder / f"{impl}_seq{seq}_d{d}_{dtype}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return str(path)


def _timed(fwd: float, bwd: float) -> dict:
    return {"forward_ms": fwd, "backward_ms": bwd, "forward_backward_ms": fwd + bwd}


SKIP_REASON = "Triton's CPU interpreter cannot run bf16 tl.dot"


def test_skipped_and_oom_configurations(tmp_path):
    records = [
        _write(tmp_path, "flash-triton", 16, metrics=_timed(1.0, 2.0)),
        _write(tmp_path, "eager", 16, metrics=_timed(2.0, 4.0)),
        _write(tmp_path, "flash-triton", 32, metrics=_timed(1.0, 1.0)),
        _write(tmp_path, "eager", 32, metrics={"forward_ms": 3.0, "backward_status": "oom",
                                               "forward_backward_status": "oom"}),
        _write(tmp_path, "eager", 64, status="oom", message="CUDA out of memory"),
        _write(tmp_path, "flash-triton", 16, dtype="bf16", status="skipped",
               message=SKIP_REASON),
        _write(tmp_path, "sdpa", 16, status="error",
               message="Traceback (most recent call last):\n  ...\nZeroDivisionError: boom"),
    ]
    board = [_write(tmp_path, "flash-triton", 32, folder="board", status="skipped",
                    message=SKIP_REASON, compile=True),
             _write(tmp_path, "sdpa", 32, folder="board", compile=True,
                    metrics={"forward_ms": 1.5, "backward_status": "oom",
                             "forward_backward_status": "oom"})]
    facts = _build(tmp_path, records, board)

    cov = facts["coverage"]["flash_benchmarking"]
    assert cov["status"] == "partly answered"
    assert "1 of 7 configurations skipped" in cov["note"] and SKIP_REASON in cov["note"]
    assert "1 of 7 configurations error" in cov["note"]
    # one entry skipped, one with a forward time and its other passes out of memory
    board_cov = facts["coverage"]["leaderboard (2025)"]
    assert board_cov["status"] == "partly answered"
    assert "not the assignment's case" in board_cov["note"]
    assert f"1 of 2 configurations skipped ({SKIP_REASON})" in board_cov["note"]
    assert facts["skipped"] == {"count": 1, "reasons": [SKIP_REASON]}
    assert facts["errors"] == {"count": 1, "reasons": ["ZeroDivisionError: boom"]}
    # eager d 16 fp32 ran out of memory from seq 32 (two passes there, the whole run at 64)
    assert facts["oom"] == [{"attention": "eager", "label": "plain PyTorch", "d": 16,
                             "precision": "fp32",
                             "from_seq": 32, "configurations": 2,
                             "passes": ["forward", "backward", "forward_backward"]}]
    # forward+backward exists for both at seq 16 only: 6 / 3; forward at 16 and 32: 2/1, 3/1
    assert facts["speedup_over"]["eager"]["shapes"] == 1
    assert facts["speedup_over"]["eager"]["median"] == pytest.approx(2.0)
    assert facts["pass_speedups"]["eager"]["medians"]["forward"] == pytest.approx(2.5)
    assert facts["speedup_over"]["sdpa"] is None
    assert facts["do_bench"] is False and facts["flash_interpreted"] is True
    board_facts = facts["leaderboard"]
    assert board_facts["triton_ms"] is None and board_facts["vs_class_best"] is None
    assert board_facts["is_assignment_shape"] is False
    assert board_facts["not_ok"] == [{"attention": "flash-triton", "label": "Triton FA2",
                                      "status": "skipped", "reason": SKIP_REASON}]

    text = section_text("flash", facts, link_base=tmp_path)
    assert f"1 of 7 configurations skipped:\n  {SKIP_REASON}." in text
    assert "wall-clock medians" in text and "do_bench` medians" not in text
    assert "Triton's interpreter" in text
    assert "plain PyTorch (d 16, fp32) from seq 32\n  (forward, backward, forward+backward)" in text
    assert "not compared with the class's entries" in text
    assert f"Triton FA2: skipped ({SKIP_REASON})." in text
    # a leaderboard pass that ran out of memory shows oom, as in the main table
    sdpa_row = next(line for line in board_facts["table"].splitlines() if "torch SDPA" in line)
    assert [c.strip() for c in sdpa_row.strip("|").split("|")] == [
        "torch SDPA", "ok", "1.500", "oom", "oom", ""]


def test_the_assignment_matrix_comes_from_the_options(tmp_path):
    """What the preset leaves out is measured against options["assignment"], nothing typed
    into the module: a matrix the records cover leaves nothing out."""
    records = [_write(tmp_path, impl, 16, metrics=_timed(1.0, 2.0))
               for impl in ("flash-triton", "eager")]
    board = [_write(tmp_path, "flash-triton", 16, folder="board", compile=True,
                    metrics=_timed(1.0, 2.0))]
    matrix = {**ASSIGNMENT, "attention": ["flash-triton", "eager"], "seq_lengths": [16],
              "d_heads": [16], "precisions": ["fp32"],
              "leaderboard": {"attention": ["flash-triton"], "batch_size": 1, "seq": 16,
                              "d": 16, "precision": "fp32"}}
    facts = _build(tmp_path, records, board, matrix)
    assert facts["coverage"]["flash_benchmarking"] == {
        "status": "answered", "note": "", "anchor": "flash_benchmarking"}
    assert facts["coverage"]["leaderboard (2025)"]["status"] == "answered"
    assert facts["leaderboard"]["is_assignment_shape"] is True
    assert facts["leaderboard"]["assignment_shape"] == {"batch_size": 1, "seq": 16, "d": 16,
                                                        "precision": "fp32"}
    # against the config's own matrix the same records leave most of it out
    facts = _build(tmp_path, records, board)
    note = facts["coverage"]["flash_benchmarking"]["note"]
    assert "seq " + ", ".join(map(str, ASSIGNMENT["seq_lengths"])) in note
    assert "no torch SDPA rows" in note
    assert facts["leaderboard"]["is_assignment_shape"] is False
    assert "no torch SDPA entry" in facts["coverage"]["leaderboard (2025)"]["note"]


def test_everything_skipped(tmp_path):
    records = [_write(tmp_path, "flash-triton", 16, status="skipped", message=SKIP_REASON),
               _write(tmp_path, "eager", 16, status="skipped", message="no CUDA device")]
    facts = _build(tmp_path, records, [])
    cov = facts["coverage"]["flash_benchmarking"]
    assert cov["status"] == "skipped"
    assert cov["note"] == "; ".join(sorted([SKIP_REASON, "no CUDA device"]))
    assert facts["coverage"]["leaderboard (2025)"]["status"] == "skipped"
    assert facts["speedup_over"] == {"eager": None, "sdpa": None}
    assert facts["timed_cells"] == 0 and facts["overhead"]["count"] == 0
    text = section_text("flash", facts, link_base=tmp_path)
    assert "2 of 2 configurations skipped" in text and "no leaderboard records" in text


def test_a_time_flat_in_the_problems_size_is_overhead_bound_and_left_out_of_the_busy_ratios(
        tmp_path):
    """seq 16 -> 32 is 4x the FLOPs: a time that grows by at most 1.5x marks the shorter cell
    overhead-bound, and the busy speed-ups leave that shape out; times that grow with the
    work mark nothing."""
    def sweep(folder, triton_times, eager_times):
        return [_write(tmp_path, impl, seq, metrics=_timed(t / 2, t / 2), folder=folder)
                for impl, times in (("flash-triton", triton_times), ("eager", eager_times))
                for seq, t in zip((16, 32, 64), times)]

    facts = _build(tmp_path / "flat", sweep("flat", (1.0, 1.2, 5.0), (2.0, 8.0, 32.0)), [])
    assert facts["overhead"]["count"] == 1  # Triton FA2 at 16: 1.2 ms at 32 is flat
    busy, every = facts["speedup_busy"]["eager"], facts["speedup_over"]["eager"]
    assert every["shapes"] == 3 and busy["shapes"] == 2
    assert busy["min_at"]["seq"] != 16 and busy["max_at"]["seq"] != 16
    text = " ".join(section_text("flash", facts, link_base=tmp_path).split())
    assert "1 of 6 cells (marked `*`) are overhead-bound" in text
    assert "(2 shapes), the median speed-up over plain PyTorch is" in text
    growing = _build(tmp_path / "growing", sweep("growing", (1.0, 4.0, 16.0),
                                                 (2.0, 8.0, 32.0)), [])
    assert growing["overhead"]["count"] == 0
    assert growing["speedup_busy"]["eager"]["shapes"] == 3


def test_the_leaderboard_names_the_backend_sdpa_chose_where_its_record_does(tmp_path):
    def board(**sdpa_metrics):
        return [_write(tmp_path, impl, 16, folder="board", compile=True,
                       metrics={**_timed(1.0, 2.0), **(sdpa_metrics if impl == "sdpa" else {})})
                for impl in ("flash-triton", "sdpa")]

    def words(facts):
        return " ".join(section_text("flash", facts, link_base=tmp_path).split())

    facts = _build(tmp_path, [], board(sdpa_backend="CUDNN_ATTENTION"))
    assert facts["leaderboard"]["sdpa_backend"] == "cuDNN"
    assert "torch SDPA in the same run (its default dispatch, which chose the cuDNN backend)" \
        in words(facts)
    facts = _build(tmp_path, [], board())  # a record from before the field
    assert facts["leaderboard"]["sdpa_backend"] is None
    assert "the record does not name the backend it chose" in words(facts)


def test_an_sdpa_record_names_the_backend_its_dispatch_chose(tmp_path):
    from cs336_systems.sections.flash import time_flash
    out = tmp_path / "r.json"
    time_flash.main(["--attention", "sdpa", "--seq", "16", "--d", "8", "--precision", "fp32",
                     "--device", "cpu", "--output", str(out)])
    record = json.loads(out.read_text())
    assert record["status"] == "ok"
    assert record["metrics"]["sdpa_backend"] in flash.SDPA_BACKENDS


def test_the_assignment_sweep_shows_speed_ups_per_sequence_and_links_its_csv(tmp_path):
    """240 records (80 shapes) are too many rows for the text: our forward+backward speed-up
    over each reference per (d, dtype) and sequence, each cell the ratio of two records."""
    folder = ROOT / "docs/reference-run/results/assignment/flash"
    records = sorted(str(p) for p in folder.glob("*.json"))
    facts = _build(tmp_path, records, [])
    latency = facts["latency"]
    assert not latency["whole"] and latency["rows"] == 80
    lines = [line for line in latency["markdown"].splitlines() if line.startswith("| ")]
    assert len(lines) == 1 + 2 * 4 * 2  # the header, then reference x d x dtype

    def fwd_bwd(impl):
        metrics = json.loads((folder / f"{impl}_seq16384_d64_bf16.json").read_text())["metrics"]
        return metrics["forward_backward_ms"]
    row = next(cells for line in lines
               if (cells := [c.strip() for c in line.split("|")[1:-1]])[:3]
               == ["64", "bf16", "torch SDPA"])[3:]
    cells = row
    assert cells[7].rstrip(" *") == fmt_ratio(fwd_bwd("sdpa") / fwd_bwd("flash-triton"))
