# The writeup: each section's facts rendered through its template, then the header, the
# coverage table and the sections in the order of cs336_systems.sections.SECTIONS.
# Editing a section's template redoes that section's markdown and the writeup, nothing else.



rule section_markdown:
    input:
        facts=facts("{section}"),
        template=section_file("{section}", "template.md.j2"),
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


rule writeup:
    input:
        sections=expand(f"{SECTION_DIR}/{{section}}.md", section=SECTIONS),
        facts=[facts(section) for section in SECTIONS],
        template=f"{PACKAGE}/report/templates/writeup.md.j2",
        code=sources("cs336_systems.report.writeup"),
    output:
        report("report/writeup.md", caption=caption("writeup"), category="Writeup"),
    log:
        f"{LOGS}/writeup.log",
    params:
        job="writeup",
        preset=PRESET,
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
