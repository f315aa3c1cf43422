# autograd_residuals (assignment 2) and memory_profiling (f) (1.5): one job per RMSNorm variant
# and per (context, heads, variant) of one TransformerBlock, each counting what the forward
# saves for backward through saved-tensor hooks and what the block's backward produces; then
# the section's tables, figure and facts.

from cs336_systems.sections.residuals.saved import VARIANTS

RES = P["residuals"]
RES_RMSNORM = RES["rmsnorm"]
RES_BLOCK = RES["block"]
RES_RMSNORM_RECORD = (f"{RESULTS}/residuals/rmsnorm_d{{d_model}}_b{{batch_size}}"
                      "_ctx{context_length}_{variant}_{precision}.json")
RES_BLOCK_RECORD = (f"{RESULTS}/residuals/block_{{size}}_h{{num_heads}}_b{{batch_size}}"
                    "_ctx{context_length}_{variant}_{precision}.json")
# null heads are the size's own: the record's name says the number
RES_HEADS = sorted({h or MODEL_SIZES[RES_BLOCK["size"]].num_heads for h in RES_BLOCK["num_heads"]})
RESIDUALS_CATEGORY = "2 autograd_residuals"


rule residuals_rmsnorm:
    input:
        sources("cs336_systems.sections.residuals.count_saved"),
    output:
        RES_RMSNORM_RECORD,
    log:
        log_for(RES_RMSNORM_RECORD),
    wildcard_constraints:
        variant=one_of(VARIANTS),
        precision=one_of(PRECISIONS),
        d_model=r"\d+",
        batch_size=r"\d+",
        context_length=r"\d+",
    params:
        job="experiment",
        cli="cs336_systems.sections.residuals.count_saved",
        args=lambda wildcards: {"target": "rmsnorm", **wildcards, "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule residuals_block:
    input:
        sources("cs336_systems.sections.residuals.count_saved"),
    output:
        RES_BLOCK_RECORD,
    log:
        log_for(RES_BLOCK_RECORD),
    wildcard_constraints:
        size=one_of(MODEL_SIZES),
        variant=one_of(VARIANTS),
        precision=one_of(PRECISIONS),
        num_heads=r"\d+",
        batch_size=r"\d+",
        context_length=r"\d+",
    params:
        job="experiment",
        cli="cs336_systems.sections.residuals.count_saved",
        args=lambda wildcards: {"target": "block", **wildcards, "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule residuals_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.residuals.report",
            rmsnorm=expand(RES_RMSNORM_RECORD, variant=VARIANTS, precision=RES["precision"],
                           **RES_RMSNORM),
            block=expand(RES_BLOCK_RECORD, size=RES_BLOCK["size"], num_heads=RES_HEADS,
                         batch_size=RES_BLOCK["batch_size"],
                         context_length=RES_BLOCK["context_lengths"],
                         variant=RES_BLOCK["variants"], precision=RES["precision"]),
        ),
    output:
        facts=facts("residuals"),
        table=report(table("residuals"), caption=caption("residuals"),
                     category=RESIDUALS_CATEGORY),
        operations_table=report(table("residuals_operations"),
                                caption=caption("residuals_operations"),
                                category=RESIDUALS_CATEGORY),
        block_table=report(table("memory_profiling_f"), caption=caption("memory_profiling_f"),
                           category="1.5 memory_profiling"),
        figure=report(figure("residuals_by_tensor"), caption=caption("residuals_by_tensor"),
                      category=RESIDUALS_CATEGORY),
    log:
        f"{LOGS}/residuals_tables.log",
    params:
        job="section_tables",
        section="residuals",
        options={"assignment": ASSIGNMENT["residuals"]},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
