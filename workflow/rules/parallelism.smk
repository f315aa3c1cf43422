# Analysing parallelism strategies (assignment 7, 2026): one CPU job checks the library's
# formulas (simulated ring collectives, FLOPs counted by torch, the tensor-parallel backward
# against autograd); the section's report derives the formulas in sympy and evaluates them per
# model size with C and W measured by other sections: the benchmark's 16-bit records (C) and
# the NCCL all-reduce records (W), or the config's nominal values where this preset has none.

PAR = P["parallelism"]
PAR_CHECKS_RECORD = f"{RESULTS}/parallelism/checks.json"
PAR_CATEGORY = "7 Parallelism strategies"
# W: the preset's NCCL all-reduce records (distributed.smk makes them)
PAR_ALLREDUCE_RECORDS = expand(ALLREDUCE_RECORD, backend=[b for b in ALLREDUCE["backends"]
                                                          if b == "nccl"],
                               size_mb=[f"{s:g}" for s in ALLREDUCE["sizes_mb"]],
                               world_size=ALLREDUCE["world_sizes"])
# C: the benchmark's main-sweep records in 16-bit precisions (benchmark.smk makes them)
PAR_BENCH_RECORDS = expand(BENCH_RECORD, size=BENCH["sizes"],
                           context_length=BENCH["context_lengths"], mode=BENCH["modes"],
                           precision=[p for p in BENCH["precisions"] if p in ("bf16", "fp16")],
                           warmup_steps=BENCH["warmup_steps"])


rule parallelism_checks:
    input:
        sources("cs336_systems.sections.parallelism.check_parallelism"),
    output:
        PAR_CHECKS_RECORD,
    log:
        log_for(PAR_CHECKS_RECORD),
    params:
        job="experiment",
        cli="cs336_systems.sections.parallelism.check_parallelism",
        args=PAR["checks"],
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule parallelism_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.parallelism.report",
            checks=PAR_CHECKS_RECORD,
            allreduce=PAR_ALLREDUCE_RECORDS,
            benchmark=PAR_BENCH_RECORDS,
        ),
    output:
        facts=facts("parallelism"),
        limits_table=report(table("parallelism_limits"), caption=caption("parallelism_limits"),
                            category=PAR_CATEGORY),
        times_table=report(table("parallelism_times"), caption=caption("parallelism_times"),
                           category=PAR_CATEGORY),
        collectives_table=report(table("parallelism_collectives"),
                                 caption=caption("parallelism_collectives"),
                                 category=PAR_CATEGORY),
        flops_table=report(table("parallelism_flops"), caption=caption("parallelism_flops"),
                           category=PAR_CATEGORY),
        ratio_figure=report(figure("parallelism_ratio"), caption=caption("parallelism_ratio"),
                            category=PAR_CATEGORY),
    log:
        f"{LOGS}/parallelism_tables.log",
    params:
        job="section_tables",
        section="parallelism",
        options={k: PAR[k] for k in ("sizes", "batch_tokens", "devices", "nominal")},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
