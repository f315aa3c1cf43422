"""Section 2 gradient_checkpointing.

Nested strategies simulated and measured on real blocks; one level of recomputation at full size.

    time_checkpointing.py    CLI: one block size's peak and step time (rule checkpointing)
    recompute.py             what it measures
    nested_checkpointing.py  CLI: nested trees on real blocks (rule checkpointing_nested)
    nested.py                what it measures
    report.py                records -> tables, figures, facts
    template.md.j2           facts -> prose
"""
