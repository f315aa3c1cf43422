# `snakemake --cores 1 archive`: the preset's results, the writeup, the resolved config and an
# environment manifest in one tarball, results/<preset>.tar.gz (cs336_systems.pipeline.archive).
# Heavy artifacts (traces, snapshots) go in with `--config archive_heavy=true`.


rule archive:
    input:
        writeup="report/writeup.md",
        facts=[facts(section) for section in SECTIONS],
        code=sources("cs336_systems.pipeline.archive"),
    output:
        f"results/{PRESET}.tar.gz",
    log:
        f"{LOGS}/archive.log",
    params:
        job="archive",
        preset=PRESET,
        preset_config=P,
        results_dir=lambda wildcards, input: str(Path(input.facts[0]).parent.parent),
        heavy=config.get("archive_heavy", False),
        records=planned_records(),  # refused if any is missing; listed in the manifest
    conda:
        SOFTWARE
    script:
        JOB_SCRIPT
