"""What a Snakemake job runs: `workflow/scripts/job.py` calls the entry point its rule names in
`params.job` with the `snakemake` object of Snakemake's script directive.

    experiment       params.cli (a module with `main(argv)`) on params.args -> one record
    section_tables   a section's report module on its records -> tables, figures, facts JSON
    section_markdown a section's facts through its template -> results/<preset>/sections/<s>.md
    writeup          header, coverage table and the sections in order -> report/writeup.md
    archive          the preset's results, writeup, config and manifest -> one tarball

Each job sends everything it prints, its children's output included, to its `log:` file.
Imports are inside the functions, so an experiment job loads no report code and vice versa
(beyond the package's `__init__`, which every job imports).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


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


def experiment(job) -> None:
    """One configuration: `python -m <params.cli> <params.args> --output <record>`."""
    argv = to_argv(dict(job.params.args)) + ["--output", str(job.output[0])]
    with log_to(job.log[0]):
        print(f"python -m {job.params.cli} {' '.join(argv)}", flush=True)
        importlib.import_module(job.params.cli).main(argv)


def section_tables(job) -> None:
    """Run the report module of section `params.section` (`Section.report`) on the job's named
    record inputs (everything but `code`) and write its facts to `output.facts`."""
    from cs336_systems.report.facts import write_facts
    from cs336_systems.sections import Section

    inputs = {k: v for k, v in _named(job.input).items() if k != "code"}
    outputs = {k: v[0] for k, v in _named(job.output).items() if k != "facts"}
    with log_to(job.log[0]):
        facts = Section(job.params.section).report().build(inputs, dict(job.params.options), outputs)
        write_facts(job.output.facts, facts)


def section_markdown(job) -> None:
    from cs336_systems.report.render import render_section

    with log_to(job.log[0]):
        render_section(job.input.facts, job.input.template, job.output[0],
                       link_base=job.params.link_base)


def writeup(job) -> None:
    from cs336_systems.report.writeup import render_writeup

    with log_to(job.log[0]):
        render_writeup(sections=list(job.input.sections), facts=list(job.input.facts),
                       template=job.input.template, output=job.output[0],
                       preset=job.params.preset)


def archive(job) -> None:
    from cs336_systems.pipeline.archive import write_archive

    with log_to(job.log[0]):
        names = write_archive(job.params.results_dir, job.input.writeup, job.output[0],
                              job.params.preset, dict(job.params.preset_config),
                              heavy=job.params.heavy)
        print(f"{len(names)} files -> {job.output[0]}")
