# The writeup: each section's facts rendered through its template (the graded answers, in
# results/<preset>/sections/) and its details template (its companion page, report/details/),
# then the results at a glance, the sections in the order of cs336_systems.sections.SECTIONS
# and the provenance. Editing a section's template redoes that section's markdown and the
# writeup, nothing else.


rule section_markdown:
    input:
        facts=facts("{section}"),
        template=section_file("{section}", "template.md.j2"),
        partials=section_partials,
        code=sources("cs336_systems.report.render"),
    output:
        f"{SECTION_DIR}/{{section}}.md",
    log:
        f"{LOGS}/sections/{{section}}.log",
    wildcard_constraints:
        section=one_of(SECTIONS),
    params:
        job="section_markdown",
        link_base="report",  # sections are parts of report/writeup.md: links start there
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule section_details:
    input:
        facts=facts("{section}"),
        template=section_file("{section}", "details.md.j2"),
        partials=section_partials,
        code=sources("cs336_systems.report.render"),
    output:
        report("report/details/{section}.md", caption=caption("details"), category="Details"),
    log:
        f"{LOGS}/details/{{section}}.log",
    wildcard_constraints:
        section=one_of(SECTIONS),
    params:
        job="section_details",
        writeup="report/writeup.md",  # where the answers' anchors are
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT


rule writeup:
    input:
        sections=expand(f"{SECTION_DIR}/{{section}}.md", section=SECTIONS),
        facts=[facts(section) for section in SECTIONS],
        section_templates=[section_file(section, "template.md.j2") for section in SECTIONS],
        details=expand("report/details/{section}.md", section=SECTIONS),
        template=f"{PACKAGE}/report/templates/writeup.md.j2",
        run_template=f"{PACKAGE}/report/templates/run.md.j2",
        code=sources("cs336_systems.report.writeup"),
    output:
        writeup=report("report/writeup.md", caption=caption("writeup"), category="Writeup"),
        run=report("report/details/run.md", caption=caption("run"), category="Details"),
    log:
        f"{LOGS}/writeup.log",
    params:
        job="writeup",
        preset=PRESET,
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
