"""Lazy re-exports for the package's `__init__` files (PEP 562), so that importing a subpackage
costs nothing it does not use: `import cs336_systems.pipeline.jobs` loads no torch, and
`cs336_systems.kernels.checks` no Triton kernels.

    EXPORTS = {"cs336_systems.lm.adamw": ("AdamW",), ...}  # module: the names it defines
    __getattr__, __dir__, __all__ = lazy_exports(__name__, EXPORTS)

`cs336_systems.pipeline.sources` reads the same `EXPORTS` literal to follow `from package import
name` to the module that defines `name`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping


def defining_modules(exports: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """name -> the module that defines it, from an `EXPORTS` table (module -> names)."""
    return {name: module for module, names in exports.items() for name in names}


def lazy_exports(package: str, exports: Mapping[str, Iterable[str]]
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """A module `__getattr__` that imports each exported name from its module on first use
    (and keeps it in the package's namespace), the `__dir__` that lists them, and `__all__`."""
    exports = defining_modules(exports)

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__, list(exports)
