# pytorch_attention and torch_compile (assignment 3.1, 3.2): one job per (variant, d, seq,
# memory cap) of attention alone, eager or compiled; the benchmark's jobs with the whole model
# compiled beside the same configurations run vanilla (the benchmark rule makes those); then
# the section's tables, figures and facts. The flash section's table is read too: its measured
# memory answers "how to remove it".

ATTN = P["attention"]
ATTN_RECORD = f"{RESULTS}/attention/{{variant}}_d{{d}}_seq{{seq}}_{{cap}}.json"
# a memory cap in a path: `uncapped`, or `cap24gib`
ATTN_CAPS = ["uncapped" if c is None else f"cap{c:g}gib" for c in ATTN["memory_cap_gib"]]
ATTN_RECORDS = expand(ATTN_RECORD, variant=ATTN["variants"], d=ATTN["d_heads"],
                      seq=ATTN["seq_lengths"], cap=ATTN_CAPS)
MODEL_COMPILE = ATTN["model_compile"]
COMPILED_RECORD = (f"{RESULTS}/torch_compile/{{size}}_ctx{{context_length}}_{{mode}}_{{precision}}"
                   "_warmup{warmup_steps}.json")
MODEL_COMPILE_CONFIGS = dict(size=MODEL_COMPILE["sizes"],
                             context_length=MODEL_COMPILE["context_length"],
                             mode=MODEL_COMPILE["modes"], precision=MODEL_COMPILE["precision"],
                             warmup_steps=BENCH["warmup_steps"])
ATTENTION_CATEGORY = "3 Attention and torch.compile"


rule attention:
    input:
        sources("cs336_systems.sections.attention.time_attention"),
    output:
        ATTN_RECORD,
    log:
        log_for(ATTN_RECORD),
    wildcard_constraints:
        variant="eager|compiled",
        d=r"\d+",
        seq=r"\d+",
        cap=r"uncapped|cap[\d.]+gib",
    params:
        job="experiment",
        cli="cs336_systems.sections.attention.time_attention",
        args=lambda wildcards: {
            "d": wildcards.d, "seq": wildcards.seq, "compile": wildcards.variant == "compiled",
            "memory_cap_gib": None if wildcards.cap == "uncapped"
            else wildcards.cap.removeprefix("cap").removesuffix("gib"),
            "batch_size": ATTN["batch_size"], "causal": ATTN["causal"],
            "warmup_steps": ATTN["warmup_steps"], "measure_steps": ATTN["measure_steps"], "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule benchmark_compiled:
    input:
        lambda wildcards: step_sources("cs336_systems.sections.benchmark.time_step",
                                       wildcards.mode, *attention_modules(BENCH["attention"])),
    output:
        COMPILED_RECORD,
    log:
        log_for(COMPILED_RECORD),
    wildcard_constraints:
        size=one_of(MODEL_SIZES),
        mode=one_of(MODES),
        precision=one_of(PRECISIONS),
        context_length=r"\d+",
        warmup_steps=r"\d+",
    params:
        job="experiment",
        cli="cs336_systems.sections.benchmark.time_step",
        args=lambda wildcards: {**wildcards, "compile": True,
                                "measure_steps": BENCH["measure_steps"],
                                "batch_size": BENCH["batch_size"],
                                "attention": BENCH["attention"], "device": DEVICE,
                                **trains(wildcards.mode)},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule attention_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.attention.report",
            records=ATTN_RECORDS,
            compiled_model=expand(COMPILED_RECORD, **MODEL_COMPILE_CONFIGS),
            vanilla_model=expand(BENCH_RECORD, **MODEL_COMPILE_CONFIGS),
        ),
        flash_table=table("flash"),  # not a record: the flash section's table
    output:
        facts=facts("attention"),
        table=report(table("attention"), caption=caption("attention"),
                     category=ATTENTION_CATEGORY),
        model_table=report(table("torch_compile_model"), caption=caption("torch_compile_model"),
                           category=ATTENTION_CATEGORY),
        memory_figure=report(figure("attention_memory"), caption=caption("attention_memory"),
                             category=ATTENTION_CATEGORY),
    log:
        f"{LOGS}/attention_tables.log",
    params:
        job="section_tables",
        section="attention",
        options={"assignment": ASSIGNMENT["attention"]},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
