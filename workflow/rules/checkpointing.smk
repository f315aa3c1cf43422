# gradient_checkpointing (assignment 2): (b) one job per checkpoint block size (`none`: no
# checkpointing) that measures a step's peak memory and time; (a) one job that runs the nested
# strategies on real blocks on the CPU, beside the simulation that the section's report
# computes from the library. Then the section's tables, figures and facts.

from cs336_systems.lm.attention import attention_modules
from cs336_systems.lm.step import MODES
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.precision import PRECISIONS

CKPT = P["checkpointing"]
CKPT_RECORD = (f"{RESULTS}/checkpointing/{{size}}_ctx{{context_length}}_{{mode}}_{{precision}}"
               "_block{block_size}.json")
CKPT_NESTED_RECORD = (f"{RESULTS}/checkpointing/nested_{{size}}_ctx{{context_length}}"
                      "_b{batch_size}.json")
CKPT_CATEGORY = "2 gradient_checkpointing"
# a block size as the records name it: the number, or none (null: no checkpointing)
CKPT_BLOCK_SIZES = ["none" if k is None else k for k in CKPT["block_sizes"]]


rule checkpointing:
    input:
        sources("cs336_systems.sections.checkpointing.time_checkpointing",
                *attention_modules(CKPT["attention"])),
    output:
        CKPT_RECORD,
    log:
        log_for(CKPT_RECORD),
    wildcard_constraints:
        size=one_of(MODEL_SIZES),
        mode=one_of(MODES),
        precision=one_of(PRECISIONS),
        context_length=r"\d+",
        block_size=r"\d+|none",
    params:
        job="experiment",
        cli="cs336_systems.sections.checkpointing.time_checkpointing",
        args=lambda wildcards: {
            "size": wildcards.size, "context_length": wildcards.context_length,
            "mode": wildcards.mode, "precision": wildcards.precision,
            # none leaves the option out: no checkpointing
            "checkpoint_block_size": None if wildcards.block_size == "none"
            else int(wildcards.block_size),
            "batch_size": CKPT["batch_size"], "attention": CKPT["attention"],
            "warmup_steps": CKPT["warmup_steps"], "measure_steps": CKPT["measure_steps"],
            "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule checkpointing_nested:
    input:
        sources("cs336_systems.sections.checkpointing.nested_checkpointing"),
    output:
        CKPT_NESTED_RECORD,
    log:
        log_for(CKPT_NESTED_RECORD),
    wildcard_constraints:
        size=one_of(MODEL_SIZES),
        context_length=r"\d+",
        batch_size=r"\d+",
    params:
        job="experiment",
        cli="cs336_systems.sections.checkpointing.nested_checkpointing",
        # always the CPU: a check of the simulator, with the live-tensor stand-in
        args=lambda wildcards: {**wildcards, "blocks": CKPT["nested"]["blocks"],
                                "device": "cpu"},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule checkpointing_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.checkpointing.report",
            records=expand(CKPT_RECORD, size=CKPT["size"], context_length=CKPT["context_length"],
                           mode=CKPT["mode"], precision=CKPT["precision"],
                           block_size=CKPT_BLOCK_SIZES),
            nested=expand(CKPT_NESTED_RECORD, **{k: CKPT["nested"][k] for k in
                                                 ("size", "context_length", "batch_size")}),
        ),
    output:
        facts=facts("checkpointing"),
        simulation_table=report(table("checkpointing_simulation"),
                                caption=caption("checkpointing_simulation"),
                                category=CKPT_CATEGORY),
        simulation_figure=report(figure("checkpointing_simulation"),
                                 caption=caption("checkpointing_simulation_figure"),
                                 category=CKPT_CATEGORY),
        nested_table=report(table("checkpointing_nested"),
                            caption=caption("checkpointing_nested"), category=CKPT_CATEGORY),
        step_table=report(table("checkpointing"), caption=caption("checkpointing"),
                          category=CKPT_CATEGORY),
        step_figure=report(figure("checkpointing"), caption=caption("checkpointing_figure"),
                           category=CKPT_CATEGORY),
    log:
        f"{LOGS}/checkpointing_tables.log",
    params:
        job="section_tables",
        section="checkpointing",
        options={"simulation": CKPT["simulation"], "assignment": ASSIGNMENT["checkpointing"]},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
