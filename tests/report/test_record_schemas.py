"""Every record is checked against its kind when a table reads it: a missing, null or mistyped
value where the section needs one names the file, the key, what was expected and the command
that measures it again; an `ok` record never reaches a table with a blank."""

import copy
import json
from pathlib import Path

import pytest

from cs336_systems.pipeline.jobs import Files, Job, section_tables
from cs336_systems.records import DamagedRecord, record_paths
from cs336_systems.report import record_schemas
from cs336_systems.report.record_schemas import check_record
from support.checkout import ROOT

REFERENCE = ROOT / "docs" / "reference-run" / "results"
PATH = "results/quick/benchmark/small_ctx128_forward_fp32_warmup5.json"


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads((REFERENCE / "quick" / "benchmark" /
                       "small_ctx128_forward_fp32_warmup5.json").read_text())


def test_every_record_of_the_reference_runs_holds_what_its_kind_needs():
    paths = [p for preset in ("assignment", "quick") for p in record_paths(REFERENCE / preset)]
    assert len(paths) > 800
    kinds = set()
    for path in paths:
        kinds.add(record_schemas.read_checked(path)["section"])
    assert kinds == set(record_schemas.shapes())  # and every kind described is one of them


def _message(record: dict, change) -> str:
    broken = copy.deepcopy(record)
    change(broken)
    with pytest.raises(DamagedRecord) as caught:
        check_record(broken, PATH)
    message = str(caught.value)
    assert message.startswith(f"{PATH}: ")
    assert message.endswith(f"`snakemake --cores 1 --force {PATH} --config preset=quick`.")
    return message


@pytest.mark.parametrize("change, says", [
    (lambda r: r["metrics"].pop("forward_ms_mean"),
     "metrics.forward_ms_mean is missing; an ok 'benchmark' record has a number there"),
    (lambda r: r["metrics"].update(forward_ms_mean=None),
     "metrics.forward_ms_mean is null; a 'benchmark' record has a number there"),
    (lambda r: r["metrics"].update(forward_ms_mean="fast"),
     "metrics.forward_ms_mean is 'fast'; a 'benchmark' record has a number there"),
    (lambda r: r["metrics"].update(forward_ms_samples=3.0),
     "metrics.forward_ms_samples is 3.0; a 'benchmark' record has a list there"),
    (lambda r: r["config"].update(context_length="sixteen"),
     "config.context_length is 'sixteen'; a 'benchmark' record has an integer there"),
    (lambda r: r["config"].update(batch_size=2.0),
     "config.batch_size is 2.0; a 'benchmark' record has an integer there"),
    (lambda r: r["config"].pop("size"),
     "config.size is missing; a 'benchmark' record has a string there"),
    (lambda r: r.update(section="nonesuch"),
     "no section describes records of kind 'nonesuch'"),
])
def test_a_broken_value_names_the_file_the_key_and_what_was_expected(record, change, says):
    assert says in _message(record, change)


def test_only_ok_records_must_hold_their_metrics_and_nulls_pass_where_allowed(record):
    check_record({**record, "status": "oom", "metrics": {}}, PATH)
    check_record({**record, "metrics": {**record["metrics"], "peak_gib": None}}, PATH)
    forward_only = copy.deepcopy(record)
    assert "backward_ms_mean" not in forward_only["metrics"]  # optional: a forward-only run
    check_record(forward_only, PATH)
    forward_only["metrics"]["backward_ms_mean"] = "slow"  # optional, but typed where present
    with pytest.raises(DamagedRecord, match="backward_ms_mean is 'slow'"):
        check_record(forward_only, PATH)


def test_a_kind_of_several_shapes_is_checked_by_the_shape_its_config_picks():
    path = REFERENCE / "quick" / "mixed_precision" / "layernorm.json"
    layernorm = json.loads(path.read_text())
    check_record(layernorm, path)
    as_accumulation = {**layernorm, "config": {**layernorm["config"], "part": "accumulation"}}
    with pytest.raises(DamagedRecord, match="config.increment is missing"):
        check_record(as_accumulation, path)


def test_the_schema_files_say_what_they_mean(tmp_path):
    sections = tmp_path / "sections" / "demo"
    sections.mkdir(parents=True)
    (sections / "records.yaml").write_text("demo:\n  config:\n    n: integr\n")
    with pytest.raises(ValueError, match="unknown type integr; allowed: string, integer"):
        record_schemas.shapes(tmp_path)
    (sections / "records.yaml").write_text("demo:\n  configs:\n    n: integer\n")
    with pytest.raises(ValueError, match="unknown configs; a shape has when, config"):
        record_schemas.shapes(tmp_path)


def test_the_tables_job_stops_at_a_damaged_record_with_one_line(record, tmp_path, capsys):
    """No table is made from a record that lacks what its section reads."""
    broken = copy.deepcopy(record)
    del broken["metrics"]["forward_ms_mean"]
    path = tmp_path / "results" / "quick" / "benchmark" / "r.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(broken))
    job = Job("section_tables", {"section": "benchmark", "options": {}},
              input=Files([str(path)], {"records": [str(path)], "code": []}),
              output=Files([str(tmp_path / "facts.json")], {"facts": str(tmp_path / "f.json")}),
              log=Files([str(tmp_path / "tables.log")]))
    with pytest.raises(SystemExit) as exit_:
        section_tables(job)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert f"{path}: metrics.forward_ms_mean is missing" in err
    assert not Path(tmp_path / "f.json").exists()
