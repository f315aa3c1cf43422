# CS336 Systems pipeline: config -> jobs -> per-configuration JSON -> tables and figures ->
# report/writeup.md. Run `snakemake --cores 1 report/writeup.md`; pick a preset with
# `--config preset=quick`. See README.md.

import os
import sys
from pathlib import Path

# Parse and jobs both use this checkout's package, installed or not, so that the source files a
# rule lists as inputs are the ones its job runs.
SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, SRC)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))

from cs336_systems.config import ConfigError, resolve_preset, validate


configfile: "config.yaml"


try:
    validate(config, Path(workflow.basedir) / "workflow/schemas/config.schema.yaml")
    PRESET, P = resolve_preset(config)
except ConfigError as error:
    raise WorkflowError(str(error)) from None


include: "workflow/rules/common.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/flash.smk"
include: "workflow/rules/distributed.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        "report/writeup.md",
