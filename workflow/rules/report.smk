# The writeup: every section's table and figures rendered through the templates.

WRITEUP_TEMPLATES = sorted(str(p.relative_to(workflow.basedir)) for p in
                           Path(workflow.basedir).glob("src/cs336_systems/report/templates/*.md"))


rule writeup:
    input:
        benchmark_table=rules.benchmark_table.output.csv,
        benchmark_scaling_figure=rules.benchmark_table.output.scaling_figure,
        benchmark_warmup_figure=rules.benchmark_table.output.warmup_figure,
        flash_table=rules.flash_table.output.csv,
        flash_leaderboard_table=rules.flash_table.output.leaderboard_csv,
        flash_latency_figure=rules.flash_table.output.latency_figure,
        flash_speedup_figure=rules.flash_table.output.speedup_figure,
        allreduce_table=rules.distributed_tables.output.allreduce_csv,
        ddp_table=rules.distributed_tables.output.ddp_csv,
        sharded_table=rules.distributed_tables.output.sharded_csv,
        accounting_table=rules.distributed_tables.output.accounting_csv,
        allreduce_figure=rules.distributed_tables.output.allreduce_figure,
        ddp_figure=rules.distributed_tables.output.ddp_figure,
        code=sources("cs336_systems.report.writeup"),
        templates=WRITEUP_TEMPLATES,
    output:
        "report/writeup.md",
    params:
        preset=PRESET,
    shell:
        "{PYTHON} -m cs336_systems.report.writeup --preset {params.preset} --results-dir {RESULTS}"
        " --benchmark-table {input.benchmark_table}"
        " --benchmark-scaling-figure {input.benchmark_scaling_figure}"
        " --benchmark-warmup-figure {input.benchmark_warmup_figure}"
        " --flash-table {input.flash_table}"
        " --flash-leaderboard-table {input.flash_leaderboard_table}"
        " --flash-latency-figure {input.flash_latency_figure}"
        " --flash-speedup-figure {input.flash_speedup_figure}"
        " --allreduce-table {input.allreduce_table} --ddp-table {input.ddp_table}"
        " --sharded-table {input.sharded_table} --accounting-table {input.accounting_table}"
        " --allreduce-figure {input.allreduce_figure} --ddp-figure {input.ddp_figure}"
        " --output {output}"
