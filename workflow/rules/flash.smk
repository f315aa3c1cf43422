# flash_benchmarking (assignment 4.4): one job per (implementation, seq, d, dtype); the
# leaderboard case (4.5, 2025) as one job per implementation; then the section's tables,
# figures and facts. Each job lists the kernel module of its own implementation as a source,
# so editing kernels/flash_triton.py redoes the flash-triton jobs and nothing else.

from cs336_systems.attention import ATTENTION_IMPLEMENTATIONS, attention_modules
from cs336_systems.timing import PRECISIONS

FLASH = P["flash"]
LEADERBOARD = FLASH["leaderboard"]
FLASH_RECORD = f"{RESULTS}/flash/{{impl}}_seq{{seq}}_d{{d}}_{{dtype}}.json"
LEADERBOARD_RECORD = f"{RESULTS}/flash_leaderboard/{{impl}}.json"
FLASH_RECORDS = expand(FLASH_RECORD, impl=FLASH["implementations"], seq=FLASH["seq_lengths"],
                       d=FLASH["d_heads"], dtype=FLASH["dtypes"])
LEADERBOARD_RECORDS = expand(LEADERBOARD_RECORD, impl=LEADERBOARD["implementations"])
FLASH_CATEGORY = "4 FlashAttention-2"


rule flash:
    input:
        # the CLI, plus the kernels of this job's implementation (imported lazily)
        lambda wildcards: sources("cs336_systems.experiments.flash",
                                  *attention_modules(wildcards.impl)),
    output:
        FLASH_RECORD,
    log:
        log_for(FLASH_RECORD),
    wildcard_constraints:
        impl=one_of(ATTENTION_IMPLEMENTATIONS),
        dtype=one_of(PRECISIONS),
        seq=r"\d+",
        d=r"\d+",
    params:
        job="experiment",
        cli="cs336_systems.experiments.flash",
        args=lambda wildcards: {"impl": wildcards.impl, "seq": wildcards.seq, "d": wildcards.d,
                                "dtype": wildcards.dtype, "batch_size": FLASH["batch_size"],
                                "causal": FLASH["causal"], "compile": False,
                                "device": DEVICE},
    resources:
        **measuring_job(),
    script:
        JOB_SCRIPT


rule flash_leaderboard:
    input:
        lambda wildcards: sources("cs336_systems.experiments.flash",
                                  *attention_modules(wildcards.impl)),
    output:
        LEADERBOARD_RECORD,
    log:
        log_for(LEADERBOARD_RECORD),
    wildcard_constraints:
        impl=one_of(ATTENTION_IMPLEMENTATIONS),
    params:
        job="experiment",
        cli="cs336_systems.experiments.flash",
        # the assignment's case: torch.compile of each implementation, causal
        args=lambda wildcards: {"impl": wildcards.impl, "seq": LEADERBOARD["seq"],
                                "d": LEADERBOARD["d"], "dtype": LEADERBOARD["dtype"],
                                "batch_size": LEADERBOARD["batch_size"], "causal": True,
                                "compile": True, "device": DEVICE},
    resources:
        **measuring_job(),
    script:
        JOB_SCRIPT


rule flash_tables:
    input:
        records=FLASH_RECORDS,
        leaderboard=LEADERBOARD_RECORDS,
        code=sources("cs336_systems.report.sections.flash"),
    output:
        facts=facts("flash"),
        table=report(table("flash"), caption=caption("flash"), category=FLASH_CATEGORY),
        leaderboard_table=report(table("flash_leaderboard"),
                                 caption=caption("flash_leaderboard"),
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
    script:
        JOB_SCRIPT
