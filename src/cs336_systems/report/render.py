"""Filling the writeup templates: number formatting, links, `$placeholder` substitution."""

from __future__ import annotations

import math
import os
from pathlib import Path
from string import Template

TEMPLATES = Path(__file__).parent / "templates"


def fmt(value, digits: int = 2) -> str:
    """A number with `digits` decimals; '' for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.{digits}f}"


def fmt_ratio(value: float) -> str:
    """A factor: '2.9x'."""
    if value is None or math.isnan(value):
        return ""
    if value < 0.1:
        return f"{value:.2g}x"
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x" if value < 100 else f"{value:.0f}x"


def relative_link(target: str | Path, from_file: str | Path) -> str:
    """Path of `target` relative to the folder of `from_file` (for markdown links)."""
    return os.path.relpath(Path(target), Path(from_file).parent)


def render_template(name: str, **fields) -> str:
    """Substitute `fields` into templates/<name>; a missing field is an error, not a blank."""
    return Template((TEMPLATES / name).read_text()).substitute(fields)


def bullets(sentences) -> str:
    """A markdown list of the non-empty sentences."""
    return "\n".join(f"- {s}" for s in sentences if s)
