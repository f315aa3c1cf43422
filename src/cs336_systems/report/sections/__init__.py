"""The writeup's sections, one report module each, in the order they appear.

A section is four files: `workflow/rules/<name>.smk` (its jobs, and a `<name>_tables` rule),
an experiment CLI (`cs336_systems.experiments`), its report module here (`build(records,
options, outputs) -> facts`) and its template (`report/templates/<name>.md.j2`). Adding one
means adding those and its name to this list; nothing else central changes.
"""

SECTIONS: tuple[str, ...] = ("benchmark", "profile", "mixed_precision", "memory", "residuals",
                             "checkpointing", "attention", "flash", "distributed", "fsdp",
                             "parallelism")
