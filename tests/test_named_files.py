"""Every repository path and package module that the code's docstrings and comments, the rules,
the README and docs/ name exists: a name of a file that moved or never was is a defect a reader
trips over. Paths are read as `folder/file.ext` (with a folder); a path is found relative to the
repository, src/, workflow/, the package, any room of the package or the naming file's own
folder. Paths of generated files (results/, report/, a section's details/ page) and patterns
(<name>, *) are not files of the repository and are left out."""

import re
from pathlib import Path

import pytest

from support.checkout import ROOT

PACKAGE = ROOT / "src" / "cs336_systems"
NAMING = sorted(
    [p for p in (ROOT / "src").rglob("*")
     if p.suffix in (".py", ".j2", ".yaml", ".rst") and "egg-info" not in p.as_posix()]
    + [p for p in (ROOT / "workflow").rglob("*") if p.is_file()]
    + [p for p in (ROOT / "scripts").rglob("*") if p.suffix in (".py", ".sh")]
    + [ROOT / "Snakefile", ROOT / "README.md", ROOT / "config.yaml", ROOT / "pyproject.toml"]
    + sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "profiles").rglob("*.yaml")))
PATH = re.compile(r"(?<![\w./<>{*$-])((?:[\w.-]+/)+[\w.-]+\.(?:py|smk|j2|yaml|md|rst|sh|json|toml))"
                  r"(?![\w/])")
MODULE = re.compile(r"(?<![\w./])cs336_systems((?:\.\w+)+)")
# generated files, and files outside the repository (another project's, or ../shared/ beside
# a checkout, which a clone lacks)
GENERATED = ("results/", "report/", "details/", "torch/", "http", "triton/", "../")
BASES = [ROOT, ROOT / "src", ROOT / "workflow", PACKAGE,
         *[p for p in PACKAGE.iterdir() if p.is_dir()]]


def _path_exists(name: str, naming: Path) -> bool:
    return any((base / name).exists() for base in [*BASES, naming.parent])


def _module_defines(parts: list[str]) -> bool:
    """The longest prefix of `parts` (under cs336_systems) that is a module, and the next part
    (if any) a name written in it: a module, or a module's attribute."""
    for i in range(len(parts), -1, -1):
        base = PACKAGE.joinpath(*parts[:i])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else \
            base / "__init__.py" if (base / "__init__.py").is_file() else None
        if source is not None:
            return i == len(parts) or re.search(rf"\b{parts[i]}\b", source.read_text()) is not None
    return False


def _named(path: Path):
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        for found in PATH.finditer(line):
            yield number, "path", found.group(1)
        for found in MODULE.finditer(line):
            yield number, "module", "cs336_systems" + found.group(1)


def test_every_named_path_and_module_exists():
    missing = []
    for path in NAMING:
        for number, kind, name in _named(path):
            if kind == "path" and (name.startswith(GENERATED) or not _path_exists(name, path)):
                if not name.startswith(GENERATED):
                    missing.append(f"{path.relative_to(ROOT)}:{number}: no file {name}")
            elif kind == "module" and not _module_defines(name.split(".")[1:]):
                missing.append(f"{path.relative_to(ROOT)}:{number}: no module or name {name}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize(("text", "found"), [
    ("see `sections/flash/targets.py`, rules/common.smk and cs336_systems.lm.adamw.AdamW", []),
    ("cs336_systems.ATTENTION_IMPLEMENTATIONS, $probe/summarize.py", []),
    ("see experiments/flash_speed.py", ["no file experiments/flash_speed.py"]),
    ("cs336_systems.lm.optimizer.Nope", ["no module or name cs336_systems.lm.optimizer.Nope"]),
    ("cs336_systems.nowhere.at_all", ["no module or name cs336_systems.nowhere.at_all"]),
    ("results/<preset>/x.json, templates/<s>.md.j2, ../shared/ASSIGNMENT.md", []),
])
def test_a_name_that_is_not_there_is_reported(tmp_path, text, found):
    naming = tmp_path / "note.py"
    naming.write_text(text + "\n")
    messages = []
    for _, kind, name in _named(naming):
        if kind == "path" and not name.startswith(GENERATED) and not _path_exists(name, naming):
            messages.append(f"no file {name}")
        elif kind == "module" and not _module_defines(name.split(".")[1:]):
            messages.append(f"no module or name {name}")
    assert messages == found
