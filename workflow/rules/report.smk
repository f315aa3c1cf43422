# The writeup: every section's table and figures rendered through the templates.

WRITEUP_TEMPLATES = sorted(str(p.relative_to(workflow.basedir)) for p in
                           Path(workflow.basedir).glob("src/cs336_systems/report/templates/*.md"))


rule writeup:
    input:
        benchmark_table=rules.benchmark_table.output.csv,
        benchmark_scaling_figure=rules.benchmark_table.output.scaling_figure,
        benchmark_warmup_figure=rules.benchmark_table.output.warmup_figure,
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
        " --output {output}"
