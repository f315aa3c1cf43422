"""Which source files a module's results depend on: the rules' staleness inputs.

`module_sources("cs336_systems.sections.benchmark.time_step")` follows the module-level
imports of the package, transitively, without importing anything, and returns the files. A
Snakemake rule that lists them as inputs is redone when, and only when, code it runs changes.

`from package import name` follows the package's re-export of `name` (an import in its
`__init__.py`, or its lazy `EXPORTS` table) to the module that defines it, not the whole
`__init__.py`: counting every re-export would make every job depend on every module. An import
inside a function (a lazily loaded optional backend) is not followed either; a rule that needs
such a backend lists it itself.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from cs336_systems.lazy import defining_modules
from cs336_systems.paths import SRC_ROOT

PACKAGE = "cs336_systems"


def _module_file(module: str, src_root: Path) -> Path | None:
    base = src_root.joinpath(*module.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _package_exports(init_path: Path, package: str) -> dict[str, str]:
    """name -> defining module, for the re-exports of an __init__: its `from pkg.mod import
    name` statements and its lazy `EXPORTS = {module: names}` table (`cs336_systems.lazy`)."""
    exports = {}
    for node in ast.parse(init_path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            source = _resolve(node, package, is_package=True)
            for alias in node.names:
                exports[alias.asname or alias.name] = source
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "EXPORTS"):
            exports.update(defining_modules(ast.literal_eval(node.value)))
    return exports


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    package = module if is_package else module.rpartition(".")[0]
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _imported_modules(path: Path, module: str, src_root: Path) -> set[str]:
    """Package modules named by the module-level imports of `path`.

    `from pkg import name` resolves to the submodule `pkg.name` if there is one, else to the
    module the package's __init__ re-exports `name` from, else to the __init__ itself.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, module, is_package=path.name == "__init__.py")
            target_file = _module_file(target, src_root)
            if target_file is None or target_file.name != "__init__.py":
                found.add(target)
                continue
            exports = _package_exports(target_file, target)
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if _module_file(submodule, src_root) is not None:
                    found.add(submodule)
                else:
                    found.add(exports.get(alias.name, target))
    return {name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")}


@cache
def _closure(module: str, src_root: Path) -> frozenset[Path]:
    seen: set[str] = set()
    files: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name, src_root)
        if path is None:
            continue  # a name imported from a module, not a module itself
        files.add(path)
        todo.extend(_imported_modules(path, name, src_root))
    return frozenset(files)


def module_sources(*modules: str, src_root: Path = SRC_ROOT, relative_to: Path | None = None
                   ) -> list[str]:
    """Sorted source files of `modules` and everything they import from the package."""
    files: set[Path] = set()
    for module in modules:
        if _module_file(module, src_root) is None:
            raise ValueError(f"no module {module!r} under {src_root}")
        files |= _closure(module, src_root)
    if relative_to is not None:
        return sorted(str(p.relative_to(relative_to.resolve())) for p in files)
    return sorted(str(p) for p in files)
