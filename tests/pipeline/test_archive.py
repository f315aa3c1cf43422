"""Archives a grader can open safely: `rerender` unpacks only what an archive of this project
holds, into a folder of its own, and refuses anything else in one line before writing a byte;
`archive` refuses a preset whose records are not all there."""

import io
import json
import os
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from cs336_systems.pipeline import archive
from cs336_systems.pipeline.records import make_record
from support.checkout import ROOT

RECORD = "results/smoke/benchmark/tiny_ctx16_forward_fp32_warmup1.json"
CONFIG = {"size": "tiny", "context_length": 16, "mode": "forward", "precision": "fp32",
          "warmup_steps": 1, "measure_steps": 2, "batch_size": 2, "attention": "eager",
          "checkpoint_block_size": None, "optimizer": None, "compile": False, "seed": 0}
METRICS = {**{f"{p}_ms_{s}": 1.0 for p in ("forward", "step")
              for s in ("mean", "std", "min", "max", "median", "first")},
           "forward_ms_samples": [1.0], "step_ms_samples": [1.0],
           "model_flops_per_step": 10, "parameters": 5, "peak_gib": None}


def _bytes(payload) -> bytes:
    return payload if isinstance(payload, bytes) else (
        payload.encode() if isinstance(payload, str) else json.dumps(payload).encode())


def _good_members() -> dict[str, bytes]:
    record = make_record("benchmark", CONFIG, "ok", METRICS, env={"git": "abc"})
    return {"config.resolved.yaml": _bytes(yaml.safe_dump({"preset": "smoke"})),
            "manifest.json": _bytes({"preset": "smoke", "records": [RECORD]}),
            "report/writeup.md": _bytes("# writeup\n"),
            RECORD: _bytes(record),
            "results/smoke/tables/benchmark.csv": _bytes("a,b\n1,2\n")}


def _tarball(path: Path, members: dict[str, bytes], extra=()) -> Path:
    """A gzipped tarball of `members` (name -> bytes) plus `extra` TarInfo entries."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return path


def _link(name: str, target: str, kind=tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def _snapshot(folder: Path) -> dict[str, tuple[int, float]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime) for p in folder.rglob("*")
            if p.is_file()}


@pytest.fixture
def place(tmp_path):
    """A folder for the archive and a sentinel beside it that nothing may touch."""
    sentinel = tmp_path / "outside" / "x"
    sentinel.parent.mkdir()
    sentinel.write_text("untouched")
    old = time.time() - 3600
    os.utime(sentinel, (old, old))
    return tmp_path


def _refused(place: Path, tarball: Path, capsys, *args: str) -> str:
    """`rerender` on `tarball`: exit status 2, one line, no traceback, nothing written."""
    before = _snapshot(place)
    into = place / "rendered"
    with pytest.raises(SystemExit) as exit_:
        archive.main(["rerender", str(tarball), "--into", str(into), *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not into.exists()
    assert _snapshot(place) == before  # the sentinel and the archive as they were
    return err


@pytest.mark.parametrize("name", ["Snakefile", "src/cs336_systems/evil.py",
                                  ".git/hooks/pre-commit", "workflow/rules/evil.smk",
                                  "profiles/default/config.yaml", "config.yaml",
                                  "results/smoke/evil.py", "results/other/benchmark/x.json"])
def test_a_member_outside_what_an_archive_holds_is_refused(place, capsys, name):
    tarball = _tarball(place / "a.tar.gz", {**_good_members(), name: b"raise SystemExit(9)"})
    err = _refused(place, tarball, capsys)
    assert f"member {name!r} is not a file an archive of this project holds" in err


@pytest.mark.parametrize("name, why", [
    ("../escape.txt", "climbs out of the folder with '..'"),
    ("results/smoke/../../escape.txt", "climbs out of the folder with '..'"),
    ("/ABSOLUTE/x", "has an absolute path"),
])
def test_names_that_reach_outside_are_refused(place, capsys, monkeypatch, name, why):
    """Whatever the Python: tarfile's `data` filter (missing before 3.10.12) plays no part."""
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    name = name.replace("/ABSOLUTE", str(place / "outside"))
    tarball = _tarball(place / "a.tar.gz", {**_good_members(), name: b"x"})
    assert why in _refused(place, tarball, capsys)
    assert not (place / "escape.txt").exists() and not (place.parent / "escape.txt").exists()
    assert (place / "outside" / "x").read_text() == "untouched"


@pytest.mark.parametrize("info, kind", [
    (_link("results/smoke/benchmark/l.json", "/etc/passwd"), "a symbolic link"),
    (_link("results/smoke/benchmark/h.json", RECORD, tarfile.LNKTYPE), "a hard link"),
    (_link("results/smoke/benchmark/d.json", "", tarfile.CHRTYPE), "a device"),
    (_link("results/smoke/benchmark/f.json", "", tarfile.FIFOTYPE), "a FIFO"),
])
def test_links_and_devices_are_refused(place, capsys, info, kind):
    tarball = _tarball(place / "a.tar.gz", _good_members(), extra=[info])
    assert f"is {kind}; an archive of this project holds only files" in _refused(
        place, tarball, capsys)


@pytest.mark.parametrize("missing", ["manifest.json", "config.resolved.yaml",
                                     "report/writeup.md"])
def test_an_archive_without_its_own_files_is_refused(place, capsys, missing):
    members = _good_members()
    del members[missing]
    err = _refused(place, _tarball(place / "a.tar.gz", members), capsys)
    assert f"the archive has no {missing}" in err


def test_a_truncated_or_foreign_file_is_refused(place, capsys):
    whole = _tarball(place / "whole.tar.gz", _good_members()).read_bytes()
    truncated = place / "cut.tar.gz"
    truncated.write_bytes(whole[:len(whole) // 2])
    assert "not a readable tarball" in _refused(place, truncated, capsys)
    text = place / "notes.txt"
    text.write_text("not an archive at all\n")
    assert "not a readable tarball" in _refused(place, text, capsys)
    assert "no such file" in _refused(place, place / "nowhere.tar.gz", capsys)


def test_a_member_twice_or_a_bad_preset_or_manifest_is_refused(place, capsys):
    members = _good_members()
    with tarfile.open(place / "twice.tar.gz", "w:gz") as tar:
        for name in [*members, RECORD]:
            info = tarfile.TarInfo(name)
            info.size = len(members[name])
            tar.addfile(info, io.BytesIO(members[name]))
    assert "appears twice" in _refused(place, place / "twice.tar.gz", capsys)
    for preset, why in (("../x", "names no usable preset"),
                        ("nonesuch", "is not a preset of this checkout's config.yaml")):
        bad = {**members, "config.resolved.yaml": _bytes(yaml.safe_dump({"preset": preset}))}
        assert why in _refused(place, _tarball(place / "p.tar.gz", bad), capsys)
    lacking = {**members, "manifest.json": _bytes({"records": [RECORD, "results/smoke/y.json"]})}
    assert "lacks 1 of the records its manifest lists (the first: results/smoke/y.json)" in (
        _refused(place, _tarball(place / "m.tar.gz", lacking), capsys))


def test_a_damaged_record_is_refused_before_rendering(place, capsys):
    """The records are checked against their schemas once unpacked, before Snakemake runs."""
    record = json.loads(_good_members()[RECORD])
    del record["metrics"]["forward_ms_mean"]
    tarball = _tarball(place / "a.tar.gz", {**_good_members(), RECORD: _bytes(record)})
    into = place / "rendered"
    with pytest.raises(SystemExit) as exit_:
        archive.main(["rerender", str(tarball), "--into", str(into)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{RECORD}: metrics.forward_ms_mean is missing" in err and "Traceback" not in err


@pytest.mark.parametrize("folder", ["checkout", "checkout/src/x", "nonempty"])
def test_rerender_writes_only_into_a_new_folder_outside_the_checkout(place, capsys, folder):
    tarball = _tarball(place / "a.tar.gz", _good_members())
    (place / "nonempty").mkdir()
    (place / "nonempty" / "mine.txt").write_text("keep")
    into = {"checkout": ROOT, "checkout/src/x": ROOT / "src" / "x",
            "nonempty": place / "nonempty"}[folder]
    with pytest.raises(SystemExit) as exit_:
        archive.main(["rerender", str(tarball), "--into", str(into)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "this checkout" in err or "not an empty folder" in err
    assert not (ROOT / "src" / "x").exists()
    assert (place / "nonempty" / "mine.txt").read_text() == "keep"


def test_a_good_archive_unpacks_exactly_its_files_into_a_new_folder(place):
    tarball = _tarball(place / "quick.tar.gz", _good_members())
    contents = archive.open_archive(tarball, presets=["smoke"])
    assert contents.preset == "smoke" and contents.writeup == "# writeup\n"
    folder = archive.default_folder(tarball)
    assert folder == place / "quick.rerendered"
    archive.unpack(tarball, contents, folder)
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == sorted(_good_members())
    folder.mkdir(exist_ok=True)
    assert archive.default_folder(tarball) == place / "quick.rerendered-2"


def test_the_archive_refuses_a_preset_whose_records_are_not_all_there(tmp_path):
    results = tmp_path / "results" / "smoke"
    (results / "benchmark").mkdir(parents=True)
    present = results / "benchmark" / "a.json"
    present.write_text("{}")
    writeup = tmp_path / "writeup.md"
    writeup.write_text("w")
    with pytest.raises(archive.MissingRecords) as missing:
        archive.write_archive(results, writeup, tmp_path / "smoke.tar.gz", "smoke", {},
                              records=[str(present), str(results / "benchmark" / "b.json")])
    assert "1 record(s) of the smoke preset are missing: " in str(missing.value)
    assert "b.json" in str(missing.value)
    assert "snakemake --cores 1 report/writeup.md --config preset=smoke" in str(missing.value)
    assert not (tmp_path / "smoke.tar.gz").exists()
    names = archive.write_archive(results, writeup, tmp_path / "smoke.tar.gz", "smoke", {},
                                  records=[str(present)])
    with tarfile.open(tmp_path / "smoke.tar.gz") as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
    assert manifest["records"] == [str(present)] and "manifest.json" in names


def test_help_names_the_folder_and_what_is_trusted(capsys):
    with pytest.raises(SystemExit):
        archive.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Nothing in the archive runs" in out and ".rerendered" in out
    assert "Prints where the writeup went" in out
