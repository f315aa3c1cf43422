"""report/writeup.md: a header saying what ran where, the coverage table, then the sections.

The sections come in the order of `cs336_systems.sections.SECTIONS`, each already
rendered to markdown by its own template; the coverage table lists every problem of the
assignment (`coverage.PROBLEMS`) with what the sections' facts say of it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from cs336_systems.paths import PACKAGE_DIR
from cs336_systems.records import git_commit, write_text_atomic
from cs336_systems.report.coverage import coverage_rows
from cs336_systems.report.facts import read_facts
from cs336_systems.report.job_times import section_rows
from cs336_systems.report.render import render

ENV_ROWS = (("device", "device"), ("GPU", "gpu"), ("torch", "torch"), ("Triton", "triton"),
            ("code commit of the measurements", "git"))


def is_commit(label: str) -> bool | None:
    """Whether git resolves `label` to a commit of this checkout's repository; None where
    there is no git to ask."""
    try:
        found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{label}^{{commit}}"],
                               cwd=PACKAGE_DIR, capture_output=True, text=True, check=False)
    except OSError:
        return None
    if found.returncode not in (0, 1):  # 128: not a repository
        return None
    return found.returncode == 0


def commit_label(label: str) -> str:
    """A record's commit as the header shows it: a label git cannot resolve says so, and
    `<commit>-dirty` is a commit with uncommitted changes."""
    base = label.removesuffix("-dirty")
    known = is_commit(base)
    if known is False:
        return f"{label} (no commit of this repository)"
    if known and base != label:
        return f"{label} (with uncommitted changes)"
    return label


def header_rows(preset: str, facts: list[dict]) -> list[tuple[str, str]]:
    rows = [("preset", preset)]
    for label, key in ENV_ROWS:
        values = sorted({str(v) for f in facts for v in f.get("env", {}).get(key, [])})
        if key == "git":
            values = [commit_label(v) for v in values]
        rows.append((label, ", ".join(values) if values else "n/a"))
    rows.append(("commit that rendered this writeup", git_commit()))
    return rows


def provenance_rows(names: list[str], facts: list[dict]) -> list[dict]:
    """Per section, where its records came from: GPUs (or the CPU), torch, and the commits
    that measured them, each labelled as the header labels them; `mixed` where a section's
    records come from more than one commit."""
    rows = []
    for name, f in zip(names, facts):
        env = f.get("env", {})
        commits = sorted({str(v) for v in env.get("git", [])})
        rows.append({"section": name,
                     "where": ", ".join(sorted({str(v) for v in env.get("gpu", [])}))
                     or ", ".join(sorted({str(v) for v in env.get("device", [])})) or "n/a",
                     "torch": ", ".join(sorted({str(v) for v in env.get("torch", [])})),
                     "commits": ", ".join(commit_label(c) for c in commits) or "n/a",
                     "mixed": len(commits) > 1})
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
        "provenance": provenance_rows([Path(path).stem for path in facts], all_facts),
        "job_times": times,
        "sections": [Path(path).read_text().strip() for path in sections],
    })
    write_text_atomic(output, text)
