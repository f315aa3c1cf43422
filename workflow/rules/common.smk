# Helpers shared by every section's rules.

import re
import shlex
import sys

from cs336_systems.sources import module_sources

# Jobs run with the interpreter that runs Snakemake, so `.venv/bin/snakemake` needs no activation.
PYTHON = shlex.quote(sys.executable)
RESULTS = f"results/{PRESET}"
TABLES = f"{RESULTS}/tables"
FIGURES = f"{RESULTS}/figures"


def sources(*modules):
    """Source files whose change must redo a rule: the modules it runs and what they import."""
    return module_sources(*modules, src_root=Path(workflow.basedir) / "src",
                          relative_to=Path(workflow.basedir))


def one_of(values):
    """A wildcard constraint matching exactly one of `values`."""
    return "|".join(re.escape(str(v)) for v in values)
