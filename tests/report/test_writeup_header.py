"""The writeup's header names the commits of its records as git knows them."""

import subprocess

import pytest

from cs336_systems.paths import PACKAGE_DIR
from cs336_systems.report.writeup import commit_label, header_rows, is_commit


def _head() -> str:
    return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=PACKAGE_DIR,
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def head():
    if is_commit("HEAD") is not True:
        pytest.skip("this checkout has no git history to resolve commits against")
    return _head()


def test_a_label_that_is_no_commit_says_so(head):
    assert commit_label(head) == head
    assert commit_label(f"{head}-dirty") == f"{head}-dirty (with uncommitted changes)"
    assert commit_label("b759e7f-memcap") == "b759e7f-memcap (no commit of this repository)"


def test_the_header_row_annotates_each_commit(head):
    facts = [{"env": {"git": [head, "not-a-commit"], "gpu": ["NVIDIA H100 80GB HBM3"]}}]
    rows = dict(header_rows("quick", facts))
    assert rows["code commit of the measurements"] == (
        f"{head}, not-a-commit (no commit of this repository)")
    assert rows["GPU"] == "NVIDIA H100 80GB HBM3"


def test_each_section_names_its_devices_and_commits(head):
    from cs336_systems.report.writeup import provenance_rows
    facts = [{"env": {"git": [head], "gpu": ["NVIDIA H200"], "torch": ["2.11.0"]}},
             {"env": {"git": [head, "abc-memcap"], "gpu": [], "device": ["cpu"]}},
             {}]
    one, two, none = provenance_rows(["flash", "memory", "empty"], facts)
    assert one == {"section": "flash", "where": "NVIDIA H200", "torch": "2.11.0",
                   "commits": head, "mixed": False}
    assert two["where"] == "cpu" and two["mixed"] is True
    assert "abc-memcap (no commit of this repository)" in two["commits"]
    assert none["commits"] == "n/a" and none["where"] == "n/a"
