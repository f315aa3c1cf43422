"""1.5 (f) on the reference run's records: the saved bytes are a measurement held against the
analytic model; the gradients' bytes are the .grad tensors' sizes, and the prose says they
match the formula by construction (a check that every gradient exists in fp32), not that a
measurement agreed with it."""

import copy
import json

import pytest

from cs336_systems.sections.residuals.report import memory_f_facts
from support.checkout import ROOT

QUICK = ROOT / "docs/reference-run/results/quick/residuals"


@pytest.fixture(scope="module")
def records():
    return [json.loads(path.read_text()) for path in sorted(QUICK.glob("block_*.json"))]


def test_gradient_rows_say_what_they_read(records):
    frame, facts = memory_f_facts(records)
    assert facts["contexts"]
    for entry in facts["contexts"]:
        assert "| saved-tensor hooks " in entry["table"] and "| .grad sizes " in entry["table"]
        assert "measured MiB" not in entry["table"]


def test_a_missing_gradient_breaks_the_check(records):
    broken = copy.deepcopy(records)
    for record in broken:
        record["metrics"]["parameter_gradient_bytes"] //= 2
        record["metrics"]["gradient_agrees"] = False
    _, facts = memory_f_facts(broken)
    assert not facts["all_agree"]
    assert all(not g["agrees"] for e in facts["contexts"] for g in e["gradients"]
               if g["name"] == "parameter gradients")
