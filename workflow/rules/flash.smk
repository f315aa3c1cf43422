# flash_benchmarking (assignment section 3.4): one job per (implementation, seq, d, dtype),
# the leaderboard case (3.5) as its own records, then one table, two figures.

from cs336_systems.experiments.flash import DTYPES, IMPLEMENTATIONS, implementation_modules

FLASH = P["flash"]
FLASH_RECORD = f"{RESULTS}/flash/{{impl}}_seq{{seq}}_d{{d}}_{{dtype}}.json"
LEADERBOARD_RECORD = f"{RESULTS}/flash_leaderboard/{{impl}}.json"
FLASH_WILDCARDS = dict(impl=one_of(IMPLEMENTATIONS), dtype=one_of(DTYPES), seq=r"\d+", d=r"\d+")


def flash_sources(wildcards):
    """The CLI and, per implementation, the kernel it runs: editing the Triton kernel
    redoes the Triton jobs only."""
    return sources("cs336_systems.experiments.flash", *implementation_modules(wildcards.impl))


def flash_records():
    return expand(FLASH_RECORD, impl=FLASH["implementations"], seq=FLASH["seq_lengths"],
                  d=FLASH["d_heads"], dtype=FLASH["dtypes"])


def leaderboard_records():
    return expand(LEADERBOARD_RECORD, impl=FLASH["leaderboard"]["implementations"])


rule flash:
    input:
        flash_sources,
    output:
        FLASH_RECORD,
    wildcard_constraints:
        **FLASH_WILDCARDS,
    params:
        batch_size=FLASH["batch_size"],
        causal="--causal" if FLASH["causal"] else "--no-causal",
    resources:
        gpu=1,
    shell:
        "{PYTHON} -m cs336_systems.experiments.flash --impl {wildcards.impl} --seq {wildcards.seq}"
        " --d {wildcards.d} --dtype {wildcards.dtype} --batch-size {params.batch_size}"
        " {params.causal} --output {output}"


rule flash_leaderboard:
    input:
        flash_sources,
    output:
        LEADERBOARD_RECORD,
    wildcard_constraints:
        impl=FLASH_WILDCARDS["impl"],
    params:
        board=FLASH["leaderboard"],
    resources:
        gpu=1,
    shell:
        "{PYTHON} -m cs336_systems.experiments.flash --impl {wildcards.impl} --compile --causal"
        " --seq {params.board[seq]} --d {params.board[d]} --dtype {params.board[dtype]}"
        " --batch-size {params.board[batch_size]} --output {output}"


rule flash_table:
    input:
        records=flash_records(),
        leaderboard=leaderboard_records(),
        code=sources("cs336_systems.report.sections.flash"),
    output:
        csv=f"{TABLES}/flash.csv",
        markdown=f"{TABLES}/flash.md",
        leaderboard_csv=f"{TABLES}/flash_leaderboard.csv",
        latency_figure=f"{FIGURES}/flash_latency_vs_seq.png",
        speedup_figure=f"{FIGURES}/flash_speedup.png",
    shell:
        "{PYTHON} -m cs336_systems.report.sections.flash --records {input.records}"
        " --leaderboard-records {input.leaderboard}"
        " --csv {output.csv} --markdown {output.markdown}"
        " --leaderboard-csv {output.leaderboard_csv}"
        " --latency-figure {output.latency_figure} --speedup-figure {output.speedup_figure}"
