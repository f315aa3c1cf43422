"""A section's whole text as tests read it: its part of the writeup and its companion page."""

from __future__ import annotations

from pathlib import Path

from cs336_systems.report.render import render
from cs336_systems.sections import Section


def section_text(name: str, facts: dict, link_base: str | Path = ".") -> str:
    """The section's template and details template rendered from `facts`, one after the other:
    what a reader finds of it in the writeup and one link away."""
    section = Section(name)
    return (render(section.template, facts, link_base=link_base) + "\n\n"
            + render(section.details, facts, link_base=link_base))
