# memory_profiling (assignment 1.5, parts (a)-(e)): one job per (size, context length, mode,
# precision) that records the CUDA allocator's history over measured steps, then the section's
# tables, timeline figures (one per mode, a panel per context and precision) and facts. Beside
# each record, named after it: the snapshot and torch's HTML viewer (heavy, out of git and of
# the archive unless archive_heavy) and the compact timeline the figures are drawn from. They are
# not outputs, since a skipped job writes none.

from cs336_systems.lm.step import MODES
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.precision import PRECISIONS

MEM = P["memory"]
MEM_RECORD = f"{RESULTS}/memory/{{size}}_ctx{{context_length}}_{{mode}}_{{precision}}.json"
MEMORY_CATEGORY = "1.5 memory_profiling"
# One timeline figure per mode, named without the hyphen (train-step: timeline_train_step).
MEM_MODE_KEYS = [mode.replace("-", "_") for mode in MEM["modes"]]


rule memory:
    input:
        lambda wildcards: step_sources("cs336_systems.sections.memory.record_memory",
                                       wildcards.mode),
    output:
        MEM_RECORD,
    log:
        log_for(MEM_RECORD),
    wildcard_constraints:
        size=one_of(MODEL_SIZES),
        mode=one_of(MODES),
        precision=one_of(PRECISIONS),
        context_length=r"\d+",
    params:
        job="experiment",
        cli="cs336_systems.sections.memory.record_memory",
        args=lambda wildcards: {**wildcards, "batch_size": MEM["batch_size"],
                                "warmup_steps": MEM["warmup_steps"],
                                "measure_steps": MEM["measure_steps"],
                                "max_entries": MEM["max_entries"], "device": DEVICE,
                                **trains(wildcards.mode)},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule memory_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.memory.report",
            records=expand(MEM_RECORD, size=MEM["sizes"], context_length=MEM["context_lengths"],
                           mode=MEM["modes"], precision=MEM["precisions"]),
        ),
    output:
        facts=facts("memory"),
        peak_table=report(table("memory_peaks"), caption=caption("memory_peaks"),
                          category=MEMORY_CATEGORY),
        allocations_table=report(table("memory_largest_allocations"),
                                 caption=caption("memory_largest_allocations"),
                                 category=MEMORY_CATEGORY),
        **{
            f"timeline_{key}": report(figure(f"memory_timeline_{key}"),
                                      caption=caption("memory_timeline"),
                                      category=MEMORY_CATEGORY)
            for key in MEM_MODE_KEYS
        },
    log:
        f"{LOGS}/memory_tables.log",
    params:
        job="section_tables",
        section="memory",
        options={"assignment": ASSIGNMENT["memory"]},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
