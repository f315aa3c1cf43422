"""report/writeup.md: a header saying what ran where, the coverage table, then the sections.

The sections come in the order of `cs336_systems.sections.SECTIONS`, each already
rendered to markdown by its own template; the coverage table lists every problem of the
assignment (`coverage.PROBLEMS`) with what the sections' facts say of it.
"""

from __future__ import annotations

from pathlib import Path

from cs336_systems.pipeline.records import git_commit, write_text_atomic
from cs336_systems.report.coverage import coverage_rows
from cs336_systems.report.facts import read_facts
from cs336_systems.report.job_times import section_rows
from cs336_systems.report.render import render

ENV_ROWS = (("device", "device"), ("GPU", "gpu"), ("torch", "torch"), ("Triton", "triton"),
            ("code commit of the measurements", "git"))


def header_rows(preset: str, facts: list[dict]) -> list[tuple[str, str]]:
    rows = [("preset", preset)]
    for label, key in ENV_ROWS:
        values = sorted({str(v) for f in facts for v in f.get("env", {}).get(key, [])})
        rows.append((label, ", ".join(values) if values else "n/a"))
    rows.append(("commit that rendered this writeup", git_commit()))
    return rows


def coverage(facts: list[dict]) -> list[dict]:
    claims = {}
    for section in facts:
        for problem, claim in section.get("coverage", {}).items():
            if problem in claims:
                raise ValueError(f"two sections claim {problem!r}; one problem, one section")
            note = " ".join(str(claim.get("note", "")).split()).replace("|", "\\|")
            claims[problem] = {**claim, "note": note,
                               "anchor": claim.get("anchor") or problem.split(" ")[0]}
    return coverage_rows(claims)


def render_writeup(sections: list[str], facts: list[str], template: str | Path,
                   output: str | Path, preset: str) -> None:
    """`facts` are results/<preset>/sections/<section>.json, beside the section markdowns."""
    all_facts = [read_facts(path) for path in facts]
    times = section_rows([(Path(path).stem, f.get("job_times", {}))
                          for path, f in zip(facts, all_facts)])
    text = render(template, {
        "preset": preset, "results_dir": Path(facts[0]).parent.parent.as_posix(),
        "header": header_rows(preset, all_facts),
        "coverage": coverage(all_facts),
        "job_times": times,
        "sections": [Path(path).read_text().strip() for path in sections],
    })
    write_text_atomic(output, text)
