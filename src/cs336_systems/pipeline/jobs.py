"""What a Snakemake job runs: `workflow/scripts/job.py` turns the `snakemake` object of the script
directive into a `Job` and hands it to `pipeline.jobserver.run`, which runs (through `run_here`)
the entry point its rule names in `params.job`:

    experiment       params.cli (a module with `main(argv)`) on params.args -> one record
    section_tables   a section's report module on its records -> tables, figures, facts JSON
    section_markdown a section's facts through its template -> results/<preset>/sections/<s>.md
    section_details  a section's facts through its details template -> report/details/<s>.md
    writeup          header, coverage table and the sections in order -> report/writeup.md
    archive          the preset's results, writeup, config and manifest -> one tarball

`jobserver.run` first claims the GPUs the job's rule asks for (`pipeline.gpus`: several jobs at once
on a machine with several GPUs never share one), then hands the job to the job server (a warm
process that has imported torch and forks a child per job) unless CS336_JOBSERVER=0, and runs it in
this process when there is none; either way the job runs in a process of its own. Each job sends
everything it prints, its children's output included, to its `log:` file. Imports are inside the
functions, so an experiment job loads no report code and vice versa, and importing this module loads
no torch.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cs336_systems.measure import job_clock

ENTRIES = ("experiment", "section_tables", "section_markdown", "section_details", "writeup",
           "archive")
# The inputs of a tables rule that are not records (workflow/rules/common.smk: tables_inputs).
TABLES_SUPPORT = ("code", "folders", "neighbours", "schemas")


class Files(list):
    """A job's input, output or log paths as Snakemake gives them: a list in order, with the
    named ones as attributes (a path, or a list where the rule gave a list) and `items()`."""

    def __init__(self, paths=(), named=None):
        super().__init__(paths)
        self.named = dict(named or {})

    def __getattr__(self, name):
        try:
            return self.__dict__["named"][name]
        except KeyError:
            raise AttributeError(name) from None

    def items(self):
        return self.named.items()

    @classmethod
    def of(cls, namedlist) -> Files:
        """Snakemake's Namedlist as plain paths."""
        return cls(map(str, namedlist), {name: value if isinstance(value, str) else
                                         [str(v) for v in value]
                                         for name, value in namedlist.items()})


class Params(dict):
    """A job's params: a dict, with attribute access as Snakemake's (`job.params.cli`)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class Job:
    """Everything an entry point reads of a Snakemake job, as plain JSON-able data."""

    entry: str
    params: Params = field(default_factory=Params)
    input: Files = field(default_factory=Files)
    output: Files = field(default_factory=Files)
    log: Files = field(default_factory=Files)
    gpus: int = 0   # the GPUs its rule's `gpu` resource asks for (pipeline.gpus places them)

    def __post_init__(self):
        self.params = Params(self.params)
        if self.entry not in ENTRIES:
            raise ValueError(f"unknown job entry {self.entry!r}; allowed: {', '.join(ENTRIES)}")

    @classmethod
    def from_snakemake(cls, smk) -> Job:
        params = dict(smk.params.items())
        return cls(params.pop("job"), params, Files.of(smk.input), Files.of(smk.output),
                   Files.of(smk.log), int(getattr(smk.resources, "gpu", 0) or 0))

    def to_dict(self) -> dict:
        return {"entry": self.entry, "params": dict(self.params), "gpus": self.gpus,
                **{k: {"paths": list(v), "named": v.named}
                   for k, v in (("input", self.input), ("output", self.output),
                                ("log", self.log))}}

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        files = {k: Files(data[k]["paths"], data[k]["named"]) for k in ("input", "output", "log")}
        return cls(data["entry"], data["params"], **files, gpus=data.get("gpus", 0))


def run_here(job: Job) -> int:
    """Run `job` in this process: 0, or the status its entry point exits with."""
    try:
        globals()[job.entry](job)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


@contextmanager
def log_to(path: str | os.PathLike) -> Iterator[None]:
    """Send file descriptors 1 and 2 (Python's prints, logging, C extensions, subprocesses) to
    `path` for the duration of the block."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        except BaseException:
            traceback.print_exc()  # into the log, where the job's other output went
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def to_argv(args: Mapping[str, object]) -> list[str]:
    """{"context_length": 16, "causal": True, "sizes": [1, 2]} ->
    ["--context-length", "16", "--causal", "--sizes", "1", "2"]; False gives --no-<flag>,
    None leaves the option out."""
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def _named(items) -> dict[str, list[str]]:
    """Snakemake's named inputs or outputs as {name: [paths]}."""
    return {name: [value] if isinstance(value, str) else list(value)
            for name, value in items.items()}


def experiment(job: Job) -> None:
    """One configuration: `python -m <params.cli> <params.args> --output <record>`."""
    argv = to_argv(dict(job.params.args)) + ["--output", str(job.output[0])]
    with log_to(job.log[0]):
        print(f"python -m {job.params.cli} {' '.join(argv)}", flush=True)
        module = importlib.import_module(job.params.cli)
        job_clock.mark("imported")
        module.main(argv)


def report_module(section: str) -> str:
    """The module a section's tables job runs, as `cs336_systems.sections` lays a section out:
    the rule names the section, as an experiment's rule names its CLI."""
    return f"cs336_systems.sections.{section}.report"


def section_tables(job: Job) -> None:
    """Run the report module of section `params.section` (`report_module`) on the job's named
    record inputs (all but TABLES_SUPPORT) and write its facts to `output.facts`, with the job
    times of its records (`report.job_times`) for the writeup's header. Every record is first
    checked against its kind's schema (`report.record_schemas`): a damaged one stops the job
    with one line naming the file, what is wrong and the command that measures it again."""
    from cs336_systems.records import DamagedRecord
    from cs336_systems.report.facts import write_facts
    from cs336_systems.report.job_times import record_times
    from cs336_systems.report.record_schemas import check_record_files

    inputs = {k: v for k, v in _named(job.input).items() if k not in TABLES_SUPPORT}
    outputs = {k: v[0] for k, v in _named(job.output).items() if k != "facts"}
    try:
        with log_to(job.log[0]):
            check_record_files(p for paths in inputs.values() for p in paths
                               if p.endswith(".json"))
            report = importlib.import_module(report_module(job.params.section))
            facts = report.build(inputs, dict(job.params.options), outputs)
            facts["job_times"] = record_times(p for paths in inputs.values() for p in paths)
            write_facts(job.output.facts, facts)
    except DamagedRecord as damaged:  # the file and the command that re-measures it, on the
        print(damaged, file=sys.stderr)  # console rather than a traceback in the log only
        raise SystemExit(1) from None


def section_markdown(job: Job) -> None:
    from cs336_systems.report.render import render_section

    with log_to(job.log[0]):
        render_section(job.input.facts, job.input.template, job.output[0],
                       link_base=job.params.link_base)


def section_details(job: Job) -> None:
    from cs336_systems.report.render import render_details

    with log_to(job.log[0]):
        render_details(job.input.facts, job.input.template, job.output[0],
                       link_base=Path(job.output[0]).parent, writeup=job.params.writeup)


def writeup(job: Job) -> None:
    from cs336_systems.report.writeup import render_writeup

    with log_to(job.log[0]):
        render_writeup(sections=list(job.input.sections), facts=list(job.input.facts),
                       section_templates=list(job.input.section_templates),
                       template=job.input.template, run_template=job.input.run_template,
                       output=job.output.writeup, run_output=job.output.run,
                       preset=job.params.preset)


def archive(job: Job) -> None:
    from cs336_systems.pipeline.archive import MissingRecords, write_archive

    try:
        with log_to(job.log[0]):
            names = write_archive(job.params.results_dir, job.input.writeup, job.output[0],
                                  job.params.preset, dict(job.params.preset_config),
                                  heavy=job.params.heavy, records=list(job.params.records))
            print(f"{len(names)} files -> {job.output[0]}")
    except MissingRecords as missing:  # on the console: which, and the command
        print(missing, file=sys.stderr)
        raise SystemExit(1) from None
