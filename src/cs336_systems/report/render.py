"""Rendering facts through a section's Jinja2 template: numbers formatted, links made relative.

Templates (`templates/<section>.md.j2`) hold the prose; they see the section's facts as
variables and these filters:

    {{ x|num(1) }}     12.3 (a number with 1 decimal; '' for a missing one)
    {{ r|ratio }}      2.9x
    {{ f|pct(1) }}     12.3 (a fraction as a percentage, without the % sign)
    {{ x|sig(3) }}     0.000134, 1.34e-07 (3 significant digits, for errors of any size)
    {{ path|link }}    the path relative to the writeup's folder, for images and links
    {{ t|long_table }} a `tables.long_table`: the table, or over 25 rows a line linking its
                       CSV and the summary (the template's text before it says what it shows)

An undefined variable is an error, not a blank: a template cannot silently lose a fact.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import jinja2

from cs336_systems.records import write_text_atomic
from cs336_systems.report.facts import read_facts

TEMPLATES = Path(__file__).parent / "templates"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt(value, digits: int = 2) -> str:
    """A number with `digits` decimals; '' for a missing value."""
    return "" if _missing(value) else f"{value:.{digits}f}"


def fmt_ratio(value) -> str:
    """A factor: '2.9x'."""
    if _missing(value):
        return ""
    if value < 0.1:
        return f"{value:.2g}x"
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x" if value < 100 else f"{value:.0f}x"


def fmt_pct(value, digits: int = 1) -> str:
    return "" if _missing(value) else f"{100 * value:.{digits}f}"


def fmt_sig(value, digits: int = 3) -> str:
    """`digits` significant digits: '0.000134', '1.34e-07', '65504'."""
    return "" if _missing(value) else f"{value:.{digits}g}"


def relative_link(target: str | Path, base_dir: str | Path) -> str:
    """Path of `target` relative to the folder `base_dir` (for markdown links)."""
    return Path(os.path.relpath(Path(target), Path(base_dir))).as_posix()


def long_table(table: dict, link_base: str | Path) -> str:
    if table["whole"]:
        return table["markdown"]
    note = (f"_The whole table has {table['rows']} rows; its data are in "
            f"[{Path(table['csv']).name}]({relative_link(table['csv'], link_base)})._")
    return f"{note}\n\n{table['markdown']}" if table["markdown"] else note


def environment(link_base: str | Path = ".") -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True,
                             autoescape=False)
    env.filters.update(num=fmt, ratio=fmt_ratio, pct=fmt_pct, sig=fmt_sig,
                       link=lambda path: relative_link(path, link_base),
                       long_table=lambda table: long_table(table, link_base))
    return env


def render(template: str | Path, facts: dict, link_base: str | Path = ".") -> str:
    """`template` (a path, or a name under templates/) filled with `facts`."""
    path = Path(template)
    env = environment(link_base)
    if path.is_file():
        env.loader = jinja2.FileSystemLoader(str(path.parent))
        return env.get_template(path.name).render(**facts)
    return env.get_template(str(template)).render(**facts)


def render_section(facts_path: str | Path, template: str | Path, output: str | Path,
                   link_base: str | Path) -> None:
    """A section's markdown: its facts through its template, links relative to `link_base`."""
    write_text_atomic(output, render(template, read_facts(facts_path), link_base).strip() + "\n")
