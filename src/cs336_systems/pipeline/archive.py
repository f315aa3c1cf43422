"""One tarball of a preset's results, for grading: records, tables, figures, sections, logs, the
writeup, the resolved config and a manifest of the environment.

    results/<preset>.tar.gz
        results/<preset>/...        everything but heavy artifacts (traces, snapshots), unless
                                    asked for (config `archive_heavy: true`)
        report/writeup.md
        config.resolved.yaml        the preset as the run used it
        manifest.json               packages and versions, GPU and driver, git commit and
                                    whether the tree was dirty, Python, platform, time

Unpacked into a checkout, the records re-render into the same tables and writeup without
measuring anything (README.md, "Grading").
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import platform
import shutil
import subprocess
import tarfile
from importlib import metadata
from pathlib import Path

import yaml

from cs336_systems.pipeline.records import DamagedRecord, check_records, git_commit

HEAVY_SUFFIXES = (".trace.json.gz", ".nsys-rep", ".pickle.gz", ".snapshot.gz",
                  ".memory_viz.html")


def gpus() -> list[dict]:
    """Name, driver and memory of each GPU that `nvidia-smi` lists; [] where there is none."""
    if not shutil.which("nvidia-smi"):
        return []
    query = "name,driver_version,memory.total"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout
    return [dict(zip(query.split(","), (f.strip() for f in line.split(","))))
            for line in out.splitlines() if line.strip()]


def manifest(preset: str) -> dict:
    commit = git_commit()
    return {
        "preset": preset,
        "git_commit": commit.removesuffix("-dirty"),
        "git_dirty": commit.endswith("-dirty"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gpus": gpus(),
        "packages": {d.metadata["Name"]: d.version for d in sorted(
            metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower())
            if d.metadata["Name"]},
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(_dt.datetime.now().timestamp())
    tar.addfile(info, io.BytesIO(data))


def write_archive(results_dir: str | Path, writeup: str | Path, output: str | Path,
                  preset: str, preset_config: dict, heavy: bool = False) -> list[str]:
    """Write the tarball; returns the names it holds."""
    results_dir, output = Path(results_dir), Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for path in sorted(p for p in results_dir.rglob("*") if p.is_file()):
            if heavy or not path.name.endswith(HEAVY_SUFFIXES):
                tar.add(path, arcname=path.as_posix())
        tar.add(writeup, arcname=Path(writeup).as_posix())
        _add_text(tar, "config.resolved.yaml",
                  yaml.safe_dump({"preset": preset, **preset_config}, sort_keys=False))
        _add_text(tar, "manifest.json", json.dumps(manifest(preset), indent=1) + "\n")
        names = tar.getnames()
    tmp.replace(output)
    return names


def rerender(archive: str | Path, workdir: str | Path = ".", cores: int = 1) -> None:
    """Unpack `archive` into `workdir` (a checkout of this project) and re-render its tables,
    sections and writeup from its records with Snakemake, allowing no rule that measures.

    Files are unpacked with the present time as their modification time, so the records count
    as newer than the checkout's sources; the report rules are forced to run again.
    """
    import os
    import sys
    import time

    from cs336_systems.sections import SECTIONS

    workdir = Path(workdir)
    with tarfile.open(archive) as tar:
        preset = yaml.safe_load(tar.extractfile("config.resolved.yaml").read())["preset"]
        members = [m for m in tar.getmembers()
                   if m.name not in ("config.resolved.yaml", "manifest.json")]
        tar.extractall(workdir, members=members, **_safe_extraction())
    now = time.time()
    for member in members:
        os.utime(workdir / member.name, (now, now))
    check_records(workdir / "results" / preset)  # a damaged record: which, and what to do
    tables = [f"{section}_tables" for section in SECTIONS]
    subprocess.run([sys.executable, "-m", "snakemake", "report/writeup.md", "--cores", str(cores),
                    "--config", f"preset={preset}", "--allowed-rules", *tables,
                    "section_markdown", "writeup", "--forcerun", *tables],
                   cwd=workdir, check=True)


def _safe_extraction() -> dict:
    """tarfile's `data` filter (no absolute paths, links out of the tree, devices) where the
    Python has it."""
    return {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Re-render an archive's tables and writeup "
                                     "from its records, measuring nothing.")
    parser.add_argument("command", choices=["rerender"])
    parser.add_argument("archive", help="a tarball written by `snakemake archive`")
    parser.add_argument("--cores", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        rerender(args.archive, cores=args.cores)
    except DamagedRecord as damaged:
        parser.exit(2, f"{damaged}\n")


if __name__ == "__main__":
    main()
