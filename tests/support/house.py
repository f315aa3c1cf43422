"""The package's imports, read without importing anything: which module imports which, from
which line, at module level or inside a function. The house tests hold them to the floors that
docs/architecture.md draws."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    source: Path      # the importing file
    line: int
    importer: str     # its module, cs336_systems.lm.model
    imported: str     # the package module it names (a submodule where the name is one)


def module_name(path: Path, src_root: Path) -> str:
    parts = list(path.relative_to(src_root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, src_root: Path) -> bool:
    base = src_root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def package_imports(package_dir: Path) -> list[Import]:
    """Every import of a module of the package by a module of it (module level and inside
    functions, absolute and relative)."""
    src_root, package = package_dir.parent, package_dir.name
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        module = module_name(path, src_root)
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = (module if is_package else module.rpartition(".")[0]).split(".")
                    prefix = ".".join(parts[:len(parts) - node.level + 1])
                    base = f"{prefix}.{base}" if base else prefix
                targets = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}", src_root)
                           else base for a in node.names]
            else:
                continue
            for target in targets:
                if target == package or target.startswith(package + "."):
                    found.append(Import(path, node.lineno, module, target))
    return found


def room(module: str) -> str:
    """The room of a module: the first folder or file under the package
    (cs336_systems.lm.model -> lm); the package's own __init__ is the room `cs336_systems`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def floors_from(architecture: str) -> list[set[str]]:
    """The floors drawn in docs/architecture.md's line 'Floors, from the ground up: a, b | c |
    d': the rooms of each floor, the ground first."""
    found = re.search(r"^Floors, from the ground up: (.+)$", architecture, re.M)
    if found is None:
        raise ValueError("docs/architecture.md draws no floors ('Floors, from the ground up: ...')")
    text = found.group(1).replace("`", "").rstrip(".")
    return [{name.strip() for name in floor.split(",")} for floor in text.split("|")]


def upward(imports: list[Import], floors: list[set[str]], face: str) -> list[str]:
    """Each import of a room from a higher floor, or of a room drawn on no floor, named with its
    file and line. The package's face (its __init__, which only hands names on) stands above
    every floor."""
    level = {name: i for i, floor in enumerate(floors) for name in floor}
    problems = []
    for imp in imports:
        a, b = room(imp.importer), room(imp.imported)
        if a == b or a == face:
            continue
        for name in (a, b):
            if name not in level:
                problems.append(f"{imp.source}:{imp.line}: room {name!r} is on no floor")
        if a in level and b in level and level[a] < level[b]:
            problems.append(f"{imp.source}:{imp.line}: {imp.importer} imports {imp.imported}, "
                            f"but {a} (floor {level[a] + 1}) stands below {b} "
                            f"(floor {level[b] + 1})")
    return sorted(set(problems))


def circles(imports: list[Import]) -> list[list[str]]:
    """The modules that import each other in a loop (strongly connected components of more than
    one module, or a module importing itself), each sorted."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.importer, set()).add(imp.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack, on_stack, found = [], set(), []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def entry_points(package_dir: Path) -> set[str]:
    """The package's command lines: modules with an `if __name__ == "__main__":` block."""
    src_root = package_dir.parent
    return {module_name(path, src_root) for path in package_dir.rglob("*.py")
            if re.search(r'^if __name__ == "__main__":', path.read_text(), re.MULTILINE)}


def imports_of_entry_points(imports: list[Import], entries: set[str]) -> list[str]:
    """Each import of a command line by another module, as 'file:line: a imports b (a CLI)'."""
    return sorted({f"{i.source}:{i.line}: {i.importer} imports {i.imported} (a CLI)"
                   for i in imports if i.imported in entries and i.importer != i.imported})


def functions_and_classes(path: Path) -> set[str]:
    """The names of the functions and classes a module defines at its top level."""
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def function_lengths(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function and method the module defines."""
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
