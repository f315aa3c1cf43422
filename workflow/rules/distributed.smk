# Distributed data parallel (assignment 5) and sharding (6). Each measuring job launches
# torchrun with its world size (cs336_systems.pipeline.torchrun) and declares the GPUs it
# takes; a run the machine cannot hold writes a `skipped` record with the reason.

from cs336_systems.distributed.launch import BACKENDS
from cs336_systems.distributed.variants import DDP_VARIANTS
from cs336_systems.lm.model import MODEL_SIZES

DIST = P["distributed"]
ALLREDUCE = DIST["allreduce"]
DDP_CONFIG = DIST["ddp"]
SHARDED_CONFIG = DIST["sharded_optimizer"]

ALLREDUCE_RECORD = f"{RESULTS}/allreduce/{{backend}}_{{size_mb}}mb_world{{world_size}}.json"
# A DDP run is named by its model size (2025's xl, 2026's xl = our 2.7b) and its variant.
DDP_RECORD = f"{RESULTS}/ddp/{{size}}/{{variant}}.json"
SHARDED_RECORD = f"{RESULTS}/sharded_optimizer/{{sharding}}.json"
ACCOUNTING_RECORD = f"{RESULTS}/distributed/communication_accounting.json"
DDP_CHECK_RECORD = f"{RESULTS}/distributed/ddp_check.json"

# A DDP run is named by its variant, the bucketed one by its bucket size too: bucketed-<MB>mb.
DDP_RUNS = [v for v in DDP_VARIANTS if v in DDP_CONFIG["variants"] and v != "bucketed"]
if "bucketed" in DDP_CONFIG["variants"]:
    DDP_RUNS += [f"bucketed-{mb:g}mb" for mb in DDP_CONFIG["bucket_sizes_mb"]]
# Where DDP and ShardedOptimizer run (nccl on GPUs, gloo on CPUs) follows the preset's device.
DDP_GPUS = 0 if DEVICE == "cpu" else DDP_CONFIG["world_size"]
SHARDED_GPUS = 0 if DEVICE == "cpu" else SHARDED_CONFIG["world_size"]

DISTRIBUTED_RECORDS = {
    "allreduce": expand(ALLREDUCE_RECORD, backend=ALLREDUCE["backends"],
                        size_mb=[f"{s:g}" for s in ALLREDUCE["sizes_mb"]],
                        world_size=ALLREDUCE["world_sizes"]),
    "ddp": expand(DDP_RECORD, size=DDP_CONFIG["sizes"], variant=DDP_RUNS),
    "ddp_check": [DDP_CHECK_RECORD],
    "sharded": expand(SHARDED_RECORD, sharding=["sharded", "replicated"]),
    "accounting": [ACCOUNTING_RECORD],
}


rule allreduce:
    input:
        sources("cs336_systems.sections.distributed.time_allreduce"),
    output:
        ALLREDUCE_RECORD,
    log:
        log_for(ALLREDUCE_RECORD),
    wildcard_constraints:
        backend=one_of(BACKENDS),
        size_mb=r"[\d.]+",
        world_size=r"\d+",
    params:
        job="experiment",
        cli="cs336_systems.sections.distributed.time_allreduce",
        # the device follows the backend: nccl on GPUs, gloo on CPUs
        args=lambda wildcards: {**wildcards, "warmup_steps": ALLREDUCE["warmup_steps"],
                                "measure_steps": ALLREDUCE["measure_steps"]},
    threads: lambda wildcards: int(wildcards.world_size)
    resources:
        **measuring_job(lambda wildcards: int(wildcards.world_size)
                        if wildcards.backend == "nccl" else 0),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule ddp:
    input:
        step_sources("cs336_systems.sections.distributed.time_ddp", "train-step"),
    output:
        DDP_RECORD,
    log:
        log_for(DDP_RECORD),
    wildcard_constraints:
        size=one_of(MODEL_SIZES),
        variant=one_of(v for v in DDP_VARIANTS if v != "bucketed") + r"|bucketed-[\d.]+mb",
    params:
        job="experiment",
        cli="cs336_systems.sections.distributed.time_ddp",
        # "bucketed-10mb" -> variant bucketed, bucket_size_mb 10; "naive" -> naive, None.
        # The trace is a parameter, not an output: a run without one (skipped, or rank 0's
        # export failing) must not fail the job.
        args=lambda wildcards: {
            "variant": wildcards.variant.partition("-")[0],
            "bucket_size_mb": wildcards.variant.partition("-")[2].removesuffix("mb") or None,
            "size": wildcards.size,
            **{key: DDP_CONFIG[key] for key in ("context_length", "batch_size", "world_size",
                                                "warmup_steps", "measure_steps")},
            "trace": f"{RESULTS}/ddp/{wildcards.size}/{wildcards.variant}.trace.json.gz",
            "device": DEVICE, **trains("train-step"),
        },
    threads: DDP_CONFIG["world_size"]
    resources:
        **measuring_job(DDP_GPUS),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule sharded_optimizer:
    input:
        step_sources("cs336_systems.sections.distributed.time_sharded_optimizer", "train-step"),
    output:
        SHARDED_RECORD,
    log:
        log_for(SHARDED_RECORD),
    wildcard_constraints:
        sharding="sharded|replicated",
    params:
        job="experiment",
        cli="cs336_systems.sections.distributed.time_sharded_optimizer",
        args=lambda wildcards: {
            "sharded": wildcards.sharding == "sharded",
            **{key: SHARDED_CONFIG[key] for key in ("size", "context_length", "batch_size",
                                                    "world_size", "warmup_steps",
                                                    "measure_steps")},
            "device": DEVICE, **trains("train-step"),
        },
    threads: SHARDED_CONFIG["world_size"]
    resources:
        **measuring_job(SHARDED_GPUS),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule ddp_check:
    """naive_ddp's check: our DDP variants against single-process training, on CPUs (gloo, two
    ranks, the tiny model, a few steps: seconds), the same in every preset."""
    input:
        sources("cs336_systems.sections.distributed.check_ddp"),
    output:
        DDP_CHECK_RECORD,
    log:
        log_for(DDP_CHECK_RECORD),
    params:
        job="experiment",
        cli="cs336_systems.sections.distributed.check_ddp",
        args={"world_size": 2, "steps": 3, "device": "cpu"},
    threads: 2
    resources:
        **measuring_job(0, minutes=5),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule communication_accounting:
    input:
        sources("cs336_systems.sections.distributed.communication_accounting"),
    output:
        ACCOUNTING_RECORD,
    log:
        log_for(ACCOUNTING_RECORD),
    params:
        job="experiment",
        cli="cs336_systems.sections.distributed.communication_accounting",
        args={},  # the assignment's constants are the inputs: nothing to choose
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule distributed_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.distributed.report",
            **DISTRIBUTED_RECORDS,
        ),
    output:
        facts=facts("distributed"),
        allreduce_table=report(table("allreduce"), caption=caption("allreduce"),
                               category="5 Distributed data parallel"),
        ddp_table=report(table("ddp"), caption=caption("ddp"),
                         category="5 Distributed data parallel"),
        sharded_table=report(table("sharded_optimizer"), caption=caption("sharded_optimizer"),
                             category="6 Sharding"),
        accounting_table=report(table("communication_accounting"),
                                caption=caption("communication_accounting"),
                                category="5 Distributed data parallel"),
        allreduce_figure=report(figure("allreduce_bandwidth"),
                                caption=caption("allreduce_bandwidth"),
                                category="5 Distributed data parallel"),
        ddp_figure=report(figure("ddp_step_time"), caption=caption("ddp_step_time"),
                          category="5 Distributed data parallel"),
        overlap_figure=report(figure("ddp_overlap"), caption=caption("ddp_overlap"),
                              category="5 Distributed data parallel"),
    log:
        f"{LOGS}/distributed_tables.log",
    params:
        job="section_tables",
        section="distributed",
        # the assignment's matrix: the report says what of it this preset leaves out
        options={"assignment": ASSIGNMENT["distributed"]},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
