"""Which source files a module's results depend on: the rules' staleness inputs.

`module_sources("cs336_systems.experiments.benchmark")` follows the module-level imports of the
package, transitively, without importing anything, and returns the files. A Snakemake rule
that lists them as inputs is redone when, and only when, code it runs changes.

Package `__init__.py` files are left out on purpose: they only re-export, and counting them
would make every job depend on every module. An import inside a function (a lazily loaded
optional backend) is not followed either; a rule that needs such a backend lists it itself.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = "cs336_systems"
SRC_ROOT = Path(__file__).resolve().parent.parent  # .../src


def _module_file(module: str, src_root: Path) -> Path | None:
    base = src_root.joinpath(*module.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _imported_modules(path: Path, module: str) -> set[str]:
    """Package modules named by the module-level imports of `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            # `from pkg import mod` imports a module when `mod` is one.
            found.update(f"{target}.{alias.name}" for alias in node.names)
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
        if path.name != "__init__.py" or name == module:
            files.add(path)
        todo.extend(_imported_modules(path, name))
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
