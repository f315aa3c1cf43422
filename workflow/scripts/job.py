# The one script of every rule (Snakemake's script directive defines `snakemake`): it runs the
# job's entry point, `cs336_systems.pipeline.jobs.<params.job>`, from this checkout's src/, so
# that the code a job runs is the code its rule lists as inputs. It imports no torch: the job
# runs in a child of the job server (cs336_systems.pipeline.jobserver), or here without one.
import sys
import time
from pathlib import Path

entered = time.time()
# scriptdir reads like workflow/rules/../scripts: resolve it before walking up
sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # noqa: F821

from cs336_systems.measure import job_clock  # noqa: E402
from cs336_systems.pipeline import jobs, jobserver  # noqa: E402

# Snakemake writes the script it runs (this one behind its preamble) when it dispatches the job:
# its mtime is the job's start. (`__file__` names workflow/scripts/job.py instead.)
job_clock.mark("dispatched", Path(sys.argv[0]).stat().st_mtime)
if (started := job_clock.process_started()) is not None:
    job_clock.mark("process", started)
job_clock.mark("entry", entered)
sys.exit(jobserver.run(jobs.Job.from_snakemake(snakemake)))  # noqa: F821
