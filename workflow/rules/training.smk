# A training step against stock parts: one job per (size, run) of the section's table of runs
# (ours in every combination of attention, optimizer and compilation; the stock parts), all in
# one job matrix, and one job per size timing every optimizer's step in one process; then the
# section's tables and facts.

from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.sections.training.runs import RUNS

TRAIN = P["training"]
TRAIN_RECORD = f"{RESULTS}/training/{{size}}/{{run}}.json"
OPTIMIZER_RECORD = f"{RESULTS}/optimizer_step/{{size}}.json"
TRAIN_CATEGORY = "Training step"


rule training:
    input:
        lambda wildcards: sources("cs336_systems.sections.training.time_training",
                                  *RUNS[wildcards.run].modules()),
    output:
        TRAIN_RECORD,
    log:
        log_for(TRAIN_RECORD),
    wildcard_constraints:
        size=one_of(MODEL_SIZES),
        run=one_of(RUNS),
    params:
        job="experiment",
        cli="cs336_systems.sections.training.time_training",
        args=lambda wildcards: {"run": wildcards.run, "size": wildcards.size,
                                **{key: TRAIN[key] for key in (
                                    "context_length", "batch_size", "precision",
                                    "warmup_steps", "measure_steps")},
                                "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule optimizer_step:
    input:
        sources("cs336_systems.sections.training.time_optimizer",
                *(m for name in TRAIN["optimizer_step"]["optimizers"]
                  for m in optimizer_modules(name))),
    output:
        OPTIMIZER_RECORD,
    log:
        log_for(OPTIMIZER_RECORD),
    wildcard_constraints:
        size=one_of(MODEL_SIZES),
    params:
        job="experiment",
        cli="cs336_systems.sections.training.time_optimizer",
        args=lambda wildcards: {"size": wildcards.size,
                                "optimizers": TRAIN["optimizer_step"]["optimizers"],
                                "rounds": TRAIN["optimizer_step"]["rounds"], "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule training_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.training.report",
            training=expand(TRAIN_RECORD, size=TRAIN["sizes"], run=TRAIN["runs"]),
            optimizer=expand(OPTIMIZER_RECORD, size=TRAIN["optimizer_step"]["sizes"]),
        ),
    output:
        facts=facts("training"),
        training_table=report(table("training_step"), caption=caption("training_step"),
                              category=TRAIN_CATEGORY),
        optimizer_table=report(table("optimizer_step"), caption=caption("optimizer_step"),
                               category=TRAIN_CATEGORY),
    log:
        f"{LOGS}/training_tables.log",
    params:
        job="section_tables",
        section="training",
        options={"assignment": ASSIGNMENT["training"]},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
