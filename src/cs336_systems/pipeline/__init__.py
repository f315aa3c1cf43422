"""The pipeline's plumbing: config.py (the config and its checks), jobs.py (what a Snakemake job
runs), sources.py (the source files of a rule), records.py (the one record writer), cli.py and
options.py (what the section CLIs share), torchrun.py (multi-process jobs), archive.py."""
