"""The house as docs/architecture.md draws it: each room (a folder or file under the package)
imports only rooms on its own floor or below, and no modules import each other in a loop. The
imports are read from the source, at module level and inside functions."""

from pathlib import Path

from support.checkout import ROOT
from support.house import (
    circles,
    entry_points,
    floors_from,
    function_lengths,
    functions_and_classes,
    imports_of_entry_points,
    package_imports,
    upward,
)

PACKAGE = ROOT / "src" / "cs336_systems"
FLOORS = floors_from((ROOT / "docs" / "architecture.md").read_text())


def test_no_room_imports_one_above_it():
    problems = upward(package_imports(PACKAGE), FLOORS, face="cs336_systems")
    assert not problems, "imports that run back up:\n" + "\n".join(problems)


def test_no_modules_import_each_other_in_a_loop():
    assert circles(package_imports(PACKAGE)) == []


def test_no_module_imports_a_sections_command_line():
    """A section's CLI parses its arguments and calls a measuring module; what two jobs share
    lives in the measuring modules, never in another job's CLI."""
    clis = {m for m in entry_points(PACKAGE) if m.startswith("cs336_systems.sections.")}
    problems = imports_of_entry_points(package_imports(PACKAGE), clis)
    assert not problems, "\n".join(problems)


def test_every_room_of_the_package_is_on_a_floor():
    rooms = {p.stem for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").is_file())
             or (p.suffix == ".py" and p.name != "__init__.py")}
    drawn = set().union(*FLOORS)
    assert rooms == drawn, (sorted(rooms - drawn), sorted(drawn - rooms))


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_an_upward_import_or_a_loop_is_found_and_named(tmp_path):
    package = _package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from pkg.high import b\n",     # inside a function too
        "high/__init__.py": "",
        "high/b.py": "from pkg.low import a\nfrom . import c\n",
        "high/c.py": "from pkg.high.b import x\n",
    })
    imports = package_imports(package)
    floors = [{"low"}, {"high"}]
    assert upward(imports, floors, face="pkg") == [
        f"{package / 'low' / 'a.py'}:2: pkg.low.a imports pkg.high.b, but low (floor 1) "
        f"stands below high (floor 2)"]
    assert circles(imports) == [["pkg.high.b", "pkg.high.c", "pkg.low.a"]]
    assert upward(imports, [{"low"}], face="pkg")[0].endswith("room 'high' is on no floor")
    assert imports_of_entry_points(imports, {"pkg.high.c"}) == [
        f"{package / 'high' / 'b.py'}:2: pkg.high.b imports pkg.high.c (a CLI)"]


def test_a_sections_command_line_defines_only_main():
    """A section CLI parses its arguments and calls its measuring module: `main` is its one
    function (constants such as the module name torchrun restarts may stand beside it)."""
    clis = [m for m in entry_points(PACKAGE) if m.startswith("cs336_systems.sections.")]
    problems = {m: defined for m in clis
                if (defined := functions_and_classes(ROOT / "src" / (m.replace(".", "/") + ".py"))
                    - {"main"})}
    assert not problems, problems


MOST_LINES = 500       # a module's, but a kernel's (one kernel and its launches read as one)
MOST_FUNCTION_LINES = 80


def test_no_module_is_longer_than_it_can_be_read_whole():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if p.parent.name != "kernels" and (n := len(p.read_text().splitlines())) > MOST_LINES}
    assert not long, f"modules over {MOST_LINES} lines (split them by idea): {long}"


def test_no_function_is_longer_than_a_screen():
    long = {f"{path.relative_to(PACKAGE)}:{line} {name}": n
            for path in PACKAGE.rglob("*.py")
            for name, line, n in function_lengths(path) if n > MOST_FUNCTION_LINES}
    assert not long, f"functions over {MOST_FUNCTION_LINES} lines: {long}"
