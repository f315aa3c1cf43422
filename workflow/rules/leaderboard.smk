# leaderboard (8, 2026): one job per variant of the training step (sections/leaderboard/runs.py:
# the stock parts, ours with every lever, ours with each lever off), all at one shape in one job
# matrix; a job of world_size GPUs launches itself under torchrun. Then the section's tables
# and facts.

from cs336_systems.sections.leaderboard.runs import VARIANTS as LEADERBOARD_VARIANTS

BOARD = P["leaderboard"]
BOARD_RECORD = f"{RESULTS}/leaderboard/{{variant}}.json"
BOARD_CATEGORY = "8 Leaderboard (2026)"
BOARD_GPUS = 0 if DEVICE == "cpu" else BOARD["world_size"]


rule leaderboard:
    input:
        lambda wildcards: sources("cs336_systems.sections.leaderboard.time_leaderboard",
                                  *LEADERBOARD_VARIANTS[wildcards.variant].modules()),
    output:
        BOARD_RECORD,
    log:
        log_for(BOARD_RECORD),
    wildcard_constraints:
        variant=one_of(LEADERBOARD_VARIANTS),
    params:
        job="experiment",
        cli="cs336_systems.sections.leaderboard.time_leaderboard",
        args=lambda wildcards: {
            "variant": wildcards.variant,
            **{key: BOARD[key] for key in ("shape", "layers", "context_length", "world_size",
                                           "precision", "check_tokens", "warmup_steps",
                                           "measure_steps", "cold_caches")},
            "device": DEVICE},
    threads: BOARD["world_size"]
    resources:
        **measuring_job(BOARD_GPUS),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule leaderboard_tables:
    input:
        records=expand(BOARD_RECORD, variant=BOARD["variants"]),
        code=sources("cs336_systems.sections.leaderboard.report"),
    output:
        facts=facts("leaderboard"),
        table=report(table("leaderboard"), caption=caption("leaderboard"),
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
