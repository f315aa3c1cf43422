# Paths and helpers shared by every section's rules.
#
# Every rule runs workflow/scripts/job.py (Snakemake's script directive) with `params.job`
# naming its entry point in cs336_systems.pipeline.jobs: `experiment` (params.cli on params.args ->
# one record), `section_tables`, `section_markdown`, `section_details`, `writeup` or `archive`.
# Jobs run in the Python that runs Snakemake (scripts/setup.sh's .venv, or a GPU box's own CUDA
# build of PyTorch); every rule also names SOFTWARE, the same packages as a conda environment, for
# `--software-deployment-method conda` (and for `snakemake --lint`, which asks it of each rule).

import os
import re

from cs336_systems.lm.optimizer import optimizer_modules
from cs336_systems.pipeline.jobs import TABLES_SUPPORT
from cs336_systems.pipeline.sources import module_sources
from cs336_systems.report.record_schemas import schema_files

# The checkout's own files, as the rules list them: from the working directory where Snakemake
# runs in the checkout, as absolute paths where it runs elsewhere (`--directory`, which
# `archive rerender` uses to render an archive in a folder of its own with this checkout's code).
CHECKOUT = Path(workflow.basedir).resolve()
IN_CHECKOUT = Path.cwd().resolve() == CHECKOUT


def checkout_file(path):
    """A file of this checkout (a path from its root), as a rule's input names it."""
    return str(path) if IN_CHECKOUT else str(CHECKOUT / path)


PACKAGE = checkout_file("src/cs336_systems")
RESULTS = f"results/{PRESET}"
TABLES = f"{RESULTS}/tables"
FIGURES = f"{RESULTS}/figures"
SECTION_DIR = f"{RESULTS}/sections"
LOGS = f"{RESULTS}/logs"
# Every rule's software for `--software-deployment-method conda` (relative to the rules files);
# scripts/setup.sh is the tested path, and without that flag rules run in the current environment.
SOFTWARE = "../envs/cs336.yaml"
JOB_SCRIPT = "../scripts/job.py"
# Where single-device jobs run (config key `device`): cuda jobs record `skipped` without CUDA.
DEVICE = P["device"]
# The optimizer of every training job (config key `optimizer`, lm.optimizer.FLAT_OPTIMIZERS).
OPTIMIZER = P["optimizer"]
# The full matrix (the config's defaults, the assignment's own): each section's report says
# what of it the preset left out.
ASSIGNMENT = config["defaults"]


def sources(*modules):
    """Source files whose change must redo a rule: the modules it runs and what they import."""
    return module_sources(*modules, src_root=CHECKOUT / "src",
                          relative_to=CHECKOUT if IN_CHECKOUT else None)


def step_sources(cli, mode, *modules):
    """The sources of a job running one LM step in `mode`: its CLI, the lazily imported
    `modules` (an attention kernel's), and the optimizer's kernel where the step trains."""
    return sources(cli, *modules, *(optimizer_modules(OPTIMIZER) if mode == "train-step" else []))


def trains(mode):
    """A job's optimizer argument: the preset's where it runs a train step, else none."""
    return {"optimizer": OPTIMIZER} if mode == "train-step" else {}


def one_of(values):
    """A wildcard constraint matching exactly one of `values`."""
    return "|".join(re.escape(str(v)) for v in values)


def log_for(output_pattern):
    """The log of a job, beside the results: results/<preset>/logs/<same path>.log."""
    return str(Path(LOGS) / Path(output_pattern).relative_to(RESULTS).with_suffix(".log"))


def table(name):
    return f"{TABLES}/{name}.csv"


def figure(name):
    return f"{FIGURES}/{name}.png"


def section_file(section, name):
    """A file of a section's folder (docs/architecture.md), from the repository root."""
    return f"{PACKAGE}/sections/{section}/{name}"


def section_partials(wildcards):
    """The macros a section's two templates share: `_*.md.j2` files of its folder, which the
    templates import (`{% from "_loss.md.j2" import ... %}`)."""
    return sorted(str(p) for p in Path(PACKAGE, "sections", wildcards.section).glob("_*.md.j2"))


def caption(name):
    """The caption of a table or figure in `snakemake --report`: captions/<name>.rst in its
    section's folder (the writeup's in report/captions/), as a path from this rules folder."""
    found = sorted(Path(CHECKOUT, "src/cs336_systems").glob(f"**/captions/{name}.rst"))
    if len(found) != 1:
        raise WorkflowError(f"caption {name!r}: {len(found)} files named captions/{name}.rst "
                            f"under {PACKAGE}; there must be one")
    return os.path.relpath(found[0], Path(workflow.basedir, "workflow/rules"))


def facts(section):
    return f"{SECTION_DIR}/{section}.json"


# What each kind of record must hold (sections/*/records.yaml), checked when a table reads it.
RECORD_SCHEMAS = [checkout_file(p.relative_to(CHECKOUT)) for p in schema_files()]


def record_folders(*groups):
    """The folders that hold a section's records, made now where missing. A tables rule lists
    them as inputs: deleting a record changes its folder's modification time, which makes the
    section's tables stale, and remaking them measures the missing record again. (Snakemake by
    itself redoes a missing input only when the job that reads it has to run anyway: a record
    deleted after its tables were made would otherwise go unnoticed.)"""
    folders = sorted({str(Path(path).parent) for group in groups
                      for path in ([group] if isinstance(group, str) else group)})
    for folder in folders:
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise WorkflowError(f"cannot make the records' folder {folder}: "
                                f"{error.strerror or error}; results/ must be writable") from None
    return folders


def tables_inputs(report_module, **records):
    """The inputs of a `<section>_tables` rule: its record groups (named as its report module
    reads them); their folders (see record_folders) and every other record planned in those
    folders (`neighbours`), so that the tables are made after the last write to any of them;
    the record schemas its job checks them against; and the code that makes the tables."""
    folders = record_folders(*records.values())
    own = {str(path) for group in records.values()
           for path in ([group] if isinstance(group, str) else group)}
    return {**records, "folders": folders,
            "neighbours": lambda wildcards: [path for path in planned_records()
                                             if str(Path(path).parent) in folders
                                             and path not in own],
            "schemas": RECORD_SCHEMAS,
            "code": sources(report_module, "cs336_systems.report.record_schemas")}


_PLANNED = []


def planned_records():
    """Every record the writeup is made from: the record inputs of every section's tables
    rule, known once every rules file has been read (call it from an input function or after
    the includes)."""
    if not _PLANNED:
        _PLANNED.extend(sorted({
            str(path)
            for section in SECTIONS
            for name, paths in getattr(rules, f"{section}_tables").input.items()
            if name not in TABLES_SUPPORT
            for path in ([paths] if isinstance(paths, str) else paths)
            if str(path).startswith(f"{RESULTS}/") and str(path).endswith(".json")}))
    return _PLANNED


# What a job asks a scheduler for. profiles/slurm hands these to sbatch (gpu -> --gpus,
# threads -> --cpus-per-task, mem_mb -> --mem, runtime -> --time, in minutes); a local run
# holds jobs only to --cores. A rule whose job measures on the preset's device or on GPUs
# states `threads:` (its processes, when more than one) and `resources: **measuring_job(gpus)`;
# a rule that only reads records and renders (tables, markdown, writeup, archive) states
# nothing and gets the profile's default-resources: no GPU, little memory, a short time.
MEASURING_JOB_MINUTES = 60
# Host memory for each process of a measuring job: the largest model is built there, and a
# profile's trace is exported from there.
MEASURING_JOB_MEM_MB_PER_PROCESS = 32000


def matrix_world_size(matrices):
    """A job's GPUs or ranks as a function of its wildcards: the world size of the job matrix
    its `matrix` wildcard names (`matrices`: name -> settings)."""
    return lambda wildcards: matrices[wildcards.matrix]["world_size"]


def measuring_job(gpus=None, minutes=MEASURING_JOB_MINUTES):
    """Resources of a measuring job: `gpus` (a count, or a function of the wildcards; all on
    one node, which the profile asks for) or by default one GPU, none where the preset runs
    on the CPU; host memory for each of its `threads` processes; a time limit."""
    if gpus is None:
        gpus = 0 if DEVICE == "cpu" else 1
    return {"gpu": gpus, "runtime": minutes,
            "mem_mb": lambda wildcards, threads: MEASURING_JOB_MEM_MB_PER_PROCESS * threads}
