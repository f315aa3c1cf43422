# fsdp and fsdp_accounting (assignment 6.2, 2026): one torchrun job per FSDP variant (ours,
# torch's fully_shard as the reference, bucketed DDP as the unsharded baseline), all of one
# model shape in one job matrix; then the section's tables, figure and facts.

from cs336_systems.distributed.variants import FSDP_VARIANTS

FSDP_CONFIG = P["fsdp"]
FSDP_RECORD = f"{RESULTS}/fsdp/{{run}}.json"
FSDP_CATEGORY = "6 Sharding"
# A run is named by its variant; the bucketed (DDP) one by its bucket size too: bucketed-<MB>mb.
FSDP_RUNS = [f"bucketed-{FSDP_CONFIG['bucket_size_mb']:g}mb" if v == "bucketed" else v
             for v in FSDP_CONFIG["variants"]]
FSDP_GPUS = 0 if DEVICE == "cpu" else FSDP_CONFIG["world_size"]


rule fsdp:
    input:
        step_sources("cs336_systems.sections.fsdp.time_fsdp", "train-step"),
    output:
        FSDP_RECORD,
    log:
        log_for(FSDP_RECORD),
    wildcard_constraints:
        run=one_of(v for v in FSDP_VARIANTS if v != "bucketed") + r"|bucketed-[\d.]+mb",
    params:
        job="experiment",
        cli="cs336_systems.sections.fsdp.time_fsdp",
        # "bucketed-100mb" -> variant bucketed, bucket_size_mb 100. The trace is a parameter,
        # not an output: a run without one (skipped, failed) must not fail the job.
        args=lambda wildcards: {
            "variant": wildcards.run.partition("-")[0],
            "bucket_size_mb": wildcards.run.partition("-")[2].removesuffix("mb") or None,
            **{key: FSDP_CONFIG[key] for key in ("size", "context_length", "batch_size",
                                                 "world_size", "compute_dtype", "warmup_steps",
                                                 "measure_steps")},
            "trace": f"{RESULTS}/fsdp/{wildcards.run}.trace.json.gz",
            "device": DEVICE, **trains("train-step"),
        },
    threads: FSDP_CONFIG["world_size"]
    resources:
        **measuring_job(FSDP_GPUS),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule fsdp_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.fsdp.report",
            records=expand(FSDP_RECORD, run=FSDP_RUNS),
        ),
    output:
        facts=facts("fsdp"),
        table=report(table("fsdp"), caption=caption("fsdp"), category=FSDP_CATEGORY),
        gather_table=report(table("fsdp_gathers"), caption=caption("fsdp_gathers"),
                            category=FSDP_CATEGORY),
        gather_figure=report(figure("fsdp_gathers"), caption=caption("fsdp_gathers_figure"),
                             category=FSDP_CATEGORY),
    log:
        f"{LOGS}/fsdp_tables.log",
    params:
        job="section_tables",
        section="fsdp",
        # the assignment's shape: the report says where this preset departs from it
        options={"assignment": ASSIGNMENT["fsdp"]},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
