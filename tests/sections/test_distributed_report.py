"""The distributed section's report math, on the reference run's GPU records (2x H200).

Every expected value is computed here from the JSON records themselves, not from the tables
the section builds, so a wrong formula in the section fails a test.
"""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cs336_systems.distributed.variants import DDP_VARIANTS
from cs336_systems.pipeline.records import make_record
from cs336_systems.records import write_json_atomic
from cs336_systems.report.coverage import PROBLEM_KEYS
from cs336_systems.report.facts import jsonable
from cs336_systems.report.render import fmt_ratio
from cs336_systems.sections.distributed.allreduce_table import fit_latency_bandwidth
from cs336_systems.sections.distributed.report import build
from support.checkout import ROOT, project_yaml
from support.sections import section_text

REFERENCE = ROOT / "docs/reference-run/results/quick"
# The assignment's matrix, as the distributed_tables rule passes it: the config's defaults.
ASSIGNMENT = project_yaml()["defaults"]["distributed"]
OUTPUTS = {"allreduce_table": "tables/allreduce.csv", "ddp_table": "tables/ddp.csv",
           "sharded_table": "tables/sharded_optimizer.csv",
           "accounting_table": "tables/communication_accounting.csv",
           "allreduce_figure": "figures/allreduce_bandwidth.png",
           "ddp_figure": "figures/ddp_step_time.png",
           "overlap_figure": "figures/ddp_overlap.png"}
DISTRIBUTED_PROBLEMS = {
    "distributed_communication_single_node", "naive_ddp", "naive_ddp_benchmarking",
    "minimal_ddp_flat_benchmarking", "ddp_overlap_individual_parameters",
    "ddp_overlap_individual_parameters_benchmarking", "ddp_overlap_bucketed",
    "ddp_bucketed_benchmarking", "communication_accounting", "optimizer_state_sharding",
    "optimizer_state_sharding_accounting"}


def _records(root: Path) -> dict[str, list[str]]:
    return {"allreduce": sorted(str(p) for p in (root / "allreduce").glob("*.json")),
            "ddp": sorted(str(p) for p in (root / "ddp").glob("*/*.json")),
            "sharded": sorted(str(p) for p in (root / "sharded_optimizer").glob("*.json")),
            "accounting": [str(root / "distributed/communication_accounting.json")]}


def _build(records: dict, folder: Path, assignment: dict = ASSIGNMENT) -> tuple[dict, dict]:
    outputs = {k: str(folder / v) for k, v in OUTPUTS.items()}
    facts = build(records, {"assignment": assignment}, outputs)
    # what the pipeline does: write_facts, then the template reads the JSON back
    return json.loads(json.dumps(jsonable(facts), allow_nan=False)), outputs


def _metrics(path: Path) -> dict:
    return json.loads(path.read_text())["metrics"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("distributed")
    facts, outputs = _build(_records(REFERENCE), folder)
    return facts, outputs, folder


@pytest.fixture(scope="module")
def facts(built):
    return built[0]


@pytest.fixture(scope="module")
def markdown(built):
    facts, _, folder = built
    return section_text("distributed", facts, link_base=folder)


def ddp(name: str) -> dict:
    return _metrics(REFERENCE / "ddp" / "xl" / f"{name}.json")


def sharded(name: str) -> dict:
    return _metrics(REFERENCE / "sharded_optimizer" / f"{name}.json")


def allreduce_rows(backend: str, world_size: int = 2) -> pd.DataFrame:
    rows = []
    for path in sorted((REFERENCE / "allreduce").glob(f"{backend}_*mb_world{world_size}.json")):
        m = _metrics(path)
        rows.append({"size_bytes": m["size_bytes"], "allreduce_ms_median": m["allreduce_ms_median"],
                     "busbw_gbps": m["busbw_gbps"]})
    return pd.DataFrame(rows).sort_values("size_bytes", ignore_index=True)


# --- outputs -------------------------------------------------------------------------------

def test_tables_and_figures_are_written_one_row_per_record(built):
    _, outputs, _ = built
    records = _records(REFERENCE)
    for name, key in (("allreduce_table", "allreduce"), ("ddp_table", "ddp"),
                      ("sharded_table", "sharded"), ("accounting_table", "accounting")):
        assert len(pd.read_csv(outputs[name])) == len(records[key])
    for name in ("allreduce_figure", "ddp_figure", "overlap_figure"):
        assert Path(outputs[name]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_facts_are_strict_json_and_claim_the_section_problems(facts):
    json.dumps(facts, allow_nan=False)
    assert set(facts["coverage"]) == DISTRIBUTED_PROBLEMS
    assert DISTRIBUTED_PROBLEMS <= set(PROBLEM_KEYS)
    assert facts["env"]["gpu"] == ["NVIDIA H200"]


# --- all-reduce ----------------------------------------------------------------------------

def test_fit_recovers_latency_and_bandwidth_exactly_from_synthetic_data():
    o_ms, w_gbps = 0.045, 123.0
    size_bytes = np.array([1e6, 1e7, 1e8, 1e9])
    t = o_ms + size_bytes / (w_gbps * 1e9) * 1e3
    fit = fit_latency_bandwidth(pd.DataFrame({"size_bytes": size_bytes,
                                              "allreduce_ms_median": t}))
    assert fit[0] == pytest.approx(o_ms, rel=1e-9)
    assert fit[1] == pytest.approx(w_gbps, rel=1e-9)


def test_fit_says_when_it_cannot_resolve_o_or_fit_at_all():
    size_bytes = np.array([1e6, 1e7, 1e8])
    t = size_bytes / 100e6 - 0.005  # a negative intercept: no per-call cost to report
    fit = fit_latency_bandwidth(pd.DataFrame({"size_bytes": size_bytes,
                                              "allreduce_ms_median": t}))
    assert fit[0] is None and fit[1] == pytest.approx(100.0, rel=1e-6)
    one_size = pd.DataFrame({"size_bytes": [1e6, 1e6], "allreduce_ms_median": [1.0, 1.1]})
    assert fit_latency_bandwidth(one_size) is None


def test_fit_on_the_nccl_records_predicts_the_medians_within_15_percent(facts):
    rows = allreduce_rows("nccl")
    o_ms, w_gbps = fit_latency_bandwidth(rows)
    predicted = o_ms + rows["size_bytes"] / (w_gbps * 1e6)
    relative = (predicted - rows["allreduce_ms_median"]).abs() / rows["allreduce_ms_median"]
    assert relative.max() < 0.15, relative.tolist()
    run = next(r for r in facts["allreduce"]["runs"] if r["backend"] == "nccl")
    assert run["fit"]["o_us"] == pytest.approx(o_ms * 1e3)
    assert run["fit"]["w_gbps"] == pytest.approx(w_gbps)


def test_allreduce_facts_are_the_records(facts):
    nccl = allreduce_rows("nccl")
    run = next(r for r in facts["allreduce"]["runs"]
               if r["backend"] == "nccl" and r["world_size"] == 2)
    assert run["largest_busbw_gbps"] == pytest.approx(nccl["busbw_gbps"].iloc[-1])
    assert run["largest_median_ms"] == pytest.approx(nccl["allreduce_ms_median"].iloc[-1])
    worlds = facts["allreduce"]["world_sizes"]
    ratio = pd.concat([allreduce_rows("gloo", w)["allreduce_ms_median"]
                       / allreduce_rows("nccl", w)["allreduce_ms_median"]  # same sizes, in order
                       for w in worlds])
    r = facts["allreduce"]["nccl_vs_gloo"]
    assert (r["ratio_min"], r["ratio_max"]) == pytest.approx((ratio.min(), ratio.max()))
    assert r["pairs"] == len(ratio) and r["word"] == "faster"


def test_rank_scaling_compares_each_world_size_with_the_smallest(facts):
    worlds = facts["allreduce"]["world_sizes"]
    scaling = facts["allreduce"]["rank_scaling"]
    assert len(scaling) == 2 * (len(worlds) - 1)  # gloo and nccl
    for r in scaling:
        small, large = allreduce_rows(r["backend"], r["from"]), allreduce_rows(r["backend"], r["to"])
        time = large["allreduce_ms_median"] / small["allreduce_ms_median"]
        busbw = large["busbw_gbps"] / small["busbw_gbps"]
        assert (r["time_ratio_min"], r["time_ratio_max"]) == pytest.approx((time.min(), time.max()))
        assert (r["busbw_ratio_min"], r["busbw_ratio_max"]) == pytest.approx(
            (busbw.min(), busbw.max()))
        assert r["ring_time_ratio"] == pytest.approx(
            ((r["to"] - 1) / r["to"]) / ((r["from"] - 1) / r["from"]))
        assert r["against_ring"] == ("less" if time.iloc[-1] < r["ring_time_ratio"] else "more")


# --- DDP -----------------------------------------------------------------------------------

def test_variants_come_in_the_order_of_DDP_VARIANTS(facts):
    order = [v["variant"] for v in facts["ddp"]["sizes"][0]["variants"]]
    ranks = [list(DDP_VARIANTS).index(v) for v in order]
    assert ranks == sorted(ranks)
    buckets = [v["label"] for v in facts["ddp"]["sizes"][0]["variants"]
               if v["variant"] == "bucketed"]
    assert buckets == ["bucketed 1 MiB", "bucketed 10 MiB", "bucketed 100 MiB",
                       "bucketed 1000 MiB"]


def test_naive_to_flat_communication_is_the_records(facts):
    naive, flat = ddp("naive"), ddp("flat")
    nf = facts["ddp"]["sizes"][0]["naive_vs_flat"]
    assert nf["naive_communicate"]["ms"] == naive["communicate_ms_mean"]
    assert nf["flat_communicate"]["ms"] == flat["communicate_ms_mean"]
    assert nf["naive_step"]["ms"] == naive["step_ms_mean"]
    assert nf["flat_step"]["ms"] == flat["step_ms_mean"]
    assert nf["communicate"]["ratio"] == pytest.approx(
        naive["communicate_ms_mean"] / flat["communicate_ms_mean"])
    # the step times differ by less than their two stds together: a tie inside the noise
    step_tie = (abs(naive["step_ms_mean"] - flat["step_ms_mean"])
                <= naive["step_ms_std"] + flat["step_ms_std"])
    assert nf["step"]["within_spread"] is step_tie
    share = facts["ddp"]["sizes"][0]["naive_communication_share"]["fraction"]
    assert share == pytest.approx(naive["communicate_ms_mean"] / naive["step_ms_mean"])


def test_our_best_against_torch_ddp_is_the_ratio_of_the_two_step_means(facts):
    ours = {p.stem: _metrics(p) for p in (REFERENCE / "ddp").glob("*/*.json") if p.stem != "torch"}
    best = min(ours, key=lambda name: ours[name]["step_ms_mean"])
    torch_ddp = ddp("torch")
    vs = facts["ddp"]["sizes"][0]["vs_torch"]
    assert vs["ours"]["ms"] == ours[best]["step_ms_mean"]
    assert vs["torch"]["ms"] == torch_ddp["step_ms_mean"]
    assert vs["speedup"]["ratio"] == pytest.approx(torch_ddp["step_ms_mean"]
                                                   / ours[best]["step_ms_mean"])
    assert vs["speedup"]["word"] == ("faster" if ours[best]["step_ms_mean"]
                                     < torch_ddp["step_ms_mean"] else "slower")
    apart = abs(torch_ddp["step_ms_mean"] - ours[best]["step_ms_mean"])
    assert vs["speedup"]["within_spread"] is (
        apart <= torch_ddp["step_ms_std"] + ours[best]["step_ms_std"])
    fastest = min([*ours.values(), torch_ddp], key=lambda m: m["step_ms_mean"])
    assert facts["ddp"]["sizes"][0]["fastest"]["ms"] == fastest["step_ms_mean"]


def test_collective_busy_time_is_reported_missing_where_the_records_lack_it(facts):
    lacking = [p.stem for p in (REFERENCE / "ddp").glob("*/*.json")
               if "collective_busy_ms_per_step" not in _metrics(p)]
    assert len(facts["ddp"]["collective_busy_missing"]) == len(lacking)
    note = facts["coverage"]["ddp_overlap_individual_parameters_benchmarking"]
    # partly answered for this too (the reference run has no 2.7b DDP runs either)
    assert ("their records have no such metric" in note["note"]) is bool(lacking)
    if lacking:
        assert note["status"] == "partly answered"


def test_profiled_steps_come_from_the_records(facts, markdown):
    """The number of profiled steps is a record metric: n/a where a record lacks it."""
    lacking = sorted(p.stem for p in (REFERENCE / "ddp").glob("*/*.json")
                     if "profile_steps" not in _metrics(p))
    recorded = {_metrics(p)["profile_steps"] for p in (REFERENCE / "ddp").glob("*/*.json")
                if "profile_steps" in _metrics(p)}
    assert facts["ddp"]["profile_steps"] == sorted(recorded)
    assert len(facts["ddp"]["profile_steps_missing"]) == len(lacking)
    assert "| profiled steps" in facts["ddp"]["table"]
    words = " ".join(markdown.split())  # the template wraps its lines
    assert "show the overlap" not in words and "were made before" not in words
    assert "Rank 0's Chrome traces of the profiled steps" in words
    assert "written beside the records" in words


def test_profiled_steps_and_busy_time_of_new_records(tmp_path):
    """Records that carry collective_busy_ms_per_step and profile_steps: no n/a, and the
    trace sentence names the number of steps."""
    records = _records(REFERENCE)
    records["ddp"] = []
    for path in sorted((REFERENCE / "ddp").glob("*/*.json")):
        record = json.loads(path.read_text())
        record["metrics"].update(collective_busy_ms_per_step=1.5, profile_steps=3)
        copy = tmp_path / "ddp" / path.name
        write_json_atomic(copy, record)
        records["ddp"].append(str(copy))
    facts, _ = _build(records, tmp_path / "out")
    assert facts["ddp"]["profile_steps"] == [3]
    assert facts["ddp"]["profile_steps_missing"] == []
    assert facts["ddp"]["collective_busy_missing"] == []
    assert all(v["profile_steps"] == 3 for v in facts["ddp"]["sizes"][0]["variants"])
    assert "n/a" not in facts["ddp"]["table"]
    markdown = section_text("distributed", facts, link_base=tmp_path)
    words = " ".join(markdown.split())
    assert "Rank 0's Chrome traces of the profiled steps (3 steps per run) are written" in words
    assert "have no such metric" not in words
    note = facts["coverage"]["ddp_overlap_individual_parameters_benchmarking"]["note"]
    assert "collective busy time" not in note


# --- what the preset leaves out of the assignment's matrix --------------------------------

def test_coverage_notes_follow_the_assignment_matrix_of_the_options(facts, tmp_path):
    allreduce = [json.loads(p.read_text())["config"]
                 for p in (REFERENCE / "allreduce").glob("*.json")]
    absent = [w for w in ASSIGNMENT["allreduce"]["world_sizes"]
              if w not in {c["world_size"] for c in allreduce}]
    note = facts["coverage"]["distributed_communication_single_node"]
    assert absent and note["status"] == "partly answered"
    assert f"no runs with {' and '.join(map(str, absent))} processes" in note["note"]
    # the reference run is the assignment's DDP setup at 2025's xl only: 2026's is missing
    assert facts["coverage"]["naive_ddp_benchmarking"] == {
        "status": "partly answered", "anchor": "naive_ddp_benchmarking",
        "note": "no xl runs in this preset"}
    xl_only = {**ASSIGNMENT, "ddp": {**ASSIGNMENT["ddp"], "sizes": ["xl"]}}
    xl_facts, _ = _build(_records(REFERENCE), tmp_path / "xl", xl_only)
    assert xl_facts["coverage"]["naive_ddp_benchmarking"] == {
        "status": "answered", "note": "", "anchor": "naive_ddp_benchmarking"}

    # a matrix the records cover, and one with another model and a backend never run
    covered_matrix = {**ASSIGNMENT, "allreduce": {**ASSIGNMENT["allreduce"], "world_sizes": [2]}}
    other = {**ASSIGNMENT, "allreduce": {**ASSIGNMENT["allreduce"], "backends": ["mpi"]},
             "ddp": {**ASSIGNMENT["ddp"], "sizes": ["large"]}}
    covered_facts, _ = _build(_records(REFERENCE), tmp_path / "covered", covered_matrix)
    assert covered_facts["coverage"]["distributed_communication_single_node"]["status"] \
        == "answered"
    other_facts, _ = _build(_records(REFERENCE), tmp_path / "other", other)
    assert "no mpi runs" in other_facts["coverage"]["distributed_communication_single_node"][
        "note"]
    gap = other_facts["coverage"]["naive_ddp_benchmarking"]
    assert gap["status"] == "partly answered"
    assert gap["note"] == "measured with the xl model on 2 ranks (nccl), not large on 2 GPUs (nccl)"


# --- the bucketed overhead model -----------------------------------------------------------

def test_overhead_model_predictions_and_optimum(facts):
    (model,) = facts["overhead"]["sizes"]
    assert facts["overhead"]["available"] and model["available"] and model["size"] == "xl"
    o_ms, w_gbps = fit_latency_bandwidth(allreduce_rows("nccl"))
    assert (model["o_ms"], model["w_gbps"]) == pytest.approx((o_ms, w_gbps))
    naive = ddp("naive")
    w_bytes_per_ms = w_gbps * 1e9 / 1e3
    rows = {row["bucket_mib"]: row for row in model["rows"]}
    for mb in (1, 10, 100, 1000):
        record = ddp(f"bucketed-{mb}mb")
        s, n_b = record["gradient_bytes"], record["buckets"]
        expected = s / (n_b * w_bytes_per_ms) + n_b * o_ms  # s / (n_b w) + n_b o
        row = rows[mb]
        assert row["buckets"] == n_b
        assert row["predicted_ms"] == pytest.approx(expected, rel=1e-12)
        # measured in the same run: the wait after its own backward
        assert row["measured"]["ms"] == record["communicate_ms_mean"]
        gap = record["communicate_ms_mean"] - expected
        assert row["gap_ms"] == pytest.approx(gap)
        assert row["verdict"] == ("inside the spread" if abs(gap) <= record["communicate_ms_std"]
                                  else "above" if gap > 0 else "below")
        assert row["backward_slowdown_ms"] == pytest.approx(
            record["backward_ms_mean"] - naive["backward_ms_mean"])
    assert {r["bucket_mib"] for r in model["above"] + model["below"] + model["fits"]} \
        == {1, 10, 100, 1000}
    s = ddp("naive")["gradient_bytes"]
    assert model["s_bytes"] == s
    assert model["b_star_bytes"] == pytest.approx(math.sqrt(s * w_bytes_per_ms * o_ms))
    n_star = model["n_b_star"]
    assert n_star == pytest.approx(s / model["b_star_bytes"])

    def overhead(n):
        return s / (n * w_bytes_per_ms) + n * o_ms

    assert overhead(n_star) < min(overhead(0.9 * n_star), overhead(1.1 * n_star))


def test_overhead_sentences_say_by_how_much_the_model_misses(facts, markdown):
    words = " ".join(markdown.split())
    (model,) = facts["overhead"]["sizes"]
    for row in model["below"]:
        assert f"{-row['gap_ms']:.2f} ms below the predicted {row['predicted_ms']:.2f} ms" in words
    for row in model["above"]:
        assert f"{row['gap_ms']:.2f} ms above the predicted {row['predicted_ms']:.2f} ms" in words
    assert (f"takes {model['backward_slowdown_min_ms']:.1f} to "
            f"{model['backward_slowdown_max_ms']:.1f} ms longer than naive DDP's") in words
    assert "(2025 edition only)" in words


# --- sharding ------------------------------------------------------------------------------

def test_sharded_state_and_times_are_the_ratios_of_the_two_records(facts):
    s, r = sharded("sharded"), sharded("replicated")
    f = facts["sharded"]
    assert f["state"]["fraction"] == pytest.approx(s["optimizer_state_gib"]
                                                   / r["optimizer_state_gib"])
    assert f["step"]["speedup"]["ratio"] == pytest.approx(r["step_ms_mean"] / s["step_ms_mean"])
    assert f["optimizer"]["speedup"]["ratio"] == pytest.approx(r["optimizer_ms_mean"]
                                                               / s["optimizer_ms_mean"])
    assert f["optimizer"]["speedup"]["word"] == ("faster" if s["optimizer_ms_mean"]
                                                 < r["optimizer_ms_mean"] else "slower")
    # per-window peaks where the records have them; where not, the section says why
    assert f["has_memory_readings"] is ("memory_per_rank" in s)
    if not f["has_memory_readings"]:
        assert f["no_readings_because"] == "these records predate the per-window peaks"
    for name, m in (("replicated", r), ("sharded", s)):
        memory = f["memory"][name]
        assert memory["state_gib"] == pytest.approx(
            m["parameter_gib"] + m["gradient_gib"] + m["optimizer_state_gib"])


def test_accounting_facts_are_the_record(facts):
    record = json.loads((REFERENCE / "distributed/communication_accounting.json").read_text())
    for key, value in record["metrics"].items():
        if key in facts["accounting"]:
            assert facts["accounting"][key] == pytest.approx(value)
    assert facts["accounting"]["fsdp_degree_x"] == record["config"]["fsdp_degree_x"]
    assert facts["accounting"]["parameters_billions"] == pytest.approx(
        record["metrics"]["parameters"] / 1e9)


# --- the template --------------------------------------------------------------------------

def test_template_renders_the_numbers_and_verdicts(facts, markdown):
    assert markdown.startswith("## 5 Distributed data parallel")
    assert "## 6 Sharding" in markdown
    for problem in DISTRIBUTED_PROBLEMS:
        assert f'<a id="{problem}"></a>' in markdown
        assert f"`{problem}`" in markdown
    torch_ddp = ddp("torch")
    assert f"{torch_ddp['step_ms_mean']:.1f} ± {torch_ddp['step_ms_std']:.1f} ms" in markdown
    vs = facts["ddp"]["sizes"][0]["vs_torch"]["speedup"]
    assert f"{fmt_ratio(vs['factor'])} {vs['word']} than torch's" in markdown
    s, r = sharded("sharded"), sharded("replicated")
    percent = 100 * s["optimizer_state_gib"] / r["optimizer_state_gib"]
    assert f"{s['optimizer_state_gib']:.2f} GiB sharded ({percent:.0f}%" in markdown
    assert f"b* = sqrt(s w o) = {facts['overhead']['sizes'][0]['b_star_mib']:.1f} MiB" \
        in " ".join(markdown.split())
    # naive -> flat: a tie inside the noise is said to be one, and only then
    naive, flat = ddp("naive"), ddp("flat")
    tie = (abs(naive["step_ms_mean"] - flat["step_ms_mean"])
           <= naive["step_ms_std"] + flat["step_ms_std"])
    assert facts["ddp"]["sizes"][0]["naive_vs_flat"]["step"]["within_spread"] is tie
    assert ("a tie with naive (" in markdown) is tie
    assert "figures/ddp_step_time.png" in markdown and "{{" not in markdown


# --- a GPU preset on a machine without GPUs ------------------------------------------------

def _skipped_records(root: Path) -> dict[str, list[str]]:
    env = {"device": "cpu", "gpu": None, "torch": "x", "triton": None, "git": "test"}
    reason = "CUDA was requested but no CUDA device is available on this machine"
    configs = {
        "allreduce": [{"backend": "nccl", "size_mb": mb, "world_size": 2} for mb in (1, 10)],
        "ddp": [{"variant": v, "bucket_size_mb": 10.0 if v == "bucketed" else None,
                 "size": "xl", "context_length": 128, "batch_size": 16, "world_size": 2,
                 "backend": "nccl"} for v in DDP_VARIANTS],
        "sharded": [{"sharded": flag, "size": "xl", "context_length": 128, "batch_size": 8,
                     "world_size": 2, "backend": "nccl"} for flag in (True, False)],
    }
    records = {}
    for key, items in configs.items():
        records[key] = []
        for i, config in enumerate(items):
            path = root / key / f"{i}.json"
            write_json_atomic(path, make_record(key, config, "skipped", env=env, message=reason))
            records[key].append(str(path))
    path = root / "communication_accounting.json"
    write_json_atomic(path, make_record("communication_accounting", {}, "skipped", env=env,
                                        message=reason))
    records["accounting"] = [str(path)]
    return records


def test_all_skipped_records_give_skipped_coverage_and_a_section(tmp_path):
    facts, _ = _build(_skipped_records(tmp_path / "records"), tmp_path)
    statuses = {k: v["status"] for k, v in facts["coverage"].items()}
    # without the (CPU) check record, naive_ddp's check is the test-suite's
    assert statuses.pop("naive_ddp") == "partly answered"
    assert set(statuses.values()) == {"skipped"}, statuses
    assert "no CUDA device" in facts["coverage"]["naive_ddp_benchmarking"]["note"]
    markdown = section_text("distributed", facts, link_base=tmp_path)
    assert "No DDP variant ran." in markdown
    assert "Not measured: nccl x 2 at 1 MB (skipped: CUDA was requested" in markdown


# --- records of the current experiments: two sizes, profiles, per-rank peaks, the check ----

def _new_records(root: Path) -> dict[str, list[str]]:
    """The reference records as the current experiments write them: DDP at 2025's xl and
    2026's xl (2.7b, the same numbers), each with its profile's overlap numbers and timeline;
    the sharded runs with per-window peaks on both ranks; and the CPU check."""
    records = _records(REFERENCE)
    records["ddp"] = []
    for size in ("xl", "2.7b"):
        for path in sorted((REFERENCE / "ddp").glob("*/*.json")):
            record = json.loads(path.read_text())
            record["config"]["size"] = size
            overlapped = record["config"]["variant"] != "naive"
            record["metrics"].update(
                collective_busy_ms_per_step=40.0, compute_busy_ms_per_step=380.0,
                collective_hidden_ms_per_step=30.0 if overlapped else 0.4,
                collective_hidden_fraction=0.75 if overlapped else 0.01, profile_steps=2,
                timeline={"step_ms": 400.0, "compute": [[0.0, 350.0], [360.0, 400.0]],
                          "collective": [[100.0, 340.0]] if overlapped else [[350.0, 360.0]],
                          "phases": {"forward": [0.0, 120.0], "backward": [120.0, 350.0],
                                     "communicate": [350.0, 360.0],
                                     "optimizer": [360.0, 400.0]}})
            copy = root / "ddp" / size / path.name
            write_json_atomic(copy, record)
            records["ddp"].append(str(copy))
    records["sharded"] = []
    for path in sorted((REFERENCE / "sharded_optimizer").glob("*.json")):
        record = json.loads(path.read_text())
        state = record["metrics"]["optimizer_state_gib"]
        ranks = [{"peak_gib_init": 7.5, "allocated_gib_after_init": 7.45,
                  "peak_gib_before_step": 30.0 + state, "allocated_gib_before_step": 15.0 + state,
                  "peak_gib_step": 16.0 + state, "allocated_gib_after_step": 15.0 + state,
                  "optimizer_state_gib": state + rank} for rank in range(2)]
        record["metrics"].update(ranks[0], memory_per_rank=ranks)
        copy = root / "sharded_optimizer" / path.name
        write_json_atomic(copy, record)
        records["sharded"].append(str(copy))
    checks = [{"variant": v, "max_abs_diff": 2e-6, "equal": False, "allclose": True,
               "rtol": 1.3e-6, "atol": 1e-5, "replicas_max_abs_diff": 0.0,
               "moved_max_abs": 3e-3} for v in ("naive", "flat", "overlap", "bucketed")]
    env = {"device": "cpu", "gpu": None, "torch": "x", "triton": None, "git": "test"}
    check = root / "ddp_check.json"
    write_json_atomic(check, make_record(
        "ddp_check", {"size": "tiny", "context_length": 16, "batch_size": 4, "world_size": 2,
                      "steps": 3, "seed": 0, "backend": "gloo"}, "ok",
        {"checks": checks, "steps": 3, "learning_rate": 1e-3}, env))
    records["ddp_check"] = [str(check)]
    return records


@pytest.fixture(scope="module")
def new(tmp_path_factory):
    root = tmp_path_factory.mktemp("new")
    facts, outputs = _build(_new_records(root / "records"), root / "out")
    markdown = section_text("distributed", facts, link_base=root / "out")
    return facts, outputs, " ".join(markdown.split())


def test_each_edition_s_xl_is_named_and_measured_apart(new):
    facts, _, words = new
    assert [d["size"] for d in facts["ddp"]["sizes"]] == ["xl", "2.7b"]
    # by the writeup's names: 2026's xl (our 2.7b) and the 2025 edition's xl
    assert [d["name"] for d in facts["ddp"]["sizes"]] == ["xl-2025", "xl"]
    assert "for each model size: xl-2025, xl." in words
    assert [o["size"] for o in facts["overhead"]["sizes"]] == ["xl", "2.7b"]
    assert facts["coverage"]["naive_ddp_benchmarking"]["status"] == "answered"
    assert "| 2.7b " in facts["ddp"]["table"]


def test_overlap_evidence_comes_from_the_records_alone(new):
    facts, outputs, words = new
    evidence = {e["label"]: e for e in facts["ddp"]["sizes"][0]["evidence"]}
    assert evidence["overlap"]["hidden_fraction"] == 0.75
    assert evidence["naive"]["hidden_fraction"] == 0.01
    assert "| 75% " in facts["ddp"]["sizes"][0]["evidence_table"]
    assert "overlap: 75% of its 40.0 ms of collective time per step runs while" in words
    assert "naive: 1% of its 40.0 ms" in words
    assert Path(outputs["overlap_figure"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "figures/ddp_overlap.png" in words
    assert "n/a" not in facts["ddp"]["table"]


def test_the_overlap_picture_is_drawn_from_the_records_that_have_a_timeline(facts, markdown):
    timed = [p for p in (REFERENCE / "ddp").glob("*/*.json") if "timeline" in _metrics(p)]
    assert len(facts["ddp"]["sizes"][0]["evidence"]) == len(timed)
    assert ("there is no overlap picture in this run" in " ".join(markdown.split())) \
        is (not timed)


def test_the_ddp_check_is_reported(new):
    facts, _, words = new
    assert facts["check"]["all_close"] and not facts["check"]["all_equal"]
    assert facts["coverage"]["naive_ddp"] == {"status": "answered", "note": "",
                                              "anchor": "naive_ddp"}
    assert "| naive | 2e-06 | no | yes | 0 | 0.003 |" in words
    assert "Every variant ends within torch.testing's float32 tolerances" in words
    assert "Not bitwise" in words
    # the answer before the table it rests on
    assert words.index("Does it train like one process? Yes, within fp32 tolerance.") \
        < words.index("| naive | 2e-06 |")


def test_a_failed_ddp_check_says_so(tmp_path):
    records = _new_records(tmp_path / "records")
    record = json.loads(Path(records["ddp_check"][0]).read_text())
    record["metrics"]["checks"][0].update(allclose=False, max_abs_diff=0.5)
    write_json_atomic(records["ddp_check"][0], record)
    facts, _ = _build(records, tmp_path / "out")
    assert facts["check"]["not_close"] == ["naive"]
    assert facts["coverage"]["naive_ddp"]["status"] == "partly answered"
    words = " ".join(section_text("distributed", facts, link_base=tmp_path).split())
    assert "Not within tolerance: naive." in words
    assert "Does it train like one process? Not every variant." in words
    assert "Yes, within fp32 tolerance" not in words


def test_sharded_peaks_per_window_and_rank(new):
    facts, _, words = new
    f = facts["sharded"]
    assert f["has_memory_readings"]
    rep, sh = f["memory"]["replicated"], f["memory"]["sharded"]
    r = sharded("replicated")
    assert rep["peak_before_step_gib"] == 30.0 + r["optimizer_state_gib"]
    assert rep["before_step_above_state_gib"] == pytest.approx(
        30.0 - r["parameter_gib"] - r["gradient_gib"])
    assert rep["init_above_parameters_gib"] == pytest.approx(7.5 - r["parameter_gib"])
    assert f["rank_peaks"]["sharded"] == [30.0 + sharded("sharded")["optimizer_state_gib"]] * 2
    assert (f"during the step {rep['peak_step_gib']:.2f} -> {sh['peak_step_gib']:.2f} GiB"
            in words)
    rows = [" ".join(line.split()) for line in f["memory_table"].splitlines()]
    assert "| replicated | 1 | 7.50 | 7.45 |" in " ".join(rows)
    assert "of xl-2025 on 2 ranks" in words


def test_a_step_time_tie_is_said_to_be_one(tmp_path):
    records = _new_records(tmp_path / "records")
    for path in records["sharded"]:  # 2 ms apart, each ± 5 ms
        record = json.loads(Path(path).read_text())
        record["metrics"].update(step_ms_mean=282.0 if record["config"]["sharded"] else 280.0,
                                 step_ms_std=5.0)
        write_json_atomic(path, record)
    facts, _ = _build(records, tmp_path / "out")
    assert facts["sharded"]["step"]["speedup"]["within_spread"]
    words = " ".join(section_text("distributed", facts, link_base=tmp_path).split())
    assert "a tie with the replicated one (" in words
    assert "inside the measured spread), so these steps do not tell the two apart" in words


def test_the_profiles_busy_time_is_reconciled_with_the_timed_phase(facts, markdown):
    """naive and flat communicate only after backward: the profile's collective time and the
    timed phase are the same calls measured two ways, and the text says by how much and which
    way they differ (more: rank 0 waits inside the kernel; less: the phase holds copies)."""
    (size,) = [d for d in facts["ddp"]["sizes"] if d["size"] == "xl"]
    rows = {b["label"]: b for b in size["busy_vs_timed"]}
    naive = ddp("naive")
    assert rows["naive"]["busy_ms"] == pytest.approx(naive["collective_busy_ms_per_step"])
    assert rows["naive"]["timed_ms"] == pytest.approx(naive["communicate_ms_mean"])
    word = "more" if naive["collective_busy_ms_per_step"] > naive["communicate_ms_mean"] \
        else "less"
    assert rows["naive"]["word"] == word
    words = " ".join(markdown.split())
    assert (f"naive: the profile shows collectives running {rows['naive']['busy_ms']:.1f} ms a "
            f"step, {rows['naive']['difference_ms']:.1f} ms {word} than its timed") in words
    flat = rows["flat"]
    assert flat["word"] == ("more" if ddp("flat")["collective_busy_ms_per_step"]
                            > ddp("flat")["communicate_ms_mean"] else "less")


def test_the_sharded_optimizer_states_its_setup(facts, markdown):
    config = json.loads((REFERENCE / "sharded_optimizer" / "sharded.json").read_text())["config"]
    setup = facts["sharded"]["setup"]
    assert setup["context_length"] == config["context_length"]
    assert setup["batch_size"] == config["batch_size"]
    words = " ".join(markdown.split())
    assert (f"context {config['context_length']}, global batch {config['batch_size']} "
            f"({config['batch_size'] // config['world_size']} sequences a rank)") in words


def test_bucketed_a_says_whether_the_bucket_size_mattered_and_where_it_would(facts, markdown):
    """ddp_bucketed_benchmarking (a): the measured waits across bucket sizes against their
    noise, and the overhead model's prediction for a slow link, from the same fit."""
    from cs336_systems.sections.distributed.ddp_table import SLOW_LINK_GBPS, overhead_ms
    (size,) = [s for s in facts["overhead"]["sizes"] if s["size"] == "xl"]
    x = size["expectation"]
    waits = [r["measured"]["ms"] for r in size["rows"]]
    assert x["wait_range_ms"] == pytest.approx(max(waits) - min(waits))
    assert x["resolved"] == (x["wait_range_ms"] > 2 * x["noise_ms"])
    worst = x["slow_link"]["worst"]
    row = next(r for r in size["rows"] if r["bucket_mib"] == worst["bucket_mib"])
    assert worst["predicted_ms"] == pytest.approx(
        overhead_ms(size["s_bytes"], row["buckets"], size["o_ms"], SLOW_LINK_GBPS))
    words = " ".join(markdown.split())
    verdict = "beyond" if x["resolved"] else "within"
    assert f"a range of {x['wait_range_ms']:.2f} ms {verdict} twice the largest" in words
