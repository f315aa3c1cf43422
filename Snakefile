# CS336 Systems pipeline: config -> jobs -> per-configuration JSON -> tables, figures and facts ->
# one markdown file per section -> report/writeup.md. Run `snakemake --cores 1 report/writeup.md`;
# pick a preset with `--config preset=quick`. See README.md and docs/architecture.md.

import sys
from pathlib import Path

# Parsing imports this checkout's package, installed or not (jobs do the same through
# workflow/scripts/job.py), so the sources a rule lists are the code its jobs run.
sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from cs336_systems.pipeline.config import (
    ConfigError,
    resolve_preset,
    validate,
    with_typed_overrides,
)
from cs336_systems.records import unwritable
from cs336_systems.sections import SECTIONS


configfile: "config.yaml"


try:
    # `--config` values come in as text where they are nested: typed as config.yaml would be
    with_typed_overrides(config, getattr(workflow.config_settings, "overwrite_config", None))
    validate(config, Path(workflow.basedir) / "workflow/schemas/config.schema.yaml")
    PRESET, P = resolve_preset(config)
except ConfigError as error:
    raise WorkflowError(str(error)) from None


include: "workflow/rules/common.smk"


for section in SECTIONS:  # one rules file per section, in writeup order

    include: f"workflow/rules/{section}.smk"


include: "workflow/rules/report.smk"
include: "workflow/rules/archive.smk"


rule all:
    input:
        "report/writeup.md",


onstart:
    # before any job runs (not on a dry run): one line, not a traceback after a measurement
    for folder in (RESULTS, LOGS, "report"):
        if problem := unwritable(folder):
            sys.exit(problem)
