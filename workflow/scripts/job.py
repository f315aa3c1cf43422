# The one script of every rule (Snakemake's script directive defines `snakemake`): it runs the
# job's entry point, `cs336_systems.pipeline.jobs.<params.job>`, from this checkout's src/, so
# that the code a job runs is the code its rule lists as inputs.
import sys
from pathlib import Path

# scriptdir reads like workflow/rules/../scripts: resolve it before walking up
sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # noqa: F821

from cs336_systems.pipeline import jobs  # noqa: E402

getattr(jobs, snakemake.params.job)(snakemake)  # noqa: F821
