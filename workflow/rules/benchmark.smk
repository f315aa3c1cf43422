# benchmarking_script (assignment 1.1): one job per (size, context length, mode, precision,
# warm-up count), then the section's tables, figures and facts.

from cs336_systems.lm.attention import attention_modules
from cs336_systems.lm.step import MODES
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.precision import PRECISIONS

BENCH = P["benchmark"]
BENCH_RECORD = (f"{RESULTS}/benchmark/{{size}}_ctx{{context_length}}_{{mode}}_{{precision}}"
                "_warmup{warmup_steps}.json")
BENCH_RECORDS = sorted(
    set(expand(BENCH_RECORD, size=BENCH["sizes"], context_length=BENCH["context_lengths"],
               mode=BENCH["modes"], precision=BENCH["precisions"],
               warmup_steps=BENCH["warmup_steps"]))
    | set(expand(BENCH_RECORD, size=BENCH["warmup_ablation"]["sizes"],
                 context_length=BENCH["warmup_ablation"]["context_length"],
                 mode=BENCH["warmup_ablation"]["mode"],
                 precision=BENCH["warmup_ablation"]["precision"],
                 warmup_steps=BENCH["warmup_ablation"]["warmup_steps"]))
)


rule benchmark:
    input:
        # plus the kernels of an attention implementation and an optimizer imported lazily
        lambda wildcards: step_sources("cs336_systems.sections.benchmark.time_step",
                                       wildcards.mode, *attention_modules(BENCH["attention"])),
    output:
        BENCH_RECORD,
    log:
        log_for(BENCH_RECORD),
    wildcard_constraints:
        size=one_of(MODEL_SIZES),
        mode=one_of(MODES),
        precision=one_of(PRECISIONS),
        context_length=r"\d+",
        warmup_steps=r"\d+",
    params:
        job="experiment",
        cli="cs336_systems.sections.benchmark.time_step",
        args=lambda wildcards: {**wildcards, "measure_steps": BENCH["measure_steps"],
                                "batch_size": BENCH["batch_size"],
                                "attention": BENCH["attention"], "device": DEVICE,
                                **trains(wildcards.mode)},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule benchmark_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.benchmark.report",
            records=BENCH_RECORDS,
        ),
    output:
        facts=facts("benchmark"),
        table=report(table("benchmark"), caption=caption("benchmark"),
                     category="1.1 benchmarking_script"),
        scaling_figure=report(figure("benchmark_time_vs_size"),
                              caption=caption("benchmark_time_vs_size"),
                              category="1.1 benchmarking_script"),
        warmup_figure=report(figure("benchmark_warmup"), caption=caption("benchmark_warmup"),
                             category="1.1 benchmarking_script"),
    log:
        f"{LOGS}/benchmark_tables.log",
    params:
        job="section_tables",
        section="benchmark",
        options={"main_warmup_steps": BENCH["warmup_steps"],
                 "assignment": ASSIGNMENT["benchmark"]},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
