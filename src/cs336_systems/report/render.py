"""Rendering facts through a section's Jinja2 templates: numbers formatted, links made relative.

A section's templates (`sections/<s>/template.md.j2`, its part of the writeup, and
`details.md.j2`, its companion page) hold the prose; they see the section's facts as variables
and these filters:

    {{ x|num(1) }}     12.3 (a number with 1 decimal; '' for a missing one)
    {{ r|ratio }}      2.9x
    {{ f|pct(1) }}     12.3 (a fraction as a percentage, without the % sign)
    {{ x|sig(3) }}     0.000134, 1.34e-07 (3 significant digits, for errors of any size)
    {{ path|link }}    the path relative to the writeup's folder, for images and links
    {{ t|long_table }} a `tables.long_table`: the table, or over 25 rows a line linking its
                       CSV and the summary (the template's text before it says what it shows)
    {{ s|size }}       a model size by the 2026 handout's name (`lm.sizes.SIZE_LABELS`)
    {{ n|count("warm-up step") }}  "1 warm-up step", "5 warm-up steps"

An undefined variable is an error, not a blank: a template cannot silently lose a fact.
"""

from __future__ import annotations

import math
import os
import re
import textwrap
from pathlib import Path

import jinja2

from cs336_systems.lm.sizes import size_label
from cs336_systems.records import write_text_atomic
from cs336_systems.report.facts import read_facts

TEMPLATES = Path(__file__).parent / "templates"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt(value, digits: int = 2) -> str:
    """A number with `digits` decimals; '' for a missing value."""
    return "" if _missing(value) else f"{value:.{digits}f}"


def fmt_ratio(value, beside=None) -> str:
    """A factor: '2.9x'. Beside a bound it is held to (`beside`), as many more digits as tell
    the two apart: 0.7524 against 0.75 is '0.752x', not a '0.75x' that misses 0.75x."""
    if _missing(value):
        return ""
    if value < 0.1:
        return f"{value:.2g}x"
    if not _missing(beside) and value != beside and 0.1 <= value < 10:
        digits = 2
        while digits < 4 and f"{value:.{digits}f}" == f"{beside:.{digits}f}":
            digits += 1
        return f"{value:.{digits}f}x"
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x" if value < 100 else f"{value:.0f}x"


def fmt_pct(value, digits: int = 1) -> str:
    return "" if _missing(value) else f"{100 * value:.{digits}f}"


def fmt_sig(value, digits: int = 3) -> str:
    """`digits` significant digits: '0.000134', '1.34e-07', '65504'."""
    return "" if _missing(value) else f"{value:.{digits}g}"


def counted(n, noun: str) -> str:
    """`n` and `noun`, plural unless `n` is 1: '1 warm-up step', '5 warm-up steps'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


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
                       long_table=lambda table: long_table(table, link_base),
                       size=size_label, count=counted)
    return env


def _template(template: str | Path, link_base: str | Path) -> jinja2.Template:
    path = Path(template)
    env = environment(link_base)
    if path.is_file():
        env.loader = jinja2.FileSystemLoader(str(path.parent))
        return env.get_template(path.name)
    return env.get_template(str(template))


# A range whose ends print alike ('1.30x–1.30x', '1.30x to 1.30x' of factors): one value.
_ONE_VALUE_RANGE = re.compile(r"(?<![\w.])(\d[\d.,]*(?:x|%)?)–\1(?![\w.])"
                              r"|(?<![\w.])(\d[\d.,]*x)\s+to\s+\2(?![\w.])")


def one_value_ranges(text: str) -> str:
    """`text` with every range of its prose whose two ends print the same written as that one
    value; a table keeps its columns' form ('[min–max]' in every row)."""
    out, prose = [], []
    for line in [*text.split("\n"), None]:  # None: the end, which flushes the last prose
        if line is not None and not line.lstrip().startswith("|"):
            prose.append(line)
            continue
        if prose:
            out.append(_ONE_VALUE_RANGE.sub(lambda m: m.group(1) or m.group(2), "\n".join(prose)))
            prose = []
        if line is not None:
            out.append(line)
    return "\n".join(out)


def render(template: str | Path, facts: dict, link_base: str | Path = ".") -> str:
    """`template` (a path, or a name under templates/) filled with `facts`."""
    return one_value_ranges(_template(template, link_base).render(**facts))


def glance(template: str | Path, facts: dict, problem: str, link_base: str | Path = ".") -> str:
    """The one-line answer to `problem` that a section's template gives through its
    `glance(problem)` macro, from `facts`; '' where it gives none."""
    module = _template(template, link_base).make_module(vars=facts)
    if not hasattr(module, "glance"):
        raise ValueError(f"{template} defines no glance(problem) macro: the writeup's first "
                         f"table takes each problem's one-line answer from it")
    return one_value_ranges(" ".join(str(module.glance(problem)).split()))


# Prose is rewrapped to this width: a template's lines break where its source does, which
# leaves short lines wherever a fact is shorter than the expression that renders it.
WIDTH = 100
# Lines that are not prose: tables, headings, fences, anchors, images, quotes.
_VERBATIM = ("|", "#", "```", "<a ", "<", "![", ">")


def reflow(text: str, width: int = WIDTH) -> str:
    """Markdown with each paragraph and list item rewrapped to `width` columns; tables, code
    blocks, headings, anchors and images kept as they are (markdown renders both alike)."""
    out, block, fenced = [], [], False

    def flush():
        if block:
            first = block[0]
            indent = len(first) - len(first.lstrip())
            bullet = re.match(r"(\s*(?:[-*]|\d+\.) )", first)
            lead = bullet.group(1) if bullet else " " * indent
            hang = " " * len(lead)
            words = " ".join(line.strip() for line in block)[len(lead.strip()):].strip() \
                if bullet else " ".join(line.strip() for line in block)
            out.extend(textwrap.wrap(words, width, initial_indent=lead, subsequent_indent=hang,
                                     break_long_words=False, break_on_hyphens=False) or [""])
            block.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            fenced = not fenced
            out.append(line)
        elif fenced or not stripped or stripped.startswith(_VERBATIM):
            flush()
            out.append(line)
        elif re.match(r"\s*(?:[-*]|\d+\.) ", line):
            flush()
            block.append(line)
        else:
            block.append(line)
    flush()
    return "\n".join(out)


def render_section(facts_path: str | Path, template: str | Path, output: str | Path,
                   link_base: str | Path) -> None:
    """A section's markdown: its facts through its template, links relative to `link_base`."""
    text = render(template, read_facts(facts_path), link_base).strip()
    write_text_atomic(output, reflow(re.sub(r"\n{3,}", "\n\n", text)) + "\n")


def _outward_anchors(text: str, target: str) -> str:
    """`](#x)` links to anchors this page does not hold, pointed at `target` (the writeup)."""
    own = set(re.findall(r'<a id="([^"]+)"></a>', text))
    return re.sub(r"\]\(#([^)\s]+)\)",
                  lambda m: m.group(0) if m.group(1) in own else f"]({target}#{m.group(1)})",
                  text)


def render_details(facts_path: str | Path, template: str | Path, output: str | Path,
                   link_base: str | Path, writeup: str | Path) -> None:
    """A section's companion page: its details template, under a line linking back to the
    writeup, with links to the writeup's anchors made to reach it from this page's folder."""
    name = Path(facts_path).stem
    back = relative_link(writeup, link_base)
    body = reflow(re.sub(r"\n{3,}", "\n\n", _outward_anchors(
        render(template, read_facts(facts_path), link_base).strip(), back)))
    write_text_atomic(output, f"# `{name}`: method, every configuration, and what goes beyond "
                              f"the answers\n\n_A companion page of [the writeup]({back}): "
                              f"everything here is rendered from the same facts._\n\n"
                              f"{body}\n")
