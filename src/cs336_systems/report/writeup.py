"""report/writeup.md, the graded writeup, and report/details/run.md, where its numbers came from.

The writeup opens with the results at a glance: every problem of the assignment
(`coverage.PROBLEMS`), in the handout's order, with its one-line answer, which the template of
the section that claims it gives through its `glance(problem)` macro from the section's facts
(or its status and the reason, where it was not answered). Then the sections, in the order of
`cs336_systems.sections.SECTIONS`, each already rendered to markdown by its own template, and a
short table of where each section's records came from. The run page holds the rest: the
environment, every commit, and where the run's time went.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from cs336_systems.lm.sizes import SIZE_NAMES_NOTE
from cs336_systems.paths import PACKAGE_DIR
from cs336_systems.records import git_commit, write_text_atomic
from cs336_systems.report.coverage import coverage_rows
from cs336_systems.report.facts import read_facts
from cs336_systems.report.job_times import section_rows
from cs336_systems.report.render import glance, reflow, relative_link, render

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
    """Every problem with what the sections' facts say of it; `section` is the index of the
    section that claims it (None where none does)."""
    claims = {}
    for index, section in enumerate(facts):
        for problem, claim in section.get("coverage", {}).items():
            if problem in claims:
                raise ValueError(f"two sections claim {problem!r}; one problem, one section")
            note = " ".join(str(claim.get("note", "")).split()).replace("|", "\\|")
            claims[problem] = {**claim, "note": note, "section": index,
                               "anchor": claim.get("anchor") or problem.split(" ")[0]}
    return coverage_rows(claims)


ANSWERED = ("answered", "partly answered")


def glance_rows(rows: list[dict], templates: list[str], facts: list[dict]) -> list[dict]:
    """The results at a glance: each coverage row with its one-line `answer`: the glance macro
    of its section's template for an answered problem (followed by what is missing, where it
    was partly answered), else its status and the reason."""
    out = []
    for row in rows:
        problem = row["problem"] + (f" ({row['edition']})" if row["problem"] == "leaderboard"
                                    else "")
        answer = ""
        if row["status"] in ANSWERED:
            index = row["section"]
            answer = glance(templates[index], facts[index], problem, link_base="report")
            if row["status"] == "partly answered" and row["note"]:
                answer = f"{answer} _Partly: {row['note']}_" if answer else row["note"]
        else:
            answer = f"_{row['status']}_" + (f": {row['note']}" if row["note"] else "")
        out.append({**row, "answer": answer.replace("|", "\\|")})
    return out


def render_writeup(sections: list[str], facts: list[str], section_templates: list[str],
                   template: str | Path, run_template: str | Path, output: str | Path,
                   run_output: str | Path, preset: str) -> None:
    """`facts` are results/<preset>/sections/<section>.json, beside the section markdowns;
    `section_templates` the sections' templates, in the same order."""
    all_facts = [read_facts(path) for path in facts]
    names = [Path(path).stem for path in facts]
    times = section_rows([(name, f.get("job_times", {})) for name, f in zip(names, all_facts)])
    context = {
        "preset": preset, "results_dir": Path(facts[0]).parent.parent.as_posix(),
        "header": header_rows(preset, all_facts),
        "glance": glance_rows(coverage(all_facts), section_templates, all_facts),
        "provenance": provenance_rows(names, all_facts),
        "job_times": times,
        "sizes_note": SIZE_NAMES_NOTE,
        "run_page": relative_link(run_output, Path(output).parent),
        "writeup_page": relative_link(output, Path(run_output).parent),
        "sections": [Path(path).read_text().strip() for path in sections],
    }
    write_text_atomic(output, _tidy(render(template, context)))
    write_text_atomic(run_output, _tidy(render(run_template, context)))


def _tidy(text: str) -> str:
    """Prose rewrapped (`render.reflow`), no runs of blank lines, one newline at the end."""
    return reflow(re.sub(r"\n{3,}", "\n\n", text).strip()) + "\n"
