# Distributed data parallel and sharding (assignment section 4). Each job launches torchrun
# with its world size (cs336_systems.experiments.torchrun) and declares the GPUs it takes;
# a run the machine cannot hold writes a `skipped` record with the reason.

DIST = P["distributed"]
ALLREDUCE_RECORD = f"{RESULTS}/allreduce/{{backend}}_{{size_mb}}mb_world{{world_size}}.json"
DDP_RECORD = f"{RESULTS}/ddp/{{variant}}.json"
SHARDED_RECORD = f"{RESULTS}/sharded_optimizer/{{sharding}}.json"
ACCOUNTING_RECORD = f"{RESULTS}/communication_accounting.json"


def gpus_for(backend, world_size):
    """GPUs a job takes (for schedulers that hand them out, e.g. profiles/slurm)."""
    return world_size if backend == "nccl" else 0


def ddp_variant_names():
    """naive, flat, overlap, torch, and one bucketed-<MB>mb per bucket size."""
    names = [v for v in DIST["ddp"]["variants"] if v != "bucketed"]
    if "bucketed" in DIST["ddp"]["variants"]:
        names += [f"bucketed-{mb:g}mb" for mb in DIST["ddp"]["bucket_sizes_mb"]]
    return names


def ddp_variant_arguments(wildcards):
    if wildcards.variant.startswith("bucketed-"):
        mb = wildcards.variant.removeprefix("bucketed-").removesuffix("mb")
        return f"--variant bucketed --bucket-size-mb {mb}"
    return f"--variant {wildcards.variant}"


def distributed_records():
    a = DIST["allreduce"]
    return {
        "allreduce": expand(ALLREDUCE_RECORD, backend=a["backends"],
                            size_mb=[f"{s:g}" for s in a["sizes_mb"]], world_size=a["world_sizes"]),
        "ddp": expand(DDP_RECORD, variant=ddp_variant_names()),
        "sharded": expand(SHARDED_RECORD, sharding=["sharded", "replicated"]),
        "accounting": [ACCOUNTING_RECORD],
    }


rule allreduce:
    input:
        sources("cs336_systems.experiments.allreduce"),
    output:
        ALLREDUCE_RECORD,
    wildcard_constraints:
        backend="gloo|nccl",
        size_mb=r"[\d.]+",
        world_size=r"\d+",
    params:
        warmup=DIST["allreduce"]["warmup"],
        iterations=DIST["allreduce"]["iterations"],
    threads: lambda wildcards: int(wildcards.world_size)
    resources:
        gpu=lambda wildcards: gpus_for(wildcards.backend, int(wildcards.world_size)),
    shell:
        "{PYTHON} -m cs336_systems.experiments.allreduce --backend {wildcards.backend}"
        " --size-mb {wildcards.size_mb} --world-size {wildcards.world_size}"
        " --warmup {params.warmup} --iterations {params.iterations} --output {output}"


rule ddp:
    input:
        sources("cs336_systems.experiments.ddp"),
    output:
        DDP_RECORD,
    wildcard_constraints:
        variant=r"naive|flat|overlap|torch|bucketed-[\d.]+mb",
    params:
        variant=ddp_variant_arguments,
        c=DIST["ddp"],
        trace=lambda wildcards: f"{RESULTS}/ddp/{wildcards.variant}.trace.json.gz",
    threads: DIST["ddp"]["world_size"]
    resources:
        gpu=DIST["ddp"]["world_size"],
    shell:
        "{PYTHON} -m cs336_systems.experiments.ddp {params.variant} --size {params.c[size]}"
        " --context-length {params.c[context_length]} --batch-size {params.c[batch_size]}"
        " --world-size {params.c[world_size]} --warmup-steps {params.c[warmup_steps]}"
        " --measure-steps {params.c[measure_steps]} --trace {params.trace} --output {output}"


rule sharded_optimizer:
    input:
        sources("cs336_systems.experiments.sharded_optimizer"),
    output:
        SHARDED_RECORD,
    wildcard_constraints:
        sharding="sharded|replicated",
    params:
        flag=lambda wildcards: "--sharded" if wildcards.sharding == "sharded" else "--no-sharded",
        c=DIST["sharded_optimizer"],
    threads: DIST["sharded_optimizer"]["world_size"]
    resources:
        gpu=DIST["sharded_optimizer"]["world_size"],
    shell:
        "{PYTHON} -m cs336_systems.experiments.sharded_optimizer {params.flag}"
        " --size {params.c[size]} --context-length {params.c[context_length]}"
        " --batch-size {params.c[batch_size]} --world-size {params.c[world_size]}"
        " --warmup-steps {params.c[warmup_steps]} --measure-steps {params.c[measure_steps]}"
        " --output {output}"


rule communication_accounting:
    input:
        sources("cs336_systems.experiments.communication_accounting"),
    output:
        ACCOUNTING_RECORD,
    shell:
        "{PYTHON} -m cs336_systems.experiments.communication_accounting --output {output}"


rule distributed_tables:
    input:
        **distributed_records(),
        code=sources("cs336_systems.report.sections.distributed"),
    output:
        allreduce_csv=f"{TABLES}/allreduce.csv",
        ddp_csv=f"{TABLES}/ddp.csv",
        sharded_csv=f"{TABLES}/sharded_optimizer.csv",
        accounting_csv=f"{TABLES}/communication_accounting.csv",
        allreduce_figure=f"{FIGURES}/allreduce_bandwidth.png",
        ddp_figure=f"{FIGURES}/ddp_step_time.png",
    shell:
        "{PYTHON} -m cs336_systems.report.sections.distributed"
        " --allreduce-records {input.allreduce} --ddp-records {input.ddp}"
        " --sharded-records {input.sharded} --accounting-record {input.accounting}"
        " --allreduce-csv {output.allreduce_csv} --ddp-csv {output.ddp_csv}"
        " --sharded-csv {output.sharded_csv} --accounting-csv {output.accounting_csv}"
        " --allreduce-figure {output.allreduce_figure} --ddp-figure {output.ddp_figure}"
