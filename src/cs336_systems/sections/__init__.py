"""The writeup's sections, in the order they appear, and the contract each one keeps.

A section is one folder here, one rules file and one config block:

    sections/<name>/__init__.py    what the section answers, and its jobs
    sections/<name>/<cli>.py       its CLIs: `main` alone, argument parsing and one call
                                   (`pipeline.cli.record_run`, or `launch_or_work` for ranks);
                                   what they measure lives in the library or in a measuring
                                   module of the section, and no module imports a CLI
    sections/<name>/report.py      build(records, options, outputs) -> facts (`SectionReport`)
    sections/<name>/records.yaml   what each kind of record its jobs write holds, with types
                                   (checked when a table reads it: `report.record_schemas`)
    sections/<name>/template.md.j2 facts -> the section's part of the writeup: each problem's
                                   answers first, then how they were measured and the table or
                                   figure they cite; and `glance(problem)`, a macro giving each
                                   problem's one-line answer for the writeup's first table
    sections/<name>/details.md.j2  facts -> its companion page (report/details/<name>.md):
                                   method, every configuration, spreads, the studies beyond
    sections/<name>/captions/*.rst its tables' and figures' captions in `snakemake --report`
    workflow/rules/<name>.smk      its jobs and its `<name>_tables` rule
    config.yaml: defaults.<name>   its matrix (with its schema in workflow/schemas/)

Adding a section adds those and its name to `SECTIONS` (defined in `cs336_systems.paths`, below
every module that needs it); nothing else central changes (the
Snakefile includes every rules file of this list, `report.smk` renders every section with one
rule, and the writeup concatenates them in this order). `Section(name)` finds each file where
this docstring says, and `tests/pipeline/test_sections.py` holds every section to it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cs336_systems.paths import SECTIONS

__all__ = ["SECTIONS", "Section", "SectionReport"]

HERE = Path(__file__).resolve().parent

Facts = dict[str, Any]


@runtime_checkable
class SectionReport(Protocol):
    """What a section's report module provides (a module satisfies this Protocol).

    `records`: the record groups of its `<name>_tables` rule, {input name: [record paths]};
    `options`: that rule's `params.options` (the assignment's matrix, to say what a preset left
    out); `outputs`: {output name: path} of the tables and figures it must write. It returns
    the section's facts, plain JSON: every number, ratio and verdict word its template uses,
    its tables' markdown, its figures' paths, `env` (where its numbers came from) and
    `coverage` (what it answers of the assignment, `report.facts.covered`).
    """

    def build(self, records: dict[str, list[str]], options: dict[str, Any],
              outputs: dict[str, str]) -> Facts: ...


@dataclass(frozen=True)
class Section:
    """Where the files of section `name` are."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in SECTIONS:
            raise ValueError(f"unknown section {self.name!r}; allowed: {', '.join(SECTIONS)}")

    @property
    def folder(self) -> Path:
        return HERE / self.name

    @property
    def package(self) -> str:
        return f"{__name__}.{self.name}"

    @property
    def report_module(self) -> str:
        return f"{self.package}.report"

    @property
    def template(self) -> Path:
        return self.folder / "template.md.j2"

    @property
    def details(self) -> Path:
        return self.folder / "details.md.j2"

    @property
    def records_schema(self) -> Path:
        return self.folder / "records.yaml"

    @property
    def captions(self) -> Path:
        return self.folder / "captions"

    def rules_file(self, workflow_dir: Path) -> Path:
        return workflow_dir / "rules" / f"{self.name}.smk"

    def report(self) -> SectionReport:
        """The section's report module, checked against the contract."""
        module = importlib.import_module(self.report_module)
        if not isinstance(module, SectionReport):
            raise TypeError(f"{self.report_module} has no build(records, options, outputs); "
                            "see cs336_systems.sections.SectionReport")
        return module
