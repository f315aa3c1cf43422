"""The writeup a grader reads in fifteen minutes: the results at a glance first, each problem's
answer right under its heading, the whole within its budget, and everything else one link
away on a companion page."""

import copy
import json
import re

import pytest

from cs336_systems.report.coverage import PROBLEMS
from cs336_systems.report.render import glance, one_value_ranges, reflow, render_details
from cs336_systems.report.writeup import coverage, glance_rows
from cs336_systems.sections import SECTIONS, Section
from support.checkout import ROOT

REFERENCE = ROOT / "docs" / "reference-run"
WRITEUP = REFERENCE / "report" / "writeup.md"
FACTS = REFERENCE / "results" / "assignment" / "sections"
# The budget of the assignment preset's writeup (../shared/WRITEUP.md)
MAX_LINES, MAX_WORDS = 1000, 8000
ANSWER_WITHIN = 10


def _facts(section: str) -> dict:
    return json.loads((FACTS / f"{section}.json").read_text())


def test_the_committed_writeup_reads_in_fifteen_minutes():
    lines = WRITEUP.read_text().splitlines()
    words = sum(len(line.split()) for line in lines if not line.startswith("|"))
    assert len(lines) <= MAX_LINES, f"{len(lines)} lines"
    assert words <= MAX_WORDS, f"{words} words outside tables"


def test_it_opens_with_the_results_at_a_glance_a_row_per_problem():
    text = WRITEUP.read_text()
    first_heading = re.search(r"^## (.+)$", text, re.M)
    assert first_heading.group(1) == "Results at a glance"
    table = text[first_heading.end():text.index("\n## ", first_heading.end())]
    rows = [line for line in table.splitlines() if line.startswith("| [`") or
            line.startswith("| `")]
    assert [re.match(r"\| \[?`(\w+)`", r).group(1) for r in rows] == [p.name for p in PROBLEMS]
    for row in rows:
        answer = row.rstrip(" |").rsplit(" | ", 1)[1]
        assert answer.strip(), row


def _prose(line: str) -> bool:
    return bool(line.strip()) and not line.startswith(("#", "<a ", "|", "![", "```"))


def test_each_problem_is_answered_within_ten_lines_of_its_heading_and_before_the_method():
    lines = WRITEUP.read_text().splitlines()
    anchors = {p.key.replace(" (", "_").rstrip(")") if p.name == "leaderboard" else p.name
               for p in PROBLEMS}
    seen = set()
    for i, line in enumerate(lines):
        found = re.match(r'<a id="([^"]+)"></a>', line)
        if not found or found.group(1) not in anchors:
            continue
        seen.add(found.group(1))
        heading = next(j for j in range(i, len(lines)) if lines[j].startswith("#"))
        answer = next((j for j in range(heading + 1, min(heading + 1 + ANSWER_WITHIN, len(lines)))
                       if _prose(lines[j])), None)
        assert answer is not None, f"{found.group(1)}: no answer within {ANSWER_WITHIN} lines"
        assert not lines[answer].startswith("_How it was measured"), found.group(1)
    assert seen == anchors


def test_every_section_template_gives_each_problem_it_answers_a_glance_line():
    for section in SECTIONS:
        facts = _facts(section)
        for problem, claim in facts.get("coverage", {}).items():
            if claim["status"] in ("answered", "partly answered"):
                assert glance(Section(section).template, facts, problem), (section, problem)


def test_a_glance_row_is_computed_from_the_facts():
    facts = _facts("benchmark")
    row = glance(Section("benchmark").template, facts, "benchmarking_script")
    shown = f"{facts['by_size']['largest']['step_ms']:.1f} ms"
    assert shown in row
    changed = copy.deepcopy(facts)
    changed["by_size"]["largest"]["step_ms"] = 1234.5
    assert "1234.5 ms" in glance(Section("benchmark").template, changed, "benchmarking_script")


def test_a_problem_not_answered_says_its_status_and_why():
    facts = [_facts(section) for section in SECTIONS]
    facts[0] = {**facts[0], "coverage": {"benchmarking_script": {
        "status": "skipped", "note": "CUDA was requested but no CUDA device is available"}}}
    templates = [str(Section(s).template) for s in SECTIONS]
    rows = {r["problem"]: r for r in glance_rows(coverage(facts), templates, facts)}
    assert rows["benchmarking_script"]["answer"] == (
        "_skipped_: CUDA was requested but no CUDA device is available")


def test_companion_pages_link_back_and_reach_the_writeups_anchors(tmp_path):
    facts_path = tmp_path / "results" / "x" / "sections" / "benchmark.json"
    facts_path.parent.mkdir(parents=True)
    facts_path.write_text(json.dumps(_facts("benchmark")))
    template = tmp_path / "details.md.j2"
    template.write_text('<a id="here"></a>\nSee [there](#benchmarking_mixed_precision) and '
                        '[here](#here).\n')
    out = tmp_path / "report" / "details" / "benchmark.md"
    render_details(facts_path, template, out, link_base=tmp_path / "report" / "details",
                   writeup=tmp_path / "report" / "writeup.md")
    text = out.read_text()
    assert "[the writeup](../writeup.md)" in text
    assert "[there](../writeup.md#benchmarking_mixed_precision)" in text
    assert "[here](#here)" in text


def test_reflow_rewraps_prose_and_keeps_tables_and_code():
    text = ("**(a)** one\nshort\nline.\n\n- an item\n  that wraps\n\n| a | b |\n|---|---|\n\n"
            "```text\nx = 1\n  y\n```")
    assert reflow(text) == ("**(a)** one short line.\n\n- an item that wraps\n\n| a | b |\n"
                            "|---|---|\n\n```text\nx = 1\n  y\n```")
    long = " ".join(["word"] * 60)
    assert all(len(line) <= 100 for line in reflow(long).splitlines())


def test_a_range_whose_ends_print_alike_is_one_value():
    assert one_value_ranges("the step is 1.30x–1.30x vanilla's speed; 58–58% of it") == \
        "the step is 1.30x vanilla's speed; 58% of it"
    assert one_value_ranges("1.30x to\n1.30x gloo's time, 0.5–0.5 ms") == "1.30x gloo's time, 0.5 ms"
    kept = "1.3x–1.30x, 58–60%, 12–12.5, from 2.00 to 2.00 GiB, v1.2–1.2\n| 6.5 [6.5–6.5] |"
    assert one_value_ranges(kept) == kept


@pytest.mark.parametrize("page", sorted(p.name for p in (REFERENCE / "report" / "details").glob(
    "*.md")))
def test_every_companion_page_links_back_to_the_writeup(page):
    text = (REFERENCE / "report" / "details" / page).read_text()
    assert "(../writeup.md" in text
