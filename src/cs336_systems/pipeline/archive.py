"""One tarball of a preset's results, for grading, and re-rendering one that somebody sent you.

    results/<preset>.tar.gz
        results/<preset>/...        records, tables, figures, section facts and markdown, job
                                    logs; heavy artifacts (traces, snapshots) only when asked
                                    for (config `archive_heavy: true`)
        report/writeup.md           (and report/details/*.md, where the writeup has them)
        config.resolved.yaml        the preset as the run used it
        manifest.json               packages and versions, GPUs and driver, the git commit and
                                    whether the tree was dirty, Python, platform, time, and the
                                    records the writeup was made from

`write_archive` refuses a preset whose planned records are not all there.

`rerender ARCHIVE [--into FOLDER]` re-renders an archive's tables, sections and writeup from its
records, measuring nothing. An archive is untrusted input, so nothing in it runs: it is read
whole and every member checked before anything is written (only regular files and folders,
relative names without `..`, and only the files an archive of this project holds, ALLOWED);
the files are unpacked into a new folder (by default beside the archive) that is not this
checkout, whatever the Python's tarfile filters; its records are checked against their
schemas; and Snakemake renders in that folder with this checkout's Snakefile, code and config,
allowing only the rules that make tables, sections and the writeup, so everything the archive
holds besides its records and logs is made again. A bad archive or member is one line naming
the problem, exit status 2, and nothing written.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath

import yaml

from cs336_systems.paths import SECTIONS
from cs336_systems.records import DamagedRecord, git_commit

HEAVY_SUFFIXES = (".trace.json.gz", ".nsys-rep", ".pickle.gz", ".snapshot.gz",
                  ".memory_viz.html")
CONFIG_MEMBER = "config.resolved.yaml"
MANIFEST_MEMBER = "manifest.json"
WRITEUP_MEMBER = "report/writeup.md"
# What an archive of this project holds, by pattern (`{preset}` is the archive's preset): every
# other member is refused.
ALLOWED = (
    CONFIG_MEMBER, MANIFEST_MEMBER, WRITEUP_MEMBER, "report/details/*.md",
    "results/{preset}/**/*.json", "results/{preset}/**/*.csv", "results/{preset}/**/*.png",
    "results/{preset}/**/*.md", "results/{preset}/**/*.log", "results/{preset}/**/*.json.gz",
    *(f"results/{{preset}}/**/*{suffix}" for suffix in HEAVY_SUFFIXES),
)
PRESET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
MAX_UNPACKED_GIB = 64  # an archive that would unpack to more is refused (heavy ones are ~GBs)
CHECKOUT = Path(__file__).resolve().parents[3]


class MissingRecords(ValueError):
    """A preset whose planned records are not all there: which, and how to measure them."""


class BadArchive(ValueError):
    """An archive `rerender` will not open: the message names the member or the problem."""


# --- writing --------------------------------------------------------------------------------

def gpus() -> list[dict]:
    """Name, driver and memory of each GPU that `nvidia-smi` lists; [] where there is none."""
    if not shutil.which("nvidia-smi"):
        return []
    query = "name,driver_version,memory.total"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout
    return [dict(zip(query.split(","), (f.strip() for f in line.split(","))))
            for line in out.splitlines() if line.strip()]


def manifest(preset: str, records: list[str] = ()) -> dict:
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
        "records": sorted(records),
    }


def _add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(_dt.datetime.now().timestamp())
    tar.addfile(info, io.BytesIO(data))


def write_archive(results_dir: str | Path, writeup: str | Path, output: str | Path,
                  preset: str, preset_config: dict, heavy: bool = False,
                  records: list[str] = ()) -> list[str]:
    """Write the tarball; returns the names it holds. `records` are the records the writeup is
    made from (every tables rule's): one that is missing refuses the archive."""
    if missing := [r for r in records if not Path(r).is_file()]:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more"
                                          if len(missing) > 5 else "")
        raise MissingRecords(
            f"{len(missing)} record(s) of the {preset} preset are missing: {shown}. Measure "
            f"them again with `snakemake --cores 1 report/writeup.md --config preset={preset}`, "
            f"then archive.")
    results_dir, output, writeup = Path(results_dir), Path(output), Path(writeup)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    details = writeup.parent / "details"
    with tarfile.open(tmp, "w:gz") as tar:
        for path in sorted(p for p in results_dir.rglob("*") if p.is_file()):
            if heavy or not path.name.endswith(HEAVY_SUFFIXES):
                tar.add(path, arcname=path.as_posix())
        tar.add(writeup, arcname=writeup.as_posix())
        for page in sorted(details.glob("*.md")) if details.is_dir() else []:
            tar.add(page, arcname=page.as_posix())
        _add_text(tar, CONFIG_MEMBER,
                  yaml.safe_dump({"preset": preset, **preset_config}, sort_keys=False))
        _add_text(tar, MANIFEST_MEMBER,
                  json.dumps(manifest(preset, list(records)), indent=1) + "\n")
        names = tar.getnames()
    tmp.replace(output)
    return names


# --- reading an archive that may be hostile ---------------------------------------------------

@dataclass
class Contents:
    """What `open_archive` found: the preset, the members to unpack, and the archive's own
    writeup (to compare with the one rendered again)."""

    preset: str
    members: list[tarfile.TarInfo]
    manifest: dict
    writeup: str


def _member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a member is not a plain file or folder at a relative path inside, or None."""
    name = member.name
    if not (member.isreg() or member.isdir()):
        kind = ("a symbolic link" if member.issym() else "a hard link" if member.islnk() else
                "a FIFO" if member.isfifo() else "a device" if member.isdev() else
                "not a regular file")
        return f"member {name!r} is {kind}; an archive of this project holds only files"
    if not name or "\0" in name or "\\" in name:
        return f"member {name!r} has a name this project never writes"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return f"member {name!r} has an absolute path; members are relative to the archive"
    parts = PurePosixPath(name.removeprefix("./")).parts
    if ".." in parts:
        return f"member {name!r} climbs out of the folder with '..'"
    return None


def _normalized(name: str) -> str:
    return PurePosixPath(name.removeprefix("./")).as_posix()


def _allowed(name: str, preset: str) -> bool:
    path = PurePosixPath(name)
    for pattern in ALLOWED:
        pattern = pattern.format(preset=preset)
        if "**" in pattern:  # any depth below the prefix, the suffix matching
            prefix, suffix = pattern.split("/**/")
            if name.startswith(prefix + "/") and path.match(suffix):
                return True
        elif path.match(pattern) and len(path.parts) == len(PurePosixPath(pattern).parts):
            return True
    return False


def _text(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str) -> str:
    if name not in members or not members[name].isreg():
        raise BadArchive(f"the archive has no {name}; an archive written by `snakemake "
                         f"archive` always does (is it one?)")
    try:
        return tar.extractfile(members[name]).read().decode()
    except UnicodeDecodeError:
        raise BadArchive(f"{name} in the archive is not text") from None


def open_archive(archive: str | Path, presets: list[str] | None = None) -> Contents:
    """Read `archive` whole and check every member (see the module docstring); raises
    `BadArchive` before anything is written."""
    archive = Path(archive)
    if not archive.is_file():
        raise BadArchive(f"{archive}: no such file")
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()  # reads the whole archive: a truncated one fails here
            problems = [p for m in members if (p := _member_problem(m))]
            if problems:
                raise BadArchive(problems[0])
            by_name: dict[str, tarfile.TarInfo] = {}
            for member in members:
                name = _normalized(member.name)
                if name in by_name and not member.isdir():
                    raise BadArchive(f"member {name!r} appears twice")
                by_name[name] = member
            config_text = _text(tar, by_name, CONFIG_MEMBER)
            manifest_text = _text(tar, by_name, MANIFEST_MEMBER)
            writeup = _text(tar, by_name, WRITEUP_MEMBER)
    except (tarfile.TarError, EOFError, OSError) as error:
        why = str(error).splitlines()[0].rstrip(":") or type(error).__name__
        raise BadArchive(f"{archive}: not a readable tarball ({why})") from None
    try:
        config = yaml.safe_load(config_text)
        manifest_data = json.loads(manifest_text)
    except (yaml.YAMLError, json.JSONDecodeError) as error:
        raise BadArchive(f"{CONFIG_MEMBER} or {MANIFEST_MEMBER} cannot be parsed "
                         f"({type(error).__name__})") from None
    if not isinstance(config, dict) or not isinstance(manifest_data, dict):
        raise BadArchive(f"{CONFIG_MEMBER} and {MANIFEST_MEMBER} hold mappings")
    preset = config.get("preset")
    if not isinstance(preset, str) or not PRESET_NAME.fullmatch(preset):
        raise BadArchive(f"{CONFIG_MEMBER} names no usable preset ({preset!r})")
    if presets is not None and preset not in presets:
        raise BadArchive(f"the archive's preset {preset!r} is not a preset of this checkout's "
                         f"config.yaml ({', '.join(presets)})")
    files = [m for m in members if m.isreg()]
    for member in files:
        if not _allowed(_normalized(member.name), preset):
            raise BadArchive(f"member {member.name!r} is not a file an archive of this project "
                             f"holds (its {preset} results, the writeup, the config and the "
                             f"manifest)")
    if sum(m.size for m in files) > MAX_UNPACKED_GIB * 2**30:
        raise BadArchive(f"the archive would unpack to more than {MAX_UNPACKED_GIB} GiB")
    listed = manifest_data.get("records", [])
    names = {_normalized(m.name) for m in files}
    if not isinstance(listed, list) or not all(isinstance(r, str) for r in listed):
        raise BadArchive(f"{MANIFEST_MEMBER}'s `records` is not a list of paths")
    if missing := [r for r in listed if r not in names]:
        raise BadArchive(f"the archive lacks {len(missing)} of the records its manifest lists "
                         f"(the first: {missing[0]}); it cannot render what was archived")
    return Contents(preset, files, manifest_data, writeup)


def _check_folder(folder: Path, checkout: Path) -> None:
    """Refuse a folder that is (or holds) the checkout, lies in it outside results/, or is not
    empty."""
    folder, checkout = folder.resolve(), checkout.resolve()
    if folder == checkout or checkout.is_relative_to(folder):
        raise BadArchive(f"{folder} is (or holds) this checkout; rerender writes into a folder "
                         f"of its own")
    if folder.is_relative_to(checkout) and not folder.is_relative_to(checkout / "results"):
        raise BadArchive(f"{folder} lies inside this checkout (outside its results/); choose "
                         f"a folder elsewhere")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise BadArchive(f"{folder} exists and is not an empty folder; rerender writes into a "
                         f"new one")


def default_folder(archive: Path) -> Path:
    """A new folder beside the archive: <name>.rerendered, or <name>.rerendered-2, ..."""
    stem = archive.name.removesuffix(".gz").removesuffix(".tgz").removesuffix(".tar")
    candidate = archive.parent / f"{stem}.rerendered"
    n = 2
    while candidate.exists():
        candidate = archive.parent / f"{stem}.rerendered-{n}"
        n += 1
    return candidate


def unpack(archive: str | Path, contents: Contents, folder: Path) -> None:
    """Write the checked members into `folder` (new or empty), every file created anew (never
    through a link), with the present time as its modification time so that the records count
    as newer than the checkout's sources."""
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    with tarfile.open(archive, "r:*") as tar:
        for member in contents.members:
            target = folder.joinpath(*PurePosixPath(_normalized(member.name)).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            new_file = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(target, new_file, 0o644)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(tar.extractfile(member), out)
            os.utime(target, (now, now))


def rerender(archive: str | Path, into: str | Path | None = None, cores: int = 1,
             checkout: Path = CHECKOUT) -> tuple[Path, bool]:
    """Check and unpack `archive` into `into` (by default a new folder beside it) and render
    its tables, sections and writeup there with this checkout's code: the writeup's path, and
    whether it is the archived writeup to the byte."""
    from cs336_systems.records import record_paths
    from cs336_systems.report.record_schemas import check_record_files

    archive = Path(archive)
    config = yaml.safe_load((checkout / "config.yaml").read_text())
    contents = open_archive(archive, presets=list(config.get("presets", {})))
    folder = Path(into) if into is not None else default_folder(archive.resolve())
    _check_folder(folder, checkout)
    unpack(archive, contents, folder)
    folder = folder.resolve()
    results = folder / "results" / contents.preset
    check_record_files(record_paths(results))  # a damaged record: which, and what to do
    tables = [f"{section}_tables" for section in SECTIONS]
    command = [sys.executable, "-m", "snakemake", "report/writeup.md",
               "--snakefile", str(checkout / "Snakefile"), "--directory", str(folder),
               "--configfile", str(checkout / "config.yaml"),
               "--workflow-profile", str(checkout / "profiles" / "default"),
               "--cores", str(cores), "--config", f"preset={contents.preset}",
               "--allowed-rules", *tables, "section_markdown", "section_details", "writeup",
               "--forcerun", *tables]
    run = subprocess.run(command, cwd=folder, check=False)
    if run.returncode != 0:
        raise SystemExit(f"rendering {archive} in {folder} failed (Snakemake's messages are "
                         f"above); nothing in the archive ran")
    writeup = folder / WRITEUP_MEMBER
    return writeup, writeup.read_text() == contents.writeup


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m cs336_systems.pipeline.archive",
        description="Re-render an archive's tables, sections and writeup from its records with "
                    "this checkout's code, measuring nothing. Nothing in the archive runs: only "
                    "the files an archive of this project holds are unpacked, into a new folder "
                    "(not this checkout), and everything but the records and logs is made "
                    "again. Prints where the writeup went.")
    parser.add_argument("command", choices=["rerender"])
    parser.add_argument("archive", help="a tarball written by `snakemake archive`")
    parser.add_argument("--into", metavar="FOLDER",
                        help="where to unpack and render: a new or empty folder outside this "
                             "checkout (or under its results/); default: ARCHIVE's name with "
                             ".rerendered, beside it")
    parser.add_argument("--cores", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        writeup, same = rerender(args.archive, into=args.into, cores=args.cores)
    except (BadArchive, DamagedRecord) as problem:
        parser.exit(2, f"{parser.prog}: {problem}\n")
    print(f"writeup: {writeup} ({'the same as' if same else 'differs from'} the archived one)")


if __name__ == "__main__":
    main()
