# nsys_profile (assignment 1.2): one job per (tool, size, context length, mode) that times the
# configuration with the harness, then profiles measured steps only; then the section's
# tables, figure and facts. The trace (or the Nsight Systems report) lies beside each record,
# named after it; it is not an output, since a skipped job writes none.

from cs336_systems.sections.profile.step_profile import TOOLS

PROF = P["profile"]
PROF_RECORD = (f"{RESULTS}/profile/{{tool}}/{{size}}_ctx{{context_length}}_{{mode}}"
               "_{precision}.json")
PROF_CONFIGS = dict(size=PROF["sizes"], context_length=PROF["context_lengths"],
                    mode=PROF["modes"], precision=PROF["precision"])


rule profile:
    input:
        lambda wildcards: step_sources("cs336_systems.sections.profile.profile_step",
                                       wildcards.mode, *attention_modules(PROF["attention"])),
    output:
        PROF_RECORD,
    log:
        log_for(PROF_RECORD),
    wildcard_constraints:
        tool=one_of(TOOLS),
        size=one_of(MODEL_SIZES),
        mode=one_of(MODES),
        precision=one_of(PRECISIONS),
        context_length=r"\d+",
    params:
        job="experiment",
        cli="cs336_systems.sections.profile.profile_step",
        args=lambda wildcards: {**wildcards, "batch_size": PROF["batch_size"],
                                "warmup_steps": PROF["warmup_steps"],
                                "measure_steps": PROF["measure_steps"],
                                "attention": PROF["attention"], "device": DEVICE,
                                **trains(wildcards.mode)},
    resources:
        **measuring_job(),
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule profile_tables:
    input:
        **tables_inputs(
            "cs336_systems.sections.profile.report",
            records=expand(PROF_RECORD, tool="torch", **PROF_CONFIGS),
            nsys_records=expand(PROF_RECORD, tool="nsys", **PROF_CONFIGS) if PROF["nsys"] else [],
        ),
    output:
        facts=facts("profile"),
        kernel_table=report(table("profile_kernels"), caption=caption("profile_kernels"),
                            category="1.2 nsys_profile"),
        summary_table=report(table("profile"), caption=caption("profile"),
                             category="1.2 nsys_profile"),
        figure=report(figure("profile_breakdown"), caption=caption("profile_breakdown"),
                      category="1.2 nsys_profile"),
    log:
        f"{LOGS}/profile_tables.log",
    params:
        job="section_tables",
        section="profile",
        options={"assignment": ASSIGNMENT["profile"]},
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
