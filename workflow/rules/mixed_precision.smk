# mixed_precision_accumulation and benchmarking_mixed_precision (assignment 1.3, 1.4): one job
# for the four accumulation loops, one per autocast dtype for the toy model's dtypes, one for
# LayerNorm's errors in every precision; (c), bf16 against fp32 timings, reads the benchmark's
# records of its main sweep (benchmark.smk makes them). Then the section's tables and facts.

MP = P["mixed_precision"]
MP_ACCUMULATION_RECORD = f"{RESULTS}/mixed_precision/accumulation.json"
MP_TOY_RECORD = f"{RESULTS}/mixed_precision/toy_model_{{precision}}.json"
MP_LAYERNORM_RECORD = f"{RESULTS}/mixed_precision/layernorm.json"
MP_BENCH_RECORDS = expand(BENCH_RECORD, size=BENCH["sizes"],
                          context_length=BENCH["context_lengths"], mode=BENCH["modes"],
                          precision=[p for p in BENCH["precisions"] if p in ("fp32", "bf16")],
                          warmup_steps=BENCH["warmup_steps"])
MIXED_PRECISION_CATEGORY = "1.3-1.4 mixed precision"


rule mixed_precision_accumulation:
    input:
        sources("cs336_systems.sections.mixed_precision.run_study"),
    output:
        MP_ACCUMULATION_RECORD,
    log:
        log_for(MP_ACCUMULATION_RECORD),
    params:
        job="experiment",
        cli="cs336_systems.sections.mixed_precision.run_study",
        args={"part": "accumulation", **MP["accumulation"], "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule mixed_precision_toy_model:
    input:
        sources("cs336_systems.sections.mixed_precision.run_study"),
    output:
        MP_TOY_RECORD,
    log:
        log_for(MP_TOY_RECORD),
    wildcard_constraints:
        precision=one_of(PRECISIONS),
    params:
        job="experiment",
        cli="cs336_systems.sections.mixed_precision.run_study",
        args=lambda wildcards: {
            "part": "toy-model", "precision": wildcards.precision,
            **{k: v for k, v in MP["toy_model"].items() if k != "precisions"},
            "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule mixed_precision_layernorm:
    input:
        sources("cs336_systems.sections.mixed_precision.run_study"),
    output:
        MP_LAYERNORM_RECORD,
    log:
        log_for(MP_LAYERNORM_RECORD),
    params:
        job="experiment",
        cli="cs336_systems.sections.mixed_precision.run_study",
        args={"part": "layernorm", **MP["layernorm"], "device": DEVICE},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule mixed_precision_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.mixed_precision.report",
            accumulation=MP_ACCUMULATION_RECORD,
            toy_model=expand(MP_TOY_RECORD, precision=MP["toy_model"]["precisions"]),
            layernorm=MP_LAYERNORM_RECORD,
            benchmark=MP_BENCH_RECORDS,
        ),
    output:
        facts=facts("mixed_precision"),
        accumulation_table=report(table("mixed_precision_accumulation"),
                                  caption=caption("mixed_precision_accumulation"),
                                  category=MIXED_PRECISION_CATEGORY),
        toy_model_table=report(table("mixed_precision_toy_model"),
                               caption=caption("mixed_precision_toy_model"),
                               category=MIXED_PRECISION_CATEGORY),
        layernorm_table=report(table("mixed_precision_layernorm"),
                               caption=caption("mixed_precision_layernorm"),
                               category=MIXED_PRECISION_CATEGORY),
        speedup_table=report(table("mixed_precision_speedup"),
                             caption=caption("mixed_precision_speedup"),
                             category=MIXED_PRECISION_CATEGORY),
        speedup_figure=report(figure("mixed_precision_speedup"),
                              caption=caption("mixed_precision_speedup_figure"),
                              category=MIXED_PRECISION_CATEGORY),
    log:
        f"{LOGS}/mixed_precision_tables.log",
    params:
        job="section_tables",
        section="mixed_precision",
        options={"assignment": ASSIGNMENT["benchmark"]},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
