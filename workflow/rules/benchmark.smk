# benchmarking_script (assignment section 1.1): one job per
# (size, context length, mode, precision, warm-up count), then one table, two figures.

from cs336_systems.attention import ATTENTION_SOURCES
from cs336_systems.model import MODEL_SIZES
from cs336_systems.lm_step import MODES
from cs336_systems.timing import PRECISIONS

BENCH = P["benchmark"]
BENCH_RECORD = (f"{RESULTS}/benchmark/{{size}}_ctx{{context_length}}_{{mode}}_{{precision}}"
                "_warmup{warmup_steps}.json")


def benchmark_records():
    main = expand(BENCH_RECORD, size=BENCH["sizes"], context_length=BENCH["context_lengths"],
                  mode=BENCH["modes"], precision=BENCH["precisions"],
                  warmup_steps=BENCH["warmup_steps"])
    ablation = BENCH["warmup_ablation"]
    warmup = expand(BENCH_RECORD, size=ablation["sizes"], context_length=ablation["context_length"],
                    mode=ablation["mode"], precision=ablation["precision"],
                    warmup_steps=ablation["warmup_steps"])
    return sorted(set(main) | set(warmup))


rule benchmark:
    input:
        # plus the kernels of an attention implementation that is imported lazily
        sources("cs336_systems.experiments.benchmark",
                *ATTENTION_SOURCES.get(BENCH["attention"], ())),
    output:
        BENCH_RECORD,
    wildcard_constraints:
        size=one_of(MODEL_SIZES),
        mode=one_of(MODES),
        precision=one_of(PRECISIONS),
        context_length=r"\d+",
        warmup_steps=r"\d+",
    params:
        batch_size=BENCH["batch_size"],
        measure_steps=BENCH["measure_steps"],
        attention=BENCH["attention"],
    resources:
        gpu=1,
    shell:
        "{PYTHON} -m cs336_systems.experiments.benchmark --size {wildcards.size}"
        " --context-length {wildcards.context_length} --mode {wildcards.mode}"
        " --precision {wildcards.precision} --warmup-steps {wildcards.warmup_steps}"
        " --measure-steps {params.measure_steps} --batch-size {params.batch_size}"
        " --attention {params.attention} --output {output}"


rule benchmark_table:
    input:
        records=benchmark_records(),
        code=sources("cs336_systems.report.sections.benchmark"),
    output:
        csv=f"{TABLES}/benchmark.csv",
        markdown=f"{TABLES}/benchmark.md",
        scaling_figure=f"{FIGURES}/benchmark_time_vs_size.png",
        warmup_figure=f"{FIGURES}/benchmark_warmup.png",
    params:
        main_warmup_steps=BENCH["warmup_steps"],
    shell:
        "{PYTHON} -m cs336_systems.report.sections.benchmark --records {input.records}"
        " --main-warmup-steps {params.main_warmup_steps}"
        " --csv {output.csv} --markdown {output.markdown}"
        " --scaling-figure {output.scaling_figure} --warmup-figure {output.warmup_figure}"
