# flash_benchmarking (assignment 4.4): one job per (implementation, seq, d, precision); the
# leaderboard case (4.5, 2025) as one job per implementation; the speed targets as one job per
# group; a kernel-by-kernel profile as one job per shape; then the section's tables, figures
# and facts. Each job lists the kernel modules of its
# own implementations as sources, so editing kernels/flash_triton.py redoes the jobs that run
# flash-triton and nothing else.

from cs336_systems.lm.attention import ATTENTION_IMPLEMENTATIONS, attention_modules
from cs336_systems.sections.flash.kernel_variants import variant_modules
from cs336_systems.sections.flash.targets import GROUPS, group_args, group_modules
from cs336_systems.lm.precision import PRECISIONS

FLASH = P["flash"]
LEADERBOARD = FLASH["leaderboard"]
FLASH_RECORD = f"{RESULTS}/flash/{{attention}}_seq{{seq}}_d{{d}}_{{precision}}.json"
LEADERBOARD_RECORD = f"{RESULTS}/flash_leaderboard/{{attention}}.json"
FLASH_RECORDS = expand(FLASH_RECORD, attention=FLASH["attention"], seq=FLASH["seq_lengths"],
                       d=FLASH["d_heads"], precision=FLASH["precisions"])
LEADERBOARD_RECORDS = expand(LEADERBOARD_RECORD, attention=LEADERBOARD["attention"])
SPEED_RECORD = f"{RESULTS}/flash_speed/{{group}}.json"
SPEED_RECORDS = expand(SPEED_RECORD, group=GROUPS)
KERNELS = FLASH["kernels"]
KERNELS_RECORD = f"{RESULTS}/flash_kernels/{{shape}}.json"
KERNELS_RECORDS = expand(KERNELS_RECORD, shape=KERNELS["shapes"])
FLASH_CATEGORY = "4 FlashAttention-2"


rule flash:
    input:
        # the CLI, plus the kernels of this job's implementation (imported lazily)
        lambda wildcards: sources("cs336_systems.sections.flash.time_flash",
                                  *attention_modules(wildcards.attention)),
    output:
        FLASH_RECORD,
    log:
        log_for(FLASH_RECORD),
    wildcard_constraints:
        attention=one_of(ATTENTION_IMPLEMENTATIONS),
        precision=one_of(PRECISIONS),
        seq=r"\d+",
        d=r"\d+",
    params:
        job="experiment",
        cli="cs336_systems.sections.flash.time_flash",
        args=lambda wildcards: {"attention": wildcards.attention, "seq": wildcards.seq,
                                "d": wildcards.d,
                                "precision": wildcards.precision, "batch_size": FLASH["batch_size"],
                                "causal": FLASH["causal"], "compile": False,
                                "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule flash_leaderboard:
    input:
        lambda wildcards: sources("cs336_systems.sections.flash.time_flash",
                                  *attention_modules(wildcards.attention)),
    output:
        LEADERBOARD_RECORD,
    log:
        log_for(LEADERBOARD_RECORD),
    wildcard_constraints:
        attention=one_of(ATTENTION_IMPLEMENTATIONS),
    params:
        job="experiment",
        cli="cs336_systems.sections.flash.time_flash",
        # the assignment's case: torch.compile of each implementation, causal
        args=lambda wildcards: {"attention": wildcards.attention, "seq": LEADERBOARD["seq"],
                                "d": LEADERBOARD["d"], "precision": LEADERBOARD["precision"],
                                "batch_size": LEADERBOARD["batch_size"], "causal": True,
                                "compile": True, "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


# The speed targets (issue 11): one job per group of targets, timing ours and the group's
# references in one process.
rule flash_speed:
    input:
        lambda wildcards: sources("cs336_systems.sections.flash.time_targets",
                                  *group_modules(wildcards.group)),
    output:
        SPEED_RECORD,
    log:
        log_for(SPEED_RECORD),
    wildcard_constraints:
        group=one_of(GROUPS),
    params:
        job="experiment",
        cli="cs336_systems.sections.flash.time_targets",
        args=lambda wildcards: {**group_args(wildcards.group, FLASH), "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


# Where forward+backward time goes, kernel by kernel: ours (and its atomic-dQ variant) and the
# Gluon kernels beside SDPA's cuDNN and flash backends and FlashAttention-4, profiled in one
# process per shape.
rule flash_kernels:
    input:
        sources("cs336_systems.sections.flash.kernel_profile", "cs336_systems.kernels.launch",
                *variant_modules()),
    output:
        KERNELS_RECORD,
    log:
        log_for(KERNELS_RECORD),
    wildcard_constraints:
        shape=r"\d+x\d+x\d+",
    params:
        job="experiment",
        cli="cs336_systems.sections.flash.kernel_profile",
        args=lambda wildcards: {"shape": wildcards.shape, "precision": KERNELS["precision"],
                                "causal": FLASH["causal"], "steps": KERNELS["steps"],
                                "sustain_s": KERNELS["sustain_s"], "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule flash_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.flash.report",
            records=FLASH_RECORDS,
            leaderboard=LEADERBOARD_RECORDS,
            speed=SPEED_RECORDS,
            kernels=KERNELS_RECORDS,
        ),
    output:
        facts=facts("flash"),
        table=report(table("flash"), caption=caption("flash"), category=FLASH_CATEGORY),
        leaderboard_table=report(table("flash_leaderboard"),
                                 caption=caption("flash_leaderboard"),
                                 category=FLASH_CATEGORY),
        speed_table=report(table("flash_speed"), caption=caption("flash_speed"),
                           category=FLASH_CATEGORY),
        kernels_table=report(table("flash_kernels"), caption=caption("flash_kernels"),
                             category=FLASH_CATEGORY),
        latency_figure=report(figure("flash_latency_vs_seq"),
                              caption=caption("flash_latency_vs_seq"),
                              category=FLASH_CATEGORY),
        speedup_figure=report(figure("flash_speedup"), caption=caption("flash_speedup"),
                              category=FLASH_CATEGORY),
    log:
        f"{LOGS}/flash_tables.log",
    params:
        job="section_tables",
        section="flash",
        # the assignment's matrix: the report says what of it this preset leaves out
        options={"assignment": ASSIGNMENT["flash"]},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
