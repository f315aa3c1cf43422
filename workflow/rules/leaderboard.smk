# leaderboard (8, 2026): one job per variant of the training step (sections/leaderboard/runs.py:
# the stock parts, ours with every lever, ours with each lever off) in each of the preset's job
# matrices (all layers on the leaderboard's GPUs, or a one-GPU proxy); a job of world_size GPUs
# launches itself under torchrun. Beside them, one job times the LM head and its loss alone,
# each way of taking them (ours, the whole logits, the stock fused losses) on the same inputs.
# Then the section's tables and facts.

from cs336_systems.lm.loss import KERNEL_MODULE as LOSS_KERNEL_MODULE
from cs336_systems.sections.leaderboard.runs import VARIANTS as LEADERBOARD_VARIANTS

BOARD = P["leaderboard"]
BOARD_MATRICES = {matrix["name"]: matrix for matrix in BOARD["matrices"]}
BOARD_RECORD = f"{RESULTS}/leaderboard/{{matrix}}/{{variant}}.json"
BOARD_RECORDS = [BOARD_RECORD.format(matrix=matrix["name"], variant=variant)
                 for matrix in BOARD["matrices"] for variant in matrix["variants"]]
BOARD_CATEGORY = "8 Leaderboard (2026)"
BOARD_WORLD = matrix_world_size(BOARD_MATRICES)
BOARD_LOSS_RECORD = f"{RESULTS}/leaderboard_loss/{BOARD['shape']}.json"  # a folder of its own


rule leaderboard:
    input:
        lambda wildcards: sources("cs336_systems.sections.leaderboard.time_leaderboard",
                                  *LEADERBOARD_VARIANTS[wildcards.variant].modules()),
    output:
        BOARD_RECORD,
    log:
        log_for(BOARD_RECORD),
    wildcard_constraints:
        matrix=one_of(BOARD_MATRICES),
        variant=one_of(LEADERBOARD_VARIANTS),
    params:
        job="experiment",
        cli="cs336_systems.sections.leaderboard.time_leaderboard",
        args=lambda wildcards: {
            "variant": wildcards.variant,
            **{key: BOARD_MATRICES[wildcards.matrix][key] for key in ("layers", "world_size")},
            **{key: BOARD[key] for key in ("shape", "context_length", "precision",
                                           "check_tokens", "warmup_steps", "measure_steps",
                                           "cold_caches", "profile")},
            "device": DEVICE},
    threads: BOARD_WORLD
    resources:
        **measuring_job(lambda wildcards: 0 if DEVICE == "cpu" else BOARD_WORLD(wildcards)),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule leaderboard_loss:
    input:
        sources("cs336_systems.sections.leaderboard.time_loss", LOSS_KERNEL_MODULE),
    output:
        BOARD_LOSS_RECORD,
    log:
        log_for(BOARD_LOSS_RECORD),
    params:
        job="experiment",
        cli="cs336_systems.sections.leaderboard.time_loss",
        args={**BOARD["loss"], "shape": BOARD["shape"], "precision": BOARD["precision"],
              "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule leaderboard_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.leaderboard.report",
            records=BOARD_RECORDS,
            loss=[BOARD_LOSS_RECORD],
        ),
    output:
        facts=facts("leaderboard"),
        table=report(table("leaderboard"), caption=caption("leaderboard"),
                     category=BOARD_CATEGORY),
        loss_table=report(table("leaderboard_loss"), caption=caption("leaderboard_loss"),
                          category=BOARD_CATEGORY),
    log:
        f"{LOGS}/leaderboard_tables.log",
    params:
        job="section_tables",
        section="leaderboard",
        options={"assignment": ASSIGNMENT["leaderboard"]},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
